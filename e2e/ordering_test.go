package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// arrival is one request a receiver got: the message id (without "wamid.") and its answer.
type arrival struct {
	id string
	ok bool
}

// orderedReceiver records what arrives, in order; fail answers 500 to the first attempt of the
// given message; hold keeps each request that long (the receiver's work); it counts the most
// requests it held at once.
type orderedReceiver struct {
	*testenv.Receiver
	mu         sync.Mutex
	arrivals   []arrival
	seen       map[string]bool
	inFlight   atomic.Int64
	maxAtATime atomic.Int64 // the most distinct messages in flight at once
	ids        map[string]int
}

func newOrderedReceiver(t *testing.T, fail string, hold *atomic.Int64) *orderedReceiver {
	o := &orderedReceiver{seen: map[string]bool{}, ids: map[string]int{}}
	o.Receiver = testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(_ int, w http.ResponseWriter, r *http.Request) {
		o.inFlight.Add(1)
		defer o.inFlight.Add(-1)
		var ev struct {
			Data struct {
				Message struct{ ID string } `json:"message"`
			} `json:"data"`
		}
		_ = json.NewDecoder(r.Body).Decode(&ev)
		id := strings.TrimPrefix(ev.Data.Message.ID, "wamid.")
		// Distinct messages, not requests: an attempt that timed out on the sender's side may
		// still be here when its retry arrives (a loaded machine) — the same message twice, not
		// two of the conversation at once.
		o.mu.Lock()
		o.ids[id]++
		if n := int64(len(o.ids)); n > o.maxAtATime.Load() {
			o.maxAtATime.Store(n)
		}
		o.mu.Unlock()
		defer func() {
			o.mu.Lock()
			if o.ids[id]--; o.ids[id] == 0 {
				delete(o.ids, id)
			}
			o.mu.Unlock()
		}()
		if hold != nil {
			time.Sleep(time.Duration(hold.Load()))
		}
		o.mu.Lock()
		ok := id != fail || o.seen[id]
		o.seen[id] = true
		o.arrivals = append(o.arrivals, arrival{id, ok})
		o.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}})
	return o
}

func (o *orderedReceiver) got() []arrival {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.arrivals)
}

// delivered returns the ids delivered (2xx) in order of their first success.
func (o *orderedReceiver) delivered() []string {
	var out []string
	for _, a := range o.got() {
		if a.ok && !slices.Contains(out, a.id) {
			out = append(out, a.id)
		}
	}
	return out
}

// index returns the position of the n-th (from 1) arrival of id, or -1.
func index(as []arrival, id string, n int) int {
	for i, a := range as {
		if a.id == id {
			if n--; n == 0 {
				return i
			}
		}
	}
	return -1
}

// TestOrderingPerConversation: two webhooks get the same posts — messages x1, y1, x2, y2, x3
// of customers x and y, posted one after the other — and each receiver fails the first attempt
// of x1. The webhook with ordering "conversation" receives x1 (failed), y1 and y2 meanwhile,
// then x1 again once its retry delay has passed (the queue aged by it), then x2 and x3: x's
// messages one at a time, in order. The webhook with ordering "none" gets x2 and x3 before
// x1's retry.
func TestOrderingPerConversation(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	ordered, plain := newOrderedReceiver(t, "x1", nil), newOrderedReceiver(t, "x1", nil)
	const retryDelay = time.Hour // (passes only when the test ages the queue)
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n retry_delays %s %s %s\n timeout 5s\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, retryDelay, retryDelay, retryDelay, testenv.CAFile(t, ordered.Certificate())) // (httptest's servers share one certificate)
	origin := e.caddyWith("", appExtra, "handle /webhooks/upstream {\n wabarelay_inbound\n}")
	e.channelOn(true, pnid)
	wo, so := e.fix.Webhook(t, e.org, ordered.URL+"/hook", &testenv.WebhookOpts{Name: "ordered"})
	_, sp := e.fix.Webhook(t, e.org, plain.URL+"/hook", &testenv.WebhookOpts{Name: "plain"})
	if _, err := e.store.SetWebhookOrdering(context.Background(), e.org, wo.ID, store.OrderingConversation); err != nil {
		t.Fatal(err)
	}
	ordered.Verify(so)
	plain.Verify(sp)

	for _, m := range []string{"x1", "y1", "x2", "y2", "x3"} {
		if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, conversationBatch([]string{m}, []string{m[:1] + "-15550001111"})); status != 200 {
			t.Fatalf("inbound: %d %s", status, body)
		}
	}
	// before x1's retry is due: both webhooks have x1's failure recorded (its retry scheduled),
	// the ordered one has delivered y's messages, the plain one everything else as well
	if !testenv.Within(time.Minute, func() bool {
		return e.retriesScheduled() == 2 && e.inFlight() == 0 &&
			slices.Equal(sorted(ordered.delivered()), []string{"y1", "y2"}) && len(plain.delivered()) == 4
	}) {
		t.Fatalf("before x1's retry: ordered got %v, plain got %v, %d retries scheduled; want y1 and y2 delivered to the ordered webhook, "+
			"x2, y1, y2 and x3 to the plain one, x1's retry scheduled for both", ordered.got(), plain.got(), e.retriesScheduled())
	}
	e.fix.AgeQueue(t, retryDelay)
	testenv.Eventually(t, time.Minute, func() bool { return len(ordered.delivered()) == 5 && len(plain.delivered()) == 5 }, "every message delivered to both")

	got := ordered.got()
	t.Logf("ordered: %v", got)
	var xs []string
	for _, a := range got {
		if a.id[0] == 'x' {
			xs = append(xs, a.id)
		}
	}
	if !slices.Equal(xs, []string{"x1", "x1", "x2", "x3"}) {
		t.Fatalf("ordered webhook: x's attempts %v, want x1 (failed), x1, x2, x3", xs)
	}
	if retry := index(got, "x1", 2); index(got, "y2", 1) > retry || index(got, "y1", 1) > retry {
		t.Fatalf("ordered webhook: y's messages waited for x1's retry: %v", got)
	}
	pg := plain.got()
	t.Logf("plain: %v", pg)
	if retry := index(pg, "x1", 2); index(pg, "x2", 1) > retry || index(pg, "x3", 1) > retry {
		t.Fatalf("plain webhook: x2 and x3 should not wait for x1's retry: %v", pg)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return e.undelivered() == 0 }, "every delivery delivered")
}

// sorted returns a sorted copy of s.
func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestOrderingSurvivesKill: an ordered webhook's conversation is being delivered (a slow
// receiver keeps each attempt in flight) when the instance is killed with SIGKILL; once the
// killed attempt's lease has passed (the queue aged by it), another instance on the same
// database delivers the rest: nothing lost, the order kept (each message first arrives after
// the one before it), never two of the conversation at once.
func TestOrderingSurvivesKill(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	var hold atomic.Int64
	hold.Store(int64(200 * time.Millisecond))
	rc := newOrderedReceiver(t, "", &hold)
	const lease = time.Hour // (ends only when the test ages the queue)
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n retry_delays 200ms 200ms 200ms\n timeout 10s\n lease %s\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, lease, testenv.CAFile(t, rc.Certificate()))
	site := "handle /webhooks/upstream {\n wabarelay_inbound\n}"
	origin := e.caddyWith("", appExtra, site)
	e.channelOn(true, pnid)
	w, secret := e.fix.Webhook(t, e.org, rc.URL+"/hook", &testenv.WebhookOpts{Name: "ordered"})
	if _, err := e.store.SetWebhookOrdering(context.Background(), e.org, w.ID, store.OrderingConversation); err != nil {
		t.Fatal(err)
	}
	rc.Verify(secret)

	const n = 12
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("x%02d", i)
	}
	// two posts: the first six, then the rest in one batch (inbound order within a batch too)
	for _, part := range [][]string{want[:6], want[6:]} {
		froms := make([]string, len(part))
		for i := range froms {
			froms[i] = "15550002222"
		}
		if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, conversationBatch(part, froms)); status != 200 {
			t.Fatalf("inbound: %d %s", status, body)
		}
	}
	// killed while the receiver holds an attempt: its delivery stays in flight under its lease
	testenv.Eventually(t, 30*time.Second, func() bool { return len(rc.delivered()) >= 3 && rc.inFlight.Load() > 0 }, "a few delivered, one in flight")
	e.caddies[origin].Kill()
	t.Logf("killed with %d of %d delivered, %d in flight", len(rc.delivered()), n, e.inFlight())
	hold.Store(int64(20 * time.Millisecond))
	// the lease passes: the killed attempt has ended at the receiver (a lease outlasts an
	// attempt's timeout), then the queue ages by the lease and another instance takes over
	testenv.Eventually(t, 30*time.Second, func() bool { return rc.inFlight.Load() == 0 }, "the killed instance's attempt to end at the receiver")
	e.fix.AgeQueue(t, lease)
	e.caddyWith("", appExtra, site)
	testenv.Eventually(t, time.Minute, func() bool { return len(rc.delivered()) == n }, "every message delivered")
	if got := rc.delivered(); !slices.Equal(got, want) {
		t.Fatalf("delivered in the order %v, want %v", got, want)
	}
	// each message's first arrival follows the one before it
	var firsts []string
	for _, a := range rc.got() {
		if !slices.Contains(firsts, a.id) {
			firsts = append(firsts, a.id)
		}
	}
	if !slices.Equal(firsts, want) {
		t.Fatalf("first arrivals in the order %v, want %v", firsts, want)
	}
	if m := rc.maxAtATime.Load(); m != 1 {
		t.Fatalf("%d of the conversation's messages were in flight at once, want 1", m)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return e.undelivered() == 0 }, "every delivery delivered")
}
