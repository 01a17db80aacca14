package dashboard

import (
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// listMessages returns a page of a channel's outgoing messages through the management API's
// Service (its checks and messages: a status it does not know is its 422), and the cursor of
// the next page ("" when none follows). The page load was charged already (Handler.allow).
//
// A refusal is a *managementapi.Error; other errors are failures.
func (h *Handler) listMessages(r *http.Request, s *session, channelID uuid.UUID, f messageFilter, cursor string) ([]messageRow, string, error) {
	list, next, err := h.opt.API.ListMessages(r.Context(), h.principal(r, s), channelID.String(),
		managementapi.MessageQuery{Limit: messagePageSize, Status: f.Status, Search: f.Q, Cursor: cursor})
	if err != nil {
		return nil, "", err
	}
	rows := make([]messageRow, len(list))
	for i, m := range list {
		rows[i] = messageRow{WAMID: m.WAMID, CreatedAt: time.Time(m.CreatedAt), Status: m.Status}
		if m.To != nil {
			rows[i].To = *m.To
		}
		if m.IdempotencyKey != nil {
			rows[i].IdempotencyKey = *m.IdempotencyKey
		}
		if m.Error != nil {
			rows[i].Error = newUpstreamError(m.Error.Code, m.Error.Title)
		}
	}
	return rows, next.Get("cursor"), nil
}

// getMessage returns a message's timeline as the message page shows it, read through the
// Service like the API's GET /messages/{wamid} (another org's message is not found), with the
// time an incoming message was received, which the API's form leaves out.
func (h *Handler) getMessage(r *http.Request, p managementapi.Principal, wamid string) (messageData, error) {
	t, err := h.opt.API.MessageTimeline(r.Context(), p, wamid)
	if err != nil {
		return messageData{}, err
	}
	d := messageData{WAMID: t.WAMID, ChannelID: t.ChannelID.String(), Direction: t.Direction, Status: t.Status}
	if t.To != nil {
		d.To = *t.To
	}
	if t.From != nil {
		d.From = *t.From
	}
	if t.Error != nil {
		d.Error = newUpstreamError(t.Error.Code, t.Error.Title)
	}
	if t.Direction == store.DirectionIncoming {
		d.Steps = append(d.Steps, step{Kind: "received", Label: "received", At: t.CreatedAt,
			Detail: "The upstream's webhook reached the relay and the message was stored."})
	}
	if c := t.Relay; c != nil {
		took := "<1 µs" // measured to the microsecond: 0 is less than one, not nothing
		if c.LatencyUS > 0 {
			took = fmtDuration(time.Duration(c.LatencyUS) * time.Microsecond)
		}
		detail := fmt.Sprintf("HTTP %d in %s", c.Status, took)
		if c.Replayed {
			detail += "; a retry of the call was replayed from the idempotency store"
		}
		d.Steps = append(d.Steps, step{Kind: "relay", Label: "relay call", At: c.At, Detail: detail})
		if c.IdempotencyKey != nil {
			d.IdempotencyKey = *c.IdempotencyKey
		}
	}
	carried := make(map[uuid.UUID]string, len(t.Statuses))
	for _, st := range t.Statuses {
		carried[st.EventID] = st.Status
		sp := step{Kind: st.Status, Label: st.Status, At: st.Timestamp}
		if st.Error != nil {
			sp.Error = newUpstreamError(st.Error.Code, st.Error.Title)
		}
		d.Steps = append(d.Steps, sp)
	}
	d.Total = timeSteps(d.Steps)
	for _, dl := range t.Deliveries {
		d.Deliveries = append(d.Deliveries, deliveryRow{WebhookID: dl.WebhookID.String(), EventID: dl.EventID.String(),
			Type: dl.Type, Status: dl.Status, Attempts: dl.Attempts, Carried: carried[dl.EventID]})
	}
	return d, nil
}
