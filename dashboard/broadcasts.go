package dashboard

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// Broadcasts (DESIGN §5c "Broadcasts"): a channel's broadcasts, a form making one from a CSV of
// recipients, and a broadcast's page — its progress and counts (refreshing itself while it
// sends), Pause / Resume / Cancel, and its failed recipients with their error explained. All
// through the API's Service (CreateBroadcast, ListBroadcasts, GetBroadcast, BroadcastRecipients,
// Pause/Resume/CancelBroadcast), so the checks and messages are the API's.

// maxUploadBytes caps the body of the new-broadcast form (its CSV): the API's own limit for
// POST /channels/:id/broadcasts, plus room for the form's other fields.
const maxUploadBytes = 16<<20 + 64<<10

// broadcastLiveSeconds is how often a running broadcast's page reloads its progress.
const broadcastLiveSeconds = 3

// failedPageSize is how many failed recipients the broadcast page lists at a time.
const failedPageSize = 50

// recipientsShown is how many of a broadcast's recipients its page lists, in list order (the
// API pages through all of them).
const recipientsShown = 20

// uploadPath reports the form posts that carry a file (the new-broadcast form), whose body may
// be up to maxUploadBytes; path is BasePath's rest without its outer slashes.
func uploadPath(method, path string) bool {
	segs := strings.Split(path, "/")
	return method == http.MethodPost && len(segs) == 3 && segs[0] == "channels" && segs[2] == "broadcasts"
}

// broadcastForm is the new-broadcast form's values (kept when the form is shown again; a file
// input cannot be refilled).
type broadcastForm struct {
	Name, Template, Language, Rate, StartAt string
}

type broadcastsData struct {
	Channel    managementapi.Channel
	Broadcasts []broadcastRow
	Form       broadcastForm
	// CanCreate: the channel is active (only an active channel sends).
	CanCreate bool
}

// broadcastRow is a broadcast in a channel's list.
type broadcastRow struct {
	managementapi.Broadcast
	Done int // recipients no longer queued
}

// settled is how many of a broadcast's recipients are no longer waiting to be sent.
func settled(c managementapi.BroadcastCounts) int { return c.Total - c.Queued }

// broadcasts serves a channel's broadcasts and the new-broadcast form.
func (h *Handler) broadcasts(w http.ResponseWriter, r *http.Request, s *session) {
	h.broadcastsPage(w, r, page{Session: s, Notice: notices[r.URL.Query().Get("done")]}, http.StatusOK,
		broadcastForm{Language: "en_US"})
}

func (h *Handler) broadcastsPage(w http.ResponseWriter, r *http.Request, p page, status int, f broadcastForm) {
	cid, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		h.notFound(w, r, p.Session)
		return
	}
	pr := h.principal(r, p.Session)
	c, err := h.opt.API.GetChannel(r.Context(), pr, cid.String())
	if err != nil {
		h.readError(w, r, p.Session, err)
		return
	}
	list, err := h.opt.API.ListBroadcasts(r.Context(), pr, cid.String())
	if err != nil {
		h.readError(w, r, p.Session, err)
		return
	}
	d := broadcastsData{Channel: c, Form: f, CanCreate: c.Status == store.ChannelActive}
	for _, b := range list {
		d.Broadcasts = append(d.Broadcasts, broadcastRow{Broadcast: b, Done: settled(b.Counts)})
	}
	p.Title, p.Nav, p.Data = "Broadcasts of "+c.Name, "channels", d
	h.render(w, r, status, "broadcasts", p)
}

// createBroadcast makes a broadcast from the form and its CSV of recipients, and shows its page.
func (h *Handler) createBroadcast(w http.ResponseWriter, r *http.Request, s *session) {
	f := broadcastForm{Language: "en_US"}
	if err := r.ParseMultipartForm(1 << 20); err != nil {
		msg, status := "The form could not be read. Reload the page and try again.", http.StatusBadRequest
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			msg, status = "The CSV file is too large: at most 16 MiB.", http.StatusRequestEntityTooLarge
		}
		h.broadcastsPage(w, r, page{Session: s, Error: msg}, status, f)
		return
	}
	defer func() { _ = r.MultipartForm.RemoveAll() }() // (temporary files of a large upload; nothing to tell the operator)
	f = broadcastForm{Name: r.PostFormValue("name"), Template: r.PostFormValue("template"), Language: r.PostFormValue("language"),
		Rate: strings.TrimSpace(r.PostFormValue("rate_per_minute")), StartAt: strings.TrimSpace(r.PostFormValue("start_at"))}
	fail := func(status int, msg string) {
		h.broadcastsPage(w, r, page{Session: s, Error: msg}, status, f)
	}
	in := managementapi.BroadcastInput{Name: formText(f.Name)}
	tmpl := map[string]any{"name": formText(strings.TrimSpace(f.Template)), "language": map[string]string{"code": formText(strings.TrimSpace(f.Language))}}
	in.Template, _ = json.Marshal(tmpl)
	if f.Rate != "" {
		n, err := strconv.Atoi(f.Rate)
		if err != nil {
			fail(http.StatusUnprocessableEntity, `"rate_per_minute" must be a whole number of messages per minute`)
			return
		}
		in.RatePerMinute = &n
	}
	if f.StartAt != "" {
		t, ok := parseFormTime(f.StartAt)
		if !ok {
			fail(http.StatusUnprocessableEntity, `"start_at" must be a time such as 2026-12-01T09:00 (UTC)`)
			return
		}
		v := t.UTC().Format(time.RFC3339)
		in.StartAt = &v
	}
	file, _, err := r.FormFile("recipients")
	if err != nil {
		fail(http.StatusUnprocessableEntity, "Choose a CSV file of recipients.")
		return
	}
	defer func() { _ = file.Close() }() // (read-only: nothing lost on an error)
	recipients, lines, err := parseRecipientsCSV(file)
	if err != nil {
		fail(http.StatusUnprocessableEntity, err.Error())
		return
	}
	in.Recipients = recipients
	var b managementapi.Broadcast
	cid := r.PathValue("id")
	if e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) (err error) {
		b, err = h.opt.API.CreateBroadcast(ctx, p, cid, in)
		return err
	}); e != nil {
		fail(e.Status, csvLineOf(e.Message, lines))
		return
	}
	h.redirect(w, r, "/broadcasts/"+b.ID.String(), "broadcast-created")
}

// csvHelp is how the CSV must look, said with each error about its shape.
const csvHelp = `The first line names the columns: "to" (the recipient's phone number), then var1, var2, … for the template's body variables, if it has any.`

// parseRecipientsCSV reads a CSV of recipients: a header line naming the columns, one of them
// "to", and var1, var2, … (in any order, none skipped) for the template's body variables; each
// later line is a recipient, whose vars become one body component with text parameters in
// order. lines[i] is the CSV line of recipient i. An error names the CSV line at fault.
func parseRecipientsCSV(rd io.Reader) (recipients []managementapi.RecipientInput, lines []int, err error) {
	cr := csv.NewReader(rd)
	cr.FieldsPerRecord = 0 // every line has as many fields as the header
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if err == io.EOF {
		return nil, nil, errors.New("The CSV file is empty. " + csvHelp)
	}
	if err != nil {
		return nil, nil, csvError(err)
	}
	toCol, vars := -1, map[int]int{} // var number → column
	for i, name := range header {
		name = strings.ToLower(strings.TrimSpace(strings.TrimPrefix(name, "\ufeff")))
		switch {
		case name == "to":
			if toCol >= 0 {
				return nil, nil, errors.New(`CSV line 1: the column "to" appears twice.`)
			}
			toCol = i
		case strings.HasPrefix(name, "var"):
			n, err := strconv.Atoi(name[3:])
			if err != nil || n < 1 || name[3] == '0' {
				return nil, nil, fmt.Errorf("CSV line 1: column %q is neither \"to\" nor var1, var2, …", header[i])
			}
			if _, dup := vars[n]; dup {
				return nil, nil, fmt.Errorf("CSV line 1: the column %q appears twice.", name)
			}
			vars[n] = i
		case name == "":
			return nil, nil, fmt.Errorf("CSV line 1: column %d has no name. %s", i+1, csvHelp)
		default:
			return nil, nil, fmt.Errorf("CSV line 1: column %q is neither \"to\" nor var1, var2, …", header[i])
		}
	}
	if toCol < 0 {
		return nil, nil, errors.New(`CSV line 1 has no column "to". ` + csvHelp)
	}
	for n := 1; n <= len(vars); n++ {
		if _, ok := vars[n]; !ok {
			return nil, nil, fmt.Errorf("CSV line 1: there are %d var columns but no var%d: number them var1 to var%d.", len(vars), n, len(vars))
		}
	}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, csvError(err)
		}
		line, _ := cr.FieldPos(0)
		to := strings.TrimSpace(rec[toCol])
		if to == "" {
			return nil, nil, fmt.Errorf(`CSV line %d: "to" is empty.`, line)
		}
		ri := managementapi.RecipientInput{To: formText(to)}
		if len(vars) > 0 {
			params := make([]map[string]string, len(vars))
			for n := 1; n <= len(vars); n++ {
				v := strings.TrimSpace(rec[vars[n]])
				if v == "" {
					return nil, nil, fmt.Errorf("CSV line %d: var%d is empty (a template variable needs a value).", line, n)
				}
				params[n-1] = map[string]string{"type": "text", "text": formText(v)}
			}
			ri.Components, _ = json.Marshal([]map[string]any{{"type": "body", "parameters": params}})
		}
		recipients = append(recipients, ri)
		lines = append(lines, line)
	}
	if len(recipients) == 0 {
		return nil, nil, errors.New("The CSV file lists no recipients: add one line per recipient after the header line.")
	}
	return recipients, lines, nil
}

// csvError words a CSV syntax error with its line.
func csvError(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		if errors.Is(pe.Err, csv.ErrFieldCount) {
			return fmt.Errorf("CSV line %d has a different number of fields than the header line.", pe.Line)
		}
		return fmt.Errorf("CSV line %d: %v.", pe.Line, pe.Err)
	}
	return fmt.Errorf("The CSV file could not be read: %v.", err)
}

// recipientIndexRe finds the recipient an API message is about: `"recipients[3].to" …`.
var recipientIndexRe = regexp.MustCompile(`"?recipients\[(\d+)\]([.\w]*)"?`)

// csvLineOf words an API message about recipients[i] with the CSV line that recipient came
// from, so the operator can find it in the file.
func csvLineOf(msg string, lines []int) string {
	m := recipientIndexRe.FindStringSubmatchIndex(msg)
	if m == nil {
		return msg
	}
	i, err := strconv.Atoi(msg[m[2]:m[3]])
	if err != nil || i < 0 || i >= len(lines) {
		return msg
	}
	return fmt.Sprintf("CSV line %d: %s", lines[i], msg)
}

// ---- a broadcast's page ----------------------------------------------------------------

type broadcastData struct {
	Broadcast   managementapi.Broadcast
	ChannelName string // "" when the channel was deleted
	Template    string // the template's name and language
	Done        int
	Percent     int
	Bar         template.HTML
	Segments    []barSegment
	Failed      []failedRow
	NextURL     string
	// Recipients are the first recipientsShown in list order, whatever their status: a
	// retried one shows its attempts.
	Recipients []recipientRow
	// MoreRecipients: the broadcast has more than Recipients.
	MoreRecipients bool
	// Live: the page reloads its progress every LiveSeconds (a running broadcast).
	Live        bool
	LiveSeconds int
	CanPause    bool
	CanResume   bool
	CanCancel   bool
}

// barSegment is one part of the progress bar, with its legend.
type barSegment struct {
	Class, Label string
	N            int
}

// recipientRow is a recipient and its status (the API's).
type recipientRow struct {
	failedRow
	Status string
}

// newFailedRow is the row of a recipient as the API gives it.
func newFailedRow(f managementapi.BroadcastRecipient) failedRow {
	row := failedRow{To: f.To, Attempts: f.Attempts}
	if f.WAMID != nil {
		row.WAMID = *f.WAMID
	}
	if f.Error != nil {
		row.Error = newUpstreamError(f.Error.Code, f.Error.Title)
	}
	return row
}

// failedRow is a failed recipient.
type failedRow struct {
	To       string
	WAMID    string
	Attempts int
	Error    *upstreamError
}

func (h *Handler) broadcast(w http.ResponseWriter, r *http.Request, s *session) {
	h.broadcastPage(w, r, page{Session: s, Notice: notices[r.URL.Query().Get("done")]}, http.StatusOK, r.PathValue("id"))
}

func (h *Handler) broadcastPage(w http.ResponseWriter, r *http.Request, p page, status int, id string) {
	bid, err := uuid.Parse(id)
	if err != nil {
		h.notFound(w, r, p.Session)
		return
	}
	pr := h.principal(r, p.Session)
	b, err := h.opt.API.GetBroadcast(r.Context(), pr, bid.String())
	if err != nil {
		h.readError(w, r, p.Session, err)
		return
	}
	d := broadcastData{Broadcast: b, Done: settled(b.Counts), LiveSeconds: broadcastLiveSeconds}
	if c, err := h.opt.API.GetChannel(r.Context(), pr, b.ChannelID.String()); err == nil {
		d.ChannelName = c.Name
	} else if e, ok := errors.AsType[*managementapi.Error](err); !ok || e.Status != http.StatusNotFound {
		h.readError(w, r, p.Session, err)
		return
	}
	var t struct {
		Name     string `json:"name"`
		Language struct {
			Code string `json:"code"`
		} `json:"language"`
	}
	if json.Unmarshal(b.Template, &t) == nil {
		d.Template = strings.TrimSpace(t.Name + " (" + t.Language.Code + ")")
	}
	if b.Counts.Total > 0 {
		d.Percent = d.Done * 100 / b.Counts.Total
	}
	d.Segments, d.Bar = progressBar(b)
	switch b.Status {
	case store.BroadcastScheduled, store.BroadcastSending:
		d.Live, d.CanPause, d.CanCancel = true, true, true
	case store.BroadcastPaused:
		d.CanResume, d.CanCancel = true, true
	}
	after := r.URL.Query().Get("after")
	failed, next, err := h.opt.API.BroadcastRecipients(r.Context(), pr, bid.String(), "failed", after, failedPageSize)
	if e, ok := errors.AsType[*managementapi.Error](err); ok && e.Status == http.StatusUnprocessableEntity && after != "" {
		failed, next, err = h.opt.API.BroadcastRecipients(r.Context(), pr, bid.String(), "failed", "", failedPageSize)
	}
	if err != nil {
		h.readError(w, r, p.Session, err)
		return
	}
	for _, f := range failed {
		d.Failed = append(d.Failed, newFailedRow(f))
	}
	if next != "" {
		d.NextURL = h.opt.BasePath + "/broadcasts/" + bid.String() + "?" + url.Values{"after": {next}}.Encode()
	}
	first, more, err := h.opt.API.BroadcastRecipients(r.Context(), pr, bid.String(), "", "", recipientsShown)
	if err != nil {
		h.readError(w, r, p.Session, err)
		return
	}
	for _, f := range first {
		d.Recipients = append(d.Recipients, recipientRow{newFailedRow(f), f.Status})
	}
	d.MoreRecipients = more != ""
	p.Title, p.Nav, p.Data = "Broadcast "+b.Name, "channels", d
	h.render(w, r, status, "broadcast", p)
}

// progressBar is b's recipients as one bar of segments (delivered or read, sent, accepted,
// failed, unknown, queued, and cancelled: the rest of the total), drawn as inline SVG — the
// page's CSP allows no inline style — with the segments for its legend.
func progressBar(b managementapi.Broadcast) ([]barSegment, template.HTML) {
	c := b.Counts
	segs := []barSegment{
		{"read", "read", c.Read},
		{"delivered", "delivered", c.Delivered},
		{"sent", "sent", c.Sent},
		{"accepted", "accepted", c.Accepted},
		{"failed", "failed", c.Failed},
		{"unknown", "unknown (outcome lost; never re-sent)", c.Unknown},
		{"queued", "queued", c.Queued},
	}
	sum := 0
	for _, s := range segs {
		sum += s.N
	}
	if rest := c.Total - sum; rest > 0 {
		segs = append(segs, barSegment{"cancelled", "cancelled", rest})
	}
	title := fmt.Sprintf("%d of %d recipients sent or settled", c.Total-c.Queued, c.Total)
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="progress-bar" role="img" aria-label="%s" width="100%%" height="20" viewBox="0 0 1000 20" preserveAspectRatio="none">`,
		template.HTMLEscapeString(title))
	fmt.Fprintf(&sb, `<rect class="track" x="0" y="0" width="1000" height="20"/>`)
	x := 0.0
	for _, s := range segs {
		if s.N == 0 || c.Total == 0 {
			continue
		}
		wd := float64(s.N) / float64(c.Total) * 1000
		fmt.Fprintf(&sb, `<rect class="seg %s" x="%.2f" y="0" width="%.2f" height="20"><title>%s: %d</title></rect>`,
			s.Class, x, wd, template.HTMLEscapeString(s.Label), s.N)
		x += wd
	}
	sb.WriteString(`</svg>`)
	var shown []barSegment
	for _, s := range segs {
		if s.N > 0 || s.Class == "queued" || s.Class == "failed" {
			shown = append(shown, s)
		}
	}
	return shown, template.HTML(sb.String())
}

// changeBroadcast pauses, resumes or cancels a broadcast (op) and shows its page again with
// notice; a refusal (409 "Broadcast is <status>") is shown on the page.
func (h *Handler) changeBroadcast(notice string, op func(*managementapi.Service, context.Context, managementapi.Principal, string) (managementapi.Broadcast, error)) signedIn {
	return func(w http.ResponseWriter, r *http.Request, s *session) {
		id := r.PathValue("id")
		if e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) error {
			_, err := op(h.opt.API, ctx, p, id)
			return err
		}); e != nil {
			if e.Status == http.StatusNotFound {
				h.apiError(w, r, s, e)
				return
			}
			h.broadcastPage(w, r, page{Session: s, Error: e.Message}, e.Status, id)
			return
		}
		h.redirect(w, r, "/broadcasts/"+url.PathEscape(id), notice)
	}
}
