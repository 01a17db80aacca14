package managementapi

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/store"
)

// The message timeline (DESIGN §5b "Message timeline"): a channel's recent outgoing messages
// (GET /channels/{id}/messages) and one message's whole timeline (GET /messages/{wamid}).

// MsgMessageNotFound answers an unknown message id, or one of another org.
const MsgMessageNotFound = "Message not found"

var (
	errMessageStatus = unprocessable(`"status" must be one of: %s`, strings.Join(store.MessageStatuses, ", "))
	errPageLimit     = unprocessable(`"limit" must be an integer from 1 to %d`, maxPageLimit)
	errCursor        = unprocessable(`"cursor" is invalid`)
)

// MessageQuery selects a page of a channel's outgoing messages: the query parameters of
// GET /channels/{id}/messages, and the dashboard's search.
type MessageQuery struct {
	// Limit caps the page: 1 to 100; 0 means 50.
	Limit int
	// Status keeps the messages whose latest status it is: accepted, sent, delivered, read or
	// failed ("" for all).
	Status string
	// To keeps the messages to this recipient (exact; "" for all).
	To string
	// Search keeps the messages whose wamid, recipient or idempotency key it is (exact; "" for
	// all). Not an API parameter: the dashboard's search box.
	Search string
	// Cursor is the "cursor" of a next page's query ("" for the first page).
	Cursor string
}

// Message is the JSON form of an outgoing message in a channel's list.
type Message struct {
	WAMID     string    `json:"wamid"`
	ChannelID uuid.UUID `json:"channel_id"`
	// To is the recipient; null when unknown.
	To        *string `json:"to"`
	CreatedAt Time    `json:"created_at"`
	// Status is the latest upstream status: accepted, sent, delivered, read or failed.
	Status string `json:"status"`
	// Error is the upstream's error of a failed message; null otherwise.
	Error          *MessageError `json:"error"`
	IdempotencyKey *string       `json:"idempotency_key"`
	// BroadcastID is the broadcast that sent the message; null for any other send.
	BroadcastID *uuid.UUID `json:"broadcast_id"`
}

// MessageError is the JSON form of the upstream's error of a message or status.
type MessageError struct {
	Code  int    `json:"code"`
	Title string `json:"title"`
}

// Timeline is the JSON form of one message's timeline.
type Timeline struct {
	WAMID     string    `json:"wamid"`
	ChannelID uuid.UUID `json:"channel_id"`
	// Direction is "outgoing" or "incoming".
	Direction string `json:"direction"`
	// To and From: the recipient and the channel's number of an outgoing message, the channel's
	// number and the sender of an incoming one; null when unknown.
	To   *string `json:"to"`
	From *string `json:"from"`
	// Status is the latest upstream status of an outgoing message, "received" for an incoming one.
	Status string        `json:"status"`
	Error  *MessageError `json:"error"`
	// BroadcastID is the broadcast that sent an outgoing message; null for any other message.
	BroadcastID *uuid.UUID         `json:"broadcast_id"`
	RelayCall   *RelayCall         `json:"relay_call"`
	Statuses    []StatusUpdate     `json:"statuses"`
	Deliveries  []TimelineDelivery `json:"deliveries"`
}

// RelayCall is the JSON form of the relay call that sent a message.
type RelayCall struct {
	At Time `json:"at"`
	// Status is the HTTP status answered to the caller.
	Status int `json:"status"`
	// LatencyMS is the call's duration in milliseconds (microsecond precision).
	LatencyMS      float64 `json:"latency_ms"`
	IdempotencyKey *string `json:"idempotency_key"`
	Replayed       bool    `json:"replayed"`
}

// StatusUpdate is the JSON form of one status of an outgoing message.
type StatusUpdate struct {
	Status string `json:"status"`
	// Timestamp is the upstream's; null when it sent none that can be read.
	Timestamp *Time         `json:"timestamp"`
	Error     *MessageError `json:"error"`
}

// TimelineDelivery is the JSON form of one delivery of a message's event to a webhook.
type TimelineDelivery struct {
	WebhookID uuid.UUID `json:"webhook_id"`
	EventID   uuid.UUID `json:"event_id"`
	Type      string    `json:"type"`
	Status    string    `json:"status"`
	Attempts  int       `json:"attempts"`
}

func newMessageError(e *store.MessageError) *MessageError {
	if e == nil {
		return nil
	}
	return &MessageError{Code: e.Code, Title: e.Title}
}

// NewTimeline converts a stored timeline.
func NewTimeline(t *store.Timeline) Timeline {
	out := Timeline{WAMID: t.WAMID, ChannelID: t.ChannelID, Direction: t.Direction, To: t.To, From: t.From, Status: t.Status,
		Error: newMessageError(t.Error), BroadcastID: t.BroadcastID, Statuses: make([]StatusUpdate, len(t.Statuses)), Deliveries: make([]TimelineDelivery, len(t.Deliveries))}
	if r := t.Relay; r != nil {
		out.RelayCall = &RelayCall{At: Time(r.At), Status: r.Status, LatencyMS: float64(r.LatencyUS) / 1000,
			IdempotencyKey: r.IdempotencyKey, Replayed: r.Replayed}
	}
	for i, s := range t.Statuses {
		out.Statuses[i] = StatusUpdate{Status: s.Status, Error: newMessageError(s.Error)}
		if !s.Timestamp.IsZero() {
			ts := Time(s.Timestamp)
			out.Statuses[i].Timestamp = &ts
		}
	}
	for i, d := range t.Deliveries {
		out.Deliveries[i] = TimelineDelivery{WebhookID: d.WebhookID, EventID: d.EventID, Type: d.Type, Status: d.Status, Attempts: d.Attempts}
	}
	return out
}

// ListMessages returns a page of a channel's outgoing messages, newest first, and, when another
// page follows, the query of the next page (its cursor, and the page's limit and filters).
func (s *Service) ListMessages(ctx context.Context, p Principal, channelID string, q MessageQuery) ([]Message, url.Values, error) {
	cid, err := id(channelID, MsgChannelNotFound)
	if err != nil {
		return nil, nil, err
	}
	f := store.MessageFilter{Status: q.Status, To: q.To, Search: q.Search, After: q.Cursor, Limit: defaultPageLimit}
	if f.Status != "" {
		if _, ok := store.StatusRank(f.Status); !ok {
			return nil, nil, errMessageStatus
		}
	}
	if q.Limit != 0 {
		if q.Limit < 1 || q.Limit > maxPageLimit {
			return nil, nil, errPageLimit
		}
		f.Limit = q.Limit
	}
	for _, v := range [...]struct{ name, val string }{{"to", f.To}, {"search", f.Search}} {
		if !store.IsText(v.val) {
			return nil, nil, errNotText(v.name)
		}
	}
	if f.After != "" && (len(f.After) > store.MaxWAMIDLen || !store.IsText(f.After)) {
		return nil, nil, errCursor
	}
	page := f.Limit
	f.Limit++ // one more: does another page follow?
	ms, err := s.opt.Store.ListMessages(ctx, p.Key.OrgID, cid, f)
	if errors.Is(err, store.ErrCursorNotFound) {
		return nil, nil, errCursor
	}
	if err != nil {
		return nil, nil, s.storeError(err)
	}
	var next url.Values
	if len(ms) > page {
		ms = ms[:page]
		next = url.Values{"limit": {strconv.Itoa(page)}, "cursor": {ms[page-1].WAMID}}
		if f.Status != "" {
			next.Set("status", f.Status)
		}
		if f.To != "" {
			next.Set("to", f.To)
		}
	}
	out := make([]Message, len(ms))
	for i, m := range ms {
		out[i] = Message{WAMID: m.WAMID, ChannelID: m.ChannelID, CreatedAt: Time(m.CreatedAt), Status: m.Status,
			Error: newMessageError(m.Error), IdempotencyKey: m.IdempotencyKey, BroadcastID: m.BroadcastID}
		if m.To != "" {
			to := m.To
			out[i].To = &to
		}
	}
	return out, next, nil
}

// GetMessage returns the timeline of one of the org's messages, outgoing or incoming.
func (s *Service) GetMessage(ctx context.Context, p Principal, wamid string) (Timeline, error) {
	t, err := s.MessageTimeline(ctx, p, wamid)
	if err != nil {
		return Timeline{}, err
	}
	return NewTimeline(t), nil
}

// listMessages answers a page of a channel's outgoing messages; the next page is in a Link
// header, as the delivery log's.
func (h *Handler) listMessages(q *call) {
	qs := q.r.URL.Query()
	mq := MessageQuery{Status: qs.Get("status"), To: qs.Get("to"), Cursor: qs.Get("cursor")}
	if v := qs.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			n = -1 // refused by ListMessages, in its order of checks
		}
		mq.Limit = n
	}
	out, next, err := h.svc.ListMessages(q.ctx(), q.p, q.r.PathValue("id"), mq)
	if next != nil {
		q.w.Header().Set("Link", `<?`+next.Encode()+`>; rel="next"`)
	}
	answer(q, http.StatusOK, out, err)
}

// getMessage answers one message's timeline.
func (h *Handler) getMessage(q *call) {
	out, err := h.svc.GetMessage(q.ctx(), q.p, q.r.PathValue("wamid"))
	answer(q, http.StatusOK, out, err)
}
