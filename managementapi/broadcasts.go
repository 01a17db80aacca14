package managementapi

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/store"
)

// Broadcasts (DESIGN §5c "Broadcasts"): one template sent to many recipients, paced, each at
// most once. The API creates, lists, reads, pauses, resumes and cancels them and lists their
// recipients; package broadcast sends them. docs/broadcasts.md is the reference.

// Limits of a broadcast.
const (
	// MaxBroadcastRecipients is the most recipients one broadcast may have (after duplicates
	// are removed or before: a list longer than this is refused as given).
	MaxBroadcastRecipients = 100_000
	// MaxBroadcastStartAhead is how far ahead a broadcast's start_at may be.
	MaxBroadcastStartAhead = 30 * 24 * time.Hour
	// DefaultRelayLimitPerMinute is the relay's per-channel limit per minute when the
	// configuration gives none (Options.RelayLimitPerMinute nil or 0): the relay handler's
	// default of 100 calls in any minute (caddymodule's defaultRelayRequests/defaultRelayWindow).
	DefaultRelayLimitPerMinute = 100
	// maxBroadcastList is how many of a channel's broadcasts GET /channels/{id}/broadcasts
	// lists: the newest.
	maxBroadcastList = 100
	// maxTemplateDepth bounds the nesting of a template's and a recipient's components: real
	// ones are four or five levels deep, and a deeper document would only cost the database.
	maxTemplateDepth = 32
	// A recipient's number: this many digits, the ITU's E.164 range with the shortest numbers
	// in use.
	minPhoneDigits = 6
	maxPhoneDigits = 15
)

// Messages of the broadcasts' refusals.
const (
	MsgBroadcastNotFound = "Broadcast not found"
	// MsgChannelNotActive refuses a broadcast on a channel that is not active (or was deleted
	// while the request was made).
	MsgChannelNotActive = "Channel is not active"
	// MsgBroadcastState refuses an action the broadcast's status does not allow; formatted with
	// the status.
	MsgBroadcastState = "Broadcast is %s"

	MsgBroadcastRecipients = `"recipients" must have from 1 to 100000 items`
	MsgBroadcastRate       = `"rate_per_minute" must be between 1 and %d`
	MsgBroadcastStartAhead = `"start_at" must be at most 30 days ahead`
	// MsgRecipientPhone is formatted with the recipient's field ("recipients[3].to").
	MsgRecipientPhone = `"%s" must be a phone number: 6 to 15 digits, optionally with +, spaces, dashes and parentheses`
)

var (
	errRecipientsCount = unprocessable("%s", MsgBroadcastRecipients)
	errRecipientStatus = unprocessable(`"status" must be one of: %s`, strings.Join(recipientStatuses, ", "))
	errAfter           = unprocessable(`"after" is invalid`)
	// errRateType marks a rate_per_minute that is not an integer: it is answered with
	// MsgBroadcastRate and the channel's limit.
	errRateType = unprocessable(`"rate_per_minute" must be an integer`)
)

// recipientStatuses are the statuses a recipient shows (BroadcastRecipient.Status), in the
// order a send goes through them.
var recipientStatuses = []string{"queued", "sending", "accepted", "sent", "delivered", "read", "failed", "unknown", "cancelled"}

// BroadcastInput is the body of POST /channels/{id}/broadcasts as given; CreateBroadcast
// checks it.
type BroadcastInput struct {
	Name string `json:"name"`
	// Template is the template message's "template" object: {"name", "language": {"code"},
	// "components"?}.
	Template   json.RawMessage  `json:"template"`
	Recipients []RecipientInput `json:"recipients"`
	// StartAt is an RFC 3339 time; nil or "" means now.
	StartAt *string `json:"start_at"`
	// RatePerMinute is the pace; nil means half the channel's relay limit per minute.
	RatePerMinute *int `json:"rate_per_minute"`
}

// RecipientInput is one recipient as given: a phone number and, optionally, its own template
// components (the template's are used without them).
type RecipientInput struct {
	To         string          `json:"to"`
	Components json.RawMessage `json:"components,omitempty"`
}

// Broadcast is the JSON form of a broadcast.
type Broadcast struct {
	ID        uuid.UUID `json:"id"`
	ChannelID uuid.UUID `json:"channel_id"`
	Name      string    `json:"name"`
	// Status is scheduled, sending, paused, completed or cancelled.
	Status string `json:"status"`
	// PausedReason is "operator" or "upstream_disconnected" while paused, else nil.
	PausedReason  *string         `json:"paused_reason"`
	CreatedAt     time.Time       `json:"created_at"`
	StartAt       time.Time       `json:"start_at"`
	RatePerMinute int             `json:"rate_per_minute"`
	Template      json.RawMessage `json:"template"`
	Counts        BroadcastCounts `json:"counts"`
}

// MarshalJSON writes the broadcast with the API's timestamps (Time: UTC, milliseconds).
func (b Broadcast) MarshalJSON() ([]byte, error) {
	type plain Broadcast // without this method
	return json.Marshal(struct {
		plain
		CreatedAt Time `json:"created_at"`
		StartAt   Time `json:"start_at"`
	}{plain(b), Time(b.CreatedAt), Time(b.StartAt)})
}

// BroadcastCounts are a broadcast's recipients by where their send is (docs/broadcasts.md
// "Counts"): every recipient is in Total; a cancelled one in no other count.
type BroadcastCounts struct {
	Total     int `json:"total"`
	Queued    int `json:"queued"`
	Accepted  int `json:"accepted"`
	Sent      int `json:"sent"`
	Delivered int `json:"delivered"`
	Read      int `json:"read"`
	Failed    int `json:"failed"`
	Unknown   int `json:"unknown"`
}

// BroadcastRecipient is the JSON form of one recipient of a broadcast.
type BroadcastRecipient struct {
	// To is the number's digits.
	To string `json:"to"`
	// Status is one of recipientStatuses: the recipient's, or, once the upstream accepted its
	// send, its message's latest status.
	Status string `json:"status"`
	// WAMID is the message's id once accepted, else nil.
	WAMID *string `json:"wamid"`
	// Error is the upstream's error of a failed send or message, else nil.
	Error    *RecipientError `json:"error"`
	Attempts int             `json:"attempts"`
}

// RecipientError is the upstream's error of a recipient's send.
type RecipientError struct {
	Code  int    `json:"code"`
	Title string `json:"title"`
}

func newBroadcast(b store.Broadcast) Broadcast {
	out := Broadcast{ID: b.ID, ChannelID: b.ChannelID, Name: b.Name, Status: b.Status, CreatedAt: b.CreatedAt,
		StartAt: b.StartAt, RatePerMinute: b.RatePerMinute, Template: b.Template, Counts: BroadcastCounts(b.Counts)}
	if b.PausedReason != "" {
		reason := b.PausedReason
		out.PausedReason = &reason
	}
	return out
}

// relayLimitPerMinute is the relay's per-channel limit per minute (Options.RelayLimitPerMinute,
// else DefaultRelayLimitPerMinute).
func (s *Service) relayLimitPerMinute() int {
	if f := s.opt.RelayLimitPerMinute; f != nil {
		if n := f(); n > 0 {
			return n
		}
	}
	return DefaultRelayLimitPerMinute
}

// CreateBroadcast creates a broadcast on one of the org's channels from its input, checked in
// the order name, template (name, language.code, components), recipients (their number, then
// each one's to and components), rate_per_minute, start_at; the first problem is refused with
// 422 naming the field, before anything is read from the database. Recipients with the same
// number's digits are sent once: the first is kept, the others dropped and not counted. A
// start_at in the past means now. An unknown channel, or another org's, is 404; one that is not
// active 409 MsgChannelNotActive.
func (s *Service) CreateBroadcast(ctx context.Context, p Principal, channelID string, in BroadcastInput) (Broadcast, error) {
	return s.createBroadcast(ctx, p, channelID, in, nil)
}

// createBroadcast is CreateBroadcast with the problems reading a JSON body found in its fields
// (pending, by field: "name", "template", "recipients", "rate_per_minute", "start_at"), each
// reported in its field's turn. A recipients problem stands after the recipients that were read.
func (s *Service) createBroadcast(ctx context.Context, p Principal, channelID string, in BroadcastInput, pending map[string]*Error) (Broadcast, error) {
	cid, err := id(channelID, MsgChannelNotFound)
	if err != nil {
		return Broadcast{}, err
	}
	nb, e := s.parseBroadcast(in, pending, time.Now())
	if e != nil {
		return Broadcast{}, e
	}
	b, err := s.opt.Store.CreateBroadcast(ctx, p.Key.OrgID, cid, nb)
	if err != nil {
		return Broadcast{}, s.storeError(err)
	}
	return newBroadcast(b), nil
}

// parseBroadcast checks a broadcast's input (see CreateBroadcast) at now.
func (s *Service) parseBroadcast(in BroadcastInput, pending map[string]*Error, now time.Time) (store.NewBroadcast, *Error) {
	var nb store.NewBroadcast
	var e *Error
	if e = pending["name"]; e != nil {
		return nb, e
	}
	if nb.Name, e = requiredName(fields{"name": in.Name}); e != nil {
		return nb, e
	}
	if e = pending["template"]; e != nil {
		return nb, e
	}
	if nb.Template, e = parseTemplate(in.Template); e != nil {
		return nb, e
	}
	if nb.Recipients, e = parseRecipients(in.Recipients); e != nil {
		return nb, e
	}
	if e = pending["recipients"]; e != nil {
		return nb, e
	}
	if len(in.Recipients) == 0 {
		return nb, errRecipientsCount
	}
	limit := s.relayLimitPerMinute()
	switch r := in.RatePerMinute; {
	case pending["rate_per_minute"] != nil:
		return nb, unprocessable(MsgBroadcastRate, limit) // not an integer
	case r == nil:
		nb.RatePerMinute = max(1, limit/2) // callers keep the other half
	case *r < 1 || *r > limit:
		return nb, unprocessable(MsgBroadcastRate, limit)
	default:
		nb.RatePerMinute = *r
	}
	if e = pending["start_at"]; e != nil {
		return nb, e
	}
	nb.StartAt = now
	if in.StartAt != nil {
		t, ok, e := timestamp(fields{"start_at": *in.StartAt}, "start_at")
		switch {
		case e != nil:
			return nb, e
		case ok && t.Sub(now) > MaxBroadcastStartAhead:
			return nb, unprocessable("%s", MsgBroadcastStartAhead)
		case ok && t.After(now):
			nb.StartAt = t
		}
	}
	return nb, nil
}

// parseTemplate checks a template object and returns it re-encoded (see canonicalJSON).
func parseTemplate(raw json.RawMessage) (json.RawMessage, *Error) {
	if isNull(raw) {
		return nil, unprocessable(`"template" is required`)
	}
	v, e := canonicalJSON(raw, "template")
	if e != nil {
		return nil, e
	}
	t, ok := v.(map[string]any)
	if !ok {
		return nil, unprocessable(`"template" must be an object`)
	}
	if e := requiredString(t, "name", "template.name"); e != nil {
		return nil, e
	}
	switch lang := t["language"].(type) {
	case nil:
		return nil, unprocessable(`"template.language.code" is required`)
	case map[string]any:
		if e := requiredString(lang, "code", "template.language.code"); e != nil {
			return nil, e
		}
	default:
		return nil, unprocessable(`"template.language" must be an object`)
	}
	if c, ok := t["components"]; ok && c != nil {
		if _, ok := c.([]any); !ok {
			return nil, unprocessable(`"template.components" must be an array`)
		}
	}
	out, err := json.Marshal(t)
	if err != nil {
		return nil, unprocessable(`"template" must be an object`) // not reached: it was just decoded
	}
	return out, nil
}

// requiredString checks that key of m is a string with more than white space in it (field is
// its name in the messages).
func requiredString(m map[string]any, key, field string) *Error {
	switch v := m[key].(type) {
	case nil:
		return unprocessable(`"%s" is required`, field)
	case string:
		if strings.TrimSpace(v) == "" {
			return unprocessable(`"%s" is required`, field)
		}
		return nil
	default:
		return unprocessable(`"%s" must be a string`, field)
	}
}

// canonicalJSON decodes a JSON document that is stored as jsonb and checked on the way: valid
// UTF-8 without NUL characters in any string (Postgres's jsonb refuses "\u0000", which
// encoding/json accepts), numbers a float64 can hold (jsonb refuses some beyond), at most
// maxTemplateDepth levels deep. Numbers stay as written (json.Number). Re-encoded with
// json.Marshal, the document is then valid for jsonb whatever its escapes were (a lone
// surrogate "\ud800" is refused by jsonb: decoded, it is U+FFFD). field names it in the messages.
func canonicalJSON(raw json.RawMessage, field string) (any, *Error) {
	if !utf8.Valid(raw) {
		return nil, errNotText(field)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, unprocessable(`"%s" must be valid JSON`, field) // not reached from a body: it was read as JSON
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, unprocessable(`"%s" must be valid JSON`, field) // trailing data (a typed input's)
	}
	var check func(v any, depth int) *Error
	check = func(v any, depth int) *Error {
		if depth > maxTemplateDepth {
			return unprocessable(`"%s" must be nested at most %d levels deep`, field, maxTemplateDepth)
		}
		switch v := v.(type) {
		case string:
			if strings.IndexByte(v, 0) >= 0 {
				return errNotText(field)
			}
		case json.Number:
			if f, err := v.Float64(); err != nil || math.IsInf(f, 0) {
				return unprocessable(`"%s" holds a number out of range`, field)
			}
		case []any:
			for _, x := range v {
				if e := check(x, depth+1); e != nil {
					return e
				}
			}
		case map[string]any:
			for k, x := range v {
				if strings.IndexByte(k, 0) >= 0 {
					return errNotText(field)
				}
				if e := check(x, depth+1); e != nil {
					return e
				}
			}
		}
		return nil
	}
	if e := check(v, 1); e != nil {
		return nil, e
	}
	return v, nil
}

// parseRecipients checks the recipients' numbers and components, and drops the recipients whose
// number's digits came before (the first is kept). Their number is checked by the caller.
func parseRecipients(in []RecipientInput) ([]store.NewRecipient, *Error) {
	if len(in) > MaxBroadcastRecipients {
		return nil, errRecipientsCount
	}
	out := make([]store.NewRecipient, 0, len(in))
	seen := make(map[string]struct{}, len(in))
	for i, r := range in {
		field := func() string { return fmt.Sprintf("recipients[%d].to", i) } // named only in a refusal
		if !store.IsText(r.To) {
			return nil, errNotText(field())
		}
		if strings.TrimSpace(r.To) == "" {
			return nil, unprocessable(`"%s" is required`, field())
		}
		digits, ok := phoneNumber(r.To)
		if !ok {
			return nil, unprocessable(MsgRecipientPhone, field())
		}
		var components json.RawMessage
		if !isNull(r.Components) {
			field := fmt.Sprintf("recipients[%d].components", i)
			v, e := canonicalJSON(r.Components, field)
			if e != nil {
				return nil, e
			}
			if _, ok := v.([]any); !ok {
				return nil, unprocessable(`"%s" must be an array`, field)
			}
			components, _ = json.Marshal(v)
		}
		if _, dup := seen[digits]; dup {
			continue
		}
		seen[digits] = struct{}{}
		out = append(out, store.NewRecipient{To: digits, Components: components})
	}
	return out, nil
}

// phoneNumber returns the digits of a recipient's number: digits, with "+", spaces, dashes and
// parentheses, of minPhoneDigits to maxPhoneDigits digits.
func phoneNumber(s string) (string, bool) {
	digits := make([]byte, 0, maxPhoneDigits)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			if len(digits) == maxPhoneDigits {
				return "", false
			}
			digits = append(digits, c)
		case c == '+' || c == ' ' || c == '-' || c == '(' || c == ')':
		default:
			return "", false
		}
	}
	return string(digits), len(digits) >= minPhoneDigits
}

// broadcastInput reads a POST /channels/{id}/broadcasts body into an input: each field's type
// problem is left in pending for its turn (createBroadcast). A recipients problem stops the
// list at the recipient it was found in.
func broadcastInput(o object) (in BroadcastInput, pending map[string]*Error) {
	pending = map[string]*Error{}
	var e *Error
	if in.Name, _, e = o.str("name"); e != nil {
		pending["name"] = e
	}
	in.Template = o["template"]
	if isNull(in.Template) {
		in.Template = nil
	}
	if in.Recipients, e = recipientsInput(o["recipients"]); e != nil {
		pending["recipients"] = e
	}
	if raw := o["rate_per_minute"]; !isNull(raw) {
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil || n < math.MinInt32 || n > math.MaxInt32 {
			pending["rate_per_minute"] = errRateType // answered with the range (parseBroadcast)
		} else {
			r := int(n)
			in.RatePerMinute = &r
		}
	}
	if v, ok, e := o.str("start_at"); e != nil {
		pending["start_at"] = e
	} else if ok {
		in.StartAt = &v
	}
	return in, pending
}

// recipientsInput reads the "recipients" array: objects with a string "to" and optional
// "components". A problem ends the list before the recipient it was found in.
func recipientsInput(raw json.RawMessage) ([]RecipientInput, *Error) {
	if isNull(raw) {
		return nil, nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, unprocessable(`"recipients" must be an array of objects`)
	}
	if len(elems) > MaxBroadcastRecipients {
		return nil, errRecipientsCount
	}
	out := make([]RecipientInput, 0, len(elems))
	for i, el := range elems {
		var r object
		if err := json.Unmarshal(el, &r); err != nil || r == nil {
			return out, unprocessable(`"recipients[%d]" must be an object`, i)
		}
		to, _, e := rawString(r["to"], "to")
		if e != nil { // read again to name it by its position (not formatted for every recipient)
			_, _, e = rawString(r["to"], fmt.Sprintf("recipients[%d].to", i))
			return out, e
		}
		out = append(out, RecipientInput{To: to, Components: r["components"]})
	}
	return out, nil
}

// ListBroadcasts returns the newest broadcasts (up to 100) of one of the org's channels, newest
// first.
func (s *Service) ListBroadcasts(ctx context.Context, p Principal, channelID string) ([]Broadcast, error) {
	cid, err := id(channelID, MsgChannelNotFound)
	if err != nil {
		return nil, err
	}
	bs, err := s.opt.Store.ListBroadcasts(ctx, p.Key.OrgID, cid, maxBroadcastList)
	if err != nil {
		return nil, s.storeError(err)
	}
	out := make([]Broadcast, len(bs))
	for i, b := range bs {
		out[i] = newBroadcast(b)
	}
	return out, nil
}

// GetBroadcast returns one of the org's broadcasts with its counts.
func (s *Service) GetBroadcast(ctx context.Context, p Principal, broadcastID string) (Broadcast, error) {
	return s.broadcastAction(ctx, p, broadcastID, s.opt.Store.GetBroadcast)
}

// PauseBroadcast pauses a scheduled or sending broadcast (paused_reason "operator"); another
// status is 409 MsgBroadcastState.
func (s *Service) PauseBroadcast(ctx context.Context, p Principal, broadcastID string) (Broadcast, error) {
	return s.broadcastAction(ctx, p, broadcastID, s.opt.Store.PauseBroadcast)
}

// ResumeBroadcast resumes a paused broadcast (scheduled again when its start_at is ahead, else
// sending); another status is 409 MsgBroadcastState.
func (s *Service) ResumeBroadcast(ctx context.Context, p Principal, broadcastID string) (Broadcast, error) {
	return s.broadcastAction(ctx, p, broadcastID, s.opt.Store.ResumeBroadcast)
}

// CancelBroadcast cancels a scheduled, sending or paused broadcast: its recipients not sent yet
// are cancelled (a send under way finishes). A completed or cancelled one is 409 MsgBroadcastState.
func (s *Service) CancelBroadcast(ctx context.Context, p Principal, broadcastID string) (Broadcast, error) {
	return s.broadcastAction(ctx, p, broadcastID, s.opt.Store.CancelBroadcast)
}

// broadcastAction runs a store operation on one of the org's broadcasts.
func (s *Service) broadcastAction(ctx context.Context, p Principal, broadcastID string,
	op func(ctx context.Context, orgID, id uuid.UUID) (store.Broadcast, error)) (Broadcast, error) {
	bid, err := id(broadcastID, MsgBroadcastNotFound)
	if err != nil {
		return Broadcast{}, err
	}
	b, err := op(ctx, p.Key.OrgID, bid)
	if err != nil {
		return Broadcast{}, s.storeError(err)
	}
	return newBroadcast(b), nil
}

// BroadcastRecipients returns a page of one of the org's broadcasts' recipients in their list's
// order, those of one status when status is set (recipientStatuses), after the cursor after
// ("" for the first page), at most limit (1 to 100; 0 means 50). next is the cursor of the next
// page, "" when none follows.
func (s *Service) BroadcastRecipients(ctx context.Context, p Principal, broadcastID, status, after string, limit int) (items []BroadcastRecipient, next string, err error) {
	bid, err := id(broadcastID, MsgBroadcastNotFound)
	if err != nil {
		return nil, "", err
	}
	if status != "" && !slices.Contains(recipientStatuses, status) {
		return nil, "", errRecipientStatus
	}
	page := defaultPageLimit
	if limit != 0 {
		if limit < 1 || limit > maxPageLimit {
			return nil, "", errPageLimit
		}
		page = limit
	}
	afterSeq := -1
	if after != "" {
		n, err := strconv.Atoi(after)
		if err != nil || n < 0 || strconv.Itoa(n) != after {
			return nil, "", errAfter
		}
		afterSeq = n
	}
	rs, err := s.opt.Store.BroadcastRecipients(ctx, p.Key.OrgID, bid, status, afterSeq, page+1) // one more: does another page follow?
	if err != nil {
		return nil, "", s.storeError(err)
	}
	if len(rs) > page {
		rs = rs[:page]
		next = strconv.Itoa(rs[page-1].Seq)
	}
	items = make([]BroadcastRecipient, len(rs))
	for i, r := range rs {
		items[i] = BroadcastRecipient{To: r.To, Status: r.Status, Attempts: r.Attempts}
		if r.WAMID != "" {
			wamid := r.WAMID
			items[i].WAMID = &wamid
		}
		if r.ErrorCode != 0 || r.ErrorTitle != "" {
			items[i].Error = &RecipientError{Code: r.ErrorCode, Title: r.ErrorTitle}
		}
	}
	return items, next, nil
}

// broadcastStoreError maps the broadcasts' store errors (storeError's other cases apply too).
func broadcastStoreError(err error) (*Error, bool) {
	if st, ok := errors.AsType[*store.BroadcastStateError](err); ok {
		return &Error{http.StatusConflict, fmt.Sprintf(MsgBroadcastState, st.Status)}, true
	}
	switch {
	case errors.Is(err, store.ErrBroadcastNotFound):
		return &Error{http.StatusNotFound, MsgBroadcastNotFound}, true
	case errors.Is(err, store.ErrChannelNotActive):
		return &Error{http.StatusConflict, MsgChannelNotActive}, true
	}
	return nil, false
}

// createBroadcast answers POST /channels/{id}/broadcasts: 201 and the broadcast. Its body may
// be up to MaxBroadcastBodyBytes, the one exception to MaxBodyBytes.
func (h *Handler) createBroadcast(q *call) {
	if _, err := id(q.r.PathValue("id"), MsgChannelNotFound); err != nil {
		q.fail(err) // the path is checked before the body
		return
	}
	if obj := q.bodyUpTo(MaxBroadcastBodyBytes); obj != nil {
		in, pending := broadcastInput(obj)
		out, err := h.svc.createBroadcast(q.ctx(), q.p, q.r.PathValue("id"), in, pending)
		answer(q, http.StatusCreated, out, err)
	}
}

func (h *Handler) listBroadcasts(q *call) {
	out, err := h.svc.ListBroadcasts(q.ctx(), q.p, q.r.PathValue("id"))
	answer(q, http.StatusOK, out, err)
}

func (h *Handler) getBroadcast(q *call) {
	out, err := h.svc.GetBroadcast(q.ctx(), q.p, q.r.PathValue("id"))
	answer(q, http.StatusOK, out, err)
}

// broadcastRecipients answers a page of a broadcast's recipients; the next page is in a Link
// header, as the delivery log's and the messages'.
func (h *Handler) broadcastRecipients(q *call) {
	qs := q.r.URL.Query()
	limit := 0
	if v := qs.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			n = -1 // refused by BroadcastRecipients, in its order of checks
		}
		limit = n
	}
	out, next, err := h.svc.BroadcastRecipients(q.ctx(), q.p, q.r.PathValue("id"), qs.Get("status"), qs.Get("after"), limit)
	if err == nil && next != "" {
		link := url.Values{"limit": {strconv.Itoa(cmp.Or(limit, defaultPageLimit))}, "after": {next}}
		if s := qs.Get("status"); s != "" {
			link.Set("status", s)
		}
		q.w.Header().Set("Link", `<?`+link.Encode()+`>; rel="next"`)
	}
	answer(q, http.StatusOK, out, err)
}

func (h *Handler) pauseBroadcast(q *call) {
	out, err := h.svc.PauseBroadcast(q.ctx(), q.p, q.r.PathValue("id"))
	answer(q, http.StatusOK, out, err)
}

func (h *Handler) resumeBroadcast(q *call) {
	out, err := h.svc.ResumeBroadcast(q.ctx(), q.p, q.r.PathValue("id"))
	answer(q, http.StatusOK, out, err)
}

func (h *Handler) cancelBroadcast(q *call) {
	out, err := h.svc.CancelBroadcast(q.ctx(), q.p, q.r.PathValue("id"))
	answer(q, http.StatusOK, out, err)
}
