package dashboard

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// ---- a channel's page: recent messages and sends per minute ------------------------------

// messagePageSize is how many messages the channel page lists at a time.
const messagePageSize = 50

// upstreamError is an upstream error as the pages show it: its code, the upstream's title and
// the one-line explanation of a common code (explainError), "" for others.
type upstreamError struct {
	Code        int
	Title       string
	Explanation string
}

func newUpstreamError(code int, title string) *upstreamError {
	return &upstreamError{Code: code, Title: title, Explanation: explainError(code)}
}

// messageRow is one outgoing message in a channel's list.
type messageRow struct {
	WAMID          string
	To             string
	CreatedAt      time.Time
	Status         string
	Error          *upstreamError
	IdempotencyKey string
}

type messageFilter struct {
	Status string
	// Q is the search: an exact wamid, recipient or idempotency key.
	Q string
}

type channelData struct {
	Channel  managementapi.Channel
	Charts   sendCharts
	Messages []messageRow
	Filter   messageFilter
	Statuses []string
	NextURL  string
	// HealthHistory is the latest changes of the number's health, newest first (health.go).
	HealthHistory []healthChangeRow
	// RangeParam is the chart range asked for ("" for the default), kept by the filter form.
	RangeParam string
}

func (h *Handler) channel(w http.ResponseWriter, r *http.Request, s *session) {
	p := page{Session: s}
	cid, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		h.notFound(w, r, s)
		return
	}
	c, err := h.opt.API.GetChannel(r.Context(), h.principal(r, s), cid.String())
	if err != nil {
		h.readError(w, r, s, err)
		return
	}
	q := r.URL.Query()
	d := channelData{Channel: c, Statuses: store.MessageStatuses,
		Filter: messageFilter{Status: q.Get("status"), Q: formText(q.Get("q"))}}
	status := http.StatusOK
	rows, next, err := h.listMessages(r, s, cid, d.Filter, q.Get("cursor"))
	if e, ok := errors.AsType[*managementapi.Error](err); ok && e.Status == http.StatusUnprocessableEntity {
		// A filter (or cursor) the API refuses: say so, and list without it.
		p.Error, status = e.Message, e.Status
		d.Filter = messageFilter{}
		rows, next, err = h.listMessages(r, s, cid, d.Filter, "")
	}
	if e, ok := errors.AsType[*managementapi.Error](err); ok {
		h.apiError(w, r, s, e)
		return
	} else if err != nil {
		h.serverError(w, r, err)
		return
	}
	d.Messages = rows
	if next != "" {
		nq := url.Values{"cursor": {next}}
		if d.Filter.Status != "" {
			nq.Set("status", d.Filter.Status)
		}
		if d.Filter.Q != "" {
			nq.Set("q", d.Filter.Q)
		}
		if v := q.Get("range"); v != "" {
			nq.Set("range", parseRange(v).Name)
		}
		d.NextURL = h.opt.BasePath + "/channels/" + cid.String() + "?" + nq.Encode()
	}
	now, cr := time.Now().UTC(), parseRange(q.Get("range"))
	minutes, err := h.opt.API.SendsPerBucket(r.Context(), h.principal(r, s), cid.String(), cr.since(now), cr.Bucket)
	if err != nil {
		h.readError(w, r, s, err)
		return
	}
	d.Charts = renderSendCharts(now, cr, minutes)
	d.Charts.Ranges = rangeLinks(r, h.opt.BasePath+"/channels/"+cid.String(), cr)
	if q.Get("range") != "" {
		d.RangeParam = cr.Name
	}
	if d.HealthHistory, err = h.healthHistory(r, s, cid); err != nil {
		h.readError(w, r, s, err)
		return
	}
	p.Title, p.Nav, p.Data = "Channel "+c.Name, "channels", d
	h.render(w, r, status, "channel", p)
}

// apiError renders the page of an operation's refusal or failure: a 404 as the dashboard's
// not-found page, others with the API's status and message.
func (h *Handler) apiError(w http.ResponseWriter, r *http.Request, s *session, e *managementapi.Error) {
	switch {
	case e.Status == http.StatusNotFound:
		h.notFound(w, r, s)
	case e.Status >= 500:
		w.Header().Set("Retry-After", "5")
		h.render(w, r, e.Status, "error", page{Title: "Unavailable", Session: s, Error: e.Message})
	default:
		h.render(w, r, e.Status, "error", page{Title: "Refused", Session: s, Error: e.Message})
	}
}

// ---- a message's page: its timeline ------------------------------------------------------

// step is one step of a message's timeline.
type step struct {
	// Kind is the step's badge: "relay" for the relay call, else the upstream status.
	Kind  string
	Label string
	At    time.Time
	// Since is the time since the previous step ("" for the first).
	Since  string
	Detail string
	Error  *upstreamError
}

// deliveryRow is one delivery of the message's events to a webhook.
type deliveryRow struct {
	WebhookID   string
	WebhookName string
	EventID     string
	Type        string
	Status      string
	Attempts    int
	// Carried is the message status a message_status event carried (sent, delivered, read,
	// failed), "" for other events.
	Carried string
}

type messageData struct {
	WAMID       string
	ChannelID   string
	ChannelName string
	Direction   string
	To, From    string
	Status      string
	Error       *upstreamError
	// IdempotencyKey is the relay call's ("" when none or no relay call).
	IdempotencyKey string
	Steps          []step
	// Total is the time from the first step to the last ("" with fewer than two).
	Total      string
	Deliveries []deliveryRow
	Window     *windowView // the customer's window (dashboard/window.go); nil when unknown to the page
}

func (h *Handler) message(w http.ResponseWriter, r *http.Request, s *session) {
	pr := h.principal(r, s)
	d, err := h.getMessage(r, pr, r.PathValue("wamid"))
	if err != nil {
		h.readError(w, r, s, err)
		return
	}
	if cid, err := uuid.Parse(d.ChannelID); err == nil {
		c, err := h.opt.API.GetChannel(r.Context(), pr, cid.String())
		if e, ok := errors.AsType[*managementapi.Error](err); ok && e.Status == http.StatusNotFound {
			err = nil // a deleted channel keeps its messages
		}
		if err != nil {
			h.readError(w, r, s, err)
			return
		}
		d.ChannelName = c.Name
		d.Window = h.customerWindow(r, pr, &d)
	}
	if len(d.Deliveries) > 0 {
		hooks, err := h.opt.API.ListWebhooks(r.Context(), pr)
		if err != nil {
			h.serverError(w, r, err)
			return
		}
		names := map[string]string{}
		for _, wh := range hooks {
			names[wh.ID.String()] = wh.Name
		}
		for i := range d.Deliveries {
			d.Deliveries[i].WebhookName = names[d.Deliveries[i].WebhookID]
		}
	}
	h.render(w, r, http.StatusOK, "message", page{Session: s, Title: "Message", Nav: "channels", Data: d})
}

// timeSteps fills in each step's time since the previous one and returns the time from the
// first to the last ("" with fewer than two steps). Upstream timestamps have whole seconds, so
// a step may seem to come before the relay call that caused it: such a gap counts as none.
// A step of unknown time (a status without a timestamp the upstream sent) has none of these
// and is left out of the total.
func timeSteps(steps []step) string {
	var first, last time.Time
	timed := 0
	for i := range steps {
		at := steps[i].At
		if at.IsZero() {
			continue
		}
		if i > 0 && !steps[i-1].At.IsZero() {
			steps[i].Since = fmtDuration(at.Sub(steps[i-1].At))
		}
		if timed == 0 {
			first = at
		}
		last, timed = at, timed+1
	}
	if timed < 2 {
		return ""
	}
	return fmtDuration(last.Sub(first))
}

// fmtDuration writes a duration for people: "420 µs", "850 ms", "2.4 s", "3 min 5 s",
// "2 h 10 min", "3 d 4 h"; "<1 µs" for less than a microsecond but more than none, never "0 ms"
// for a time that was not nothing. A negative duration is written as none ("0 ms").
func fmtDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d == 0:
		return "0 ms"
	case d < time.Microsecond:
		return "<1 µs"
	case d < time.Millisecond:
		return fmt.Sprintf("%d µs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%d min %d s", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 24*time.Hour:
		return fmt.Sprintf("%d h %d min", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%d d %d h", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}

// fmtMS writes a latency counted in whole milliseconds (a delivery attempt's): "35 ms", and
// "<1 ms" for 0, which means under a millisecond, never none.
func fmtMS(ms int) string {
	if ms <= 0 {
		return "<1 ms"
	}
	return fmtDuration(time.Duration(ms) * time.Millisecond)
}

// lastAttempt is the latest of a delivery's attempts (the log is in time order), nil for none.
func lastAttempt(log []managementapi.Attempt) *managementapi.Attempt {
	if len(log) == 0 {
		return nil
	}
	return &log[len(log)-1]
}
