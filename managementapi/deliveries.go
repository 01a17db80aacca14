package managementapi

import (
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/store"
)

// Delivery is the JSON form of a delivery with its attempts.
type Delivery struct {
	ID             uuid.UUID `json:"id"`
	EventID        uuid.UUID `json:"event_id"`
	EventType      string    `json:"event_type"`
	Status         string    `json:"status"`
	Attempts       int       `json:"attempts"`
	NextAttemptAt  *Time     `json:"next_attempt_at"`
	LastStatusCode *int      `json:"last_status_code"`
	LastError      *string   `json:"last_error"`
	CreatedAt      Time      `json:"created_at"`
	UpdatedAt      Time      `json:"updated_at"`
	AttemptLog     []Attempt `json:"attempt_log"`
}

// Attempt is the JSON form of one delivery attempt.
type Attempt struct {
	Attempt int `json:"attempt"`
	// Schedule is 1 for the original schedule, 2 for the first manual retry or recovery, ….
	Schedule     int     `json:"schedule"`
	StartedAt    Time    `json:"started_at"`
	DurationMS   int     `json:"duration_ms"`
	StatusCode   *int    `json:"status_code"`
	Error        *string `json:"error"`
	ResponseBody *string `json:"response_body"`
}

func newDelivery(d store.Delivery) Delivery {
	out := Delivery{ID: d.ID, EventID: d.EventID, EventType: d.EventType, Status: d.Status, Attempts: d.Attempts,
		NextAttemptAt: optTime(d.NextAttemptAt), LastStatusCode: d.LastStatusCode, LastError: d.LastError,
		CreatedAt: Time(d.CreatedAt), UpdatedAt: Time(d.UpdatedAt), AttemptLog: make([]Attempt, len(d.Log))}
	for i, a := range d.Log {
		out.AttemptLog[i] = Attempt{Attempt: a.Attempt, Schedule: a.Schedule, StartedAt: Time(a.StartedAt), DurationMS: a.DurationMS,
			StatusCode: a.StatusCode, Error: a.Error, ResponseBody: a.ResponseBody}
	}
	return out
}

const (
	defaultPageLimit = 50
	maxPageLimit     = 100
)

var deliveryStatuses = map[string]bool{"pending": true, "in_flight": true, "delivered": true, "failed": true}

// listDeliveries answers a page of a webhook's deliveries; the next page is in a Link header
// (a relative reference carrying the cursor).
func (h *Handler) listDeliveries(q *request) {
	id, ok := q.id(0, MsgWebhookNotFound)
	if !ok {
		return
	}
	qs := q.r.URL.Query()
	page := store.DeliveryPage{Status: qs.Get("status"), Limit: defaultPageLimit}
	if page.Status != "" && !deliveryStatuses[page.Status] {
		clientError(q.w, unprocessable(`"status" must be one of: pending, in_flight, delivered, failed`))
		return
	}
	if v := qs.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageLimit {
			clientError(q.w, unprocessable(`"limit" must be an integer from 1 to %d`, maxPageLimit))
			return
		}
		page.Limit = n
	}
	if v := qs.Get("cursor"); v != "" {
		c, ok := parseID(v)
		if !ok {
			clientError(q.w, unprocessable(`"cursor" is invalid`))
			return
		}
		page.After = &c
	}
	ds, more, err := h.opt.Store.ListDeliveries(q.r.Context(), q.orgID, id, page)
	if err != nil {
		h.storeError(q, err)
		return
	}
	out := make([]Delivery, len(ds))
	for i, d := range ds {
		out[i] = newDelivery(d)
	}
	if more {
		next := url.Values{"limit": {strconv.Itoa(page.Limit)}, "cursor": {ds[len(ds)-1].ID.String()}}
		if page.Status != "" {
			next.Set("status", page.Status)
		}
		q.w.Header().Set("Link", `<?`+next.Encode()+`>; rel="next"`)
	}
	httpx.WriteJSON(q.w, http.StatusOK, out)
}

// retryDelivery re-queues a failed delivery with a fresh schedule.
func (h *Handler) retryDelivery(q *request) {
	wid, ok := q.id(0, MsgWebhookNotFound)
	if !ok {
		return
	}
	did, ok := q.id(1, MsgDeliveryNotFound)
	if !ok {
		return
	}
	if err := h.opt.Store.RetryDelivery(q.r.Context(), q.orgID, wid, did); err != nil {
		h.storeError(q, err)
		return
	}
	httpx.WriteJSON(q.w, http.StatusAccepted, map[string]string{"id": did.String(), "status": "pending"})
}

// recoverDeliveries re-queues every failed delivery since a time.
func (h *Handler) recoverDeliveries(q *request) {
	id, ok := q.id(0, MsgWebhookNotFound)
	if !ok {
		return
	}
	obj, e := readObject(q.w, q.r)
	if e != nil {
		clientError(q.w, e)
		return
	}
	raw, present, e := obj.str("since")
	if e != nil {
		clientError(q.w, e)
		return
	}
	if !present || raw == "" {
		clientError(q.w, unprocessable(`"since" is required`))
		return
	}
	since, err := time.Parse(time.RFC3339Nano, raw)
	if err != nil {
		clientError(q.w, unprocessable(`"since" must be an ISO 8601 timestamp with a time zone`))
		return
	}
	n, err := h.opt.Store.RecoverDeliveries(q.r.Context(), q.orgID, id, since)
	if err != nil {
		h.storeError(q, err)
		return
	}
	httpx.WriteJSON(q.w, http.StatusAccepted, map[string]int{"requeued": n})
}
