package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// hookPrefix is the receiver path prefix: webhook i delivers to hookPrefix + i. The fairness
// step's slow and paused webhooks deliver to slowPath and pausedPath.
const (
	hookPrefix = "/hook/"
	slowPath   = "/slow"
	pausedPath = "/paused"
)

// receiver answers 204 to every delivery and records, for the current step, the first receipt
// of each (webhook, event) pair (webhook by the request path, event by its message id) and the
// receipts per (path, webhook-id). At slowPath it answers only after slowDelay (longer than the
// delivery timeout), or not at all if the request is cancelled or the bench ends first.
type receiver struct {
	webhooks  int
	slowDelay time.Duration
	done      chan struct{} // closed when the bench ends: slow handlers return
	stopOnce  sync.Once
	cur       atomic.Pointer[stepState]
	total     atomic.Int64 // every receipt at a healthy webhook's path, all steps
	mismatch  atomic.Int64 // webhook-id header ≠ body id, or unparsable body
	badPath   atomic.Int64 // receipts on a path that is no webhook's
	stray     atomic.Int64 // receipts for another step's events

	slowReceipts   atomic.Int64 // requests at slowPath
	slowAnswered   atomic.Int64 // … answered after slowDelay
	pausedReceipts atomic.Int64 // requests at pausedPath (a paused webhook's: none expected)
}

func newReceiver(webhooks int) *receiver {
	return &receiver{webhooks: webhooks, slowDelay: deliveryTimeout + time.Second, done: make(chan struct{})}
}

// stop makes the slow path's handlers return (httptest.Server.Close waits for them).
func (rc *receiver) stop() { rc.stopOnce.Do(func() { close(rc.done) }) }

func (rc *receiver) serveSlow(w http.ResponseWriter, r *http.Request) {
	rc.slowReceipts.Add(1)
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20)) // drained unread: a failed read changes nothing here
	t := time.NewTimer(rc.slowDelay)
	defer t.Stop()
	select {
	case <-t.C:
		rc.slowAnswered.Add(1)
		w.WriteHeader(http.StatusNoContent)
	case <-r.Context().Done(): // the dispatcher gave up (timeout)
	case <-rc.done:
		panic(http.ErrAbortHandler) // the bench ends: close the connection, no answer
	}
}

// hookIndex returns the webhook index of a receiver path (hookPrefix + i).
func (rc *receiver) hookIndex(path string) (int, bool) {
	rest, ok := strings.CutPrefix(path, hookPrefix)
	if !ok {
		return 0, false
	}
	h, err := strconv.Atoi(rest)
	if err != nil || h < 0 || h >= rc.webhooks || strconv.Itoa(h) != rest {
		return 0, false
	}
	return h, true
}

type deliveredEvent struct {
	ID        string `json:"id"`
	CreatedAt string `json:"created_at"`
	Data      struct {
		Message struct {
			ID string `json:"id"`
		} `json:"message"`
	} `json:"data"`
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case slowPath:
		rc.serveSlow(w, r)
		return
	case pausedPath:
		rc.pausedReceipts.Add(1)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	now := time.Now()
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	w.WriteHeader(http.StatusNoContent)
	rc.total.Add(1)
	var ev deliveredEvent
	hid := r.Header.Get("webhook-id")
	if err := json.Unmarshal(body, &ev); err != nil || ev.ID == "" || ev.ID != hid {
		rc.mismatch.Add(1)
	}
	hook, ok := rc.hookIndex(r.URL.Path)
	if !ok {
		rc.badPath.Add(1)
		return
	}
	st := rc.cur.Load()
	if st == nil {
		rc.stray.Add(1)
		return
	}
	idx, ok := st.messageIndex(ev.Data.Message.ID)
	if !ok {
		rc.stray.Add(1)
		return
	}
	st.receipts.Add(1)
	if st.recv[st.pair(hook, idx)].CompareAndSwap(0, now.UnixNano()) {
		st.distinct.Add(1)
		st.perHook[hook].Add(1)
	} else {
		st.dupes.Add(1)
	}
	st.mu.Lock()
	st.byHookID[hookReceipt{hook, hid}]++
	st.mu.Unlock()
}

// hookReceipt is a webhook-id as received at one webhook's path.
type hookReceipt struct {
	hook int
	id   string
}

// stepState is one step's per-delivery bookkeeping. Message i is in post i / perPost; its
// delivery to webhook h is pair h*events + i.
type stepState struct {
	prefix   string // "wamid.<run>.<step>."
	perPost  int
	events   int            // messages offered in the step (posts × perPost)
	sent     []int64        // per post: send time (unix ns), 0 if not sent
	recv     []atomic.Int64 // per (webhook, message) pair: first receive time (unix ns), 0 if none
	perHook  []atomic.Int64 // per webhook: distinct messages received
	receipts atomic.Int64
	distinct atomic.Int64 // distinct (webhook, message) pairs received
	dupes    atomic.Int64 // receipts of an already received (webhook, message) pair
	mu       sync.Mutex
	byHookID map[hookReceipt]int
}

func (s *stepState) pair(hook, msg int) int { return hook*s.events + msg }

func (s *stepState) messageIndex(wamid string) (int, bool) {
	rest, ok := strings.CutPrefix(wamid, s.prefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= s.events {
		return 0, false
	}
	return i, true
}
