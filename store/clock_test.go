package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// clockEnv is a store and a queue that decide by one stubbed clock, an org with a channel on
// number "1" and a webhook: the tests move the clock instead of waiting or moving rows.
type clockEnv struct {
	t    *testing.T
	f    *testenv.Fixture
	clk  *clock.Stub
	q    *store.Queue
	org  uuid.UUID
	hook uuid.UUID
	seq  int
	// lease is the lease of claim's claims: a day unless the test sets it
	lease time.Duration
}

func newClockEnv(t *testing.T) *clockEnv {
	t.Helper()
	f, org := storeWithChannel(t)
	w, _ := f.Webhook(t, org.ID, "https://h.example.com")
	clk := clock.NewStub(time.Now())
	f.Store.SetClock(clk)
	return &clockEnv{t: t, f: f, clk: clk, q: store.NewQueue(f.Pool).WithClock(clk), org: org.ID, hook: w.ID,
		lease: 24 * time.Hour}
}

// events stores n message events (one delivery each), handing off up to claim.Max of them.
func (e *clockEnv) events(n int, claim store.Claim) store.InboundResult {
	e.t.Helper()
	items := make([]store.IncomingItem, n)
	for i := range items {
		e.seq++
		items[i] = store.IncomingItem{Type: "messages", PhoneNumberID: "1", DedupeKey: fmt.Sprintf("m:%d", e.seq),
			Data: json.RawMessage(fmt.Sprintf(`{"message":{"id":"m%d"}}`, e.seq))}
	}
	res, err := e.f.Store.StoreEvents(context.Background(), items, claim)
	if err != nil || res.Events != n {
		e.t.Fatalf("store events: %+v %v", res, err)
	}
	return res
}

// claim claims for instance under e.lease.
func (e *clockEnv) claim(instance string) store.Claimed {
	e.t.Helper()
	c, err := e.q.Claim(context.Background(), store.QueueClaim{Instance: instance, Lease: e.lease, Limit: 100, PerWebhook: 100})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// fail records a failed attempt of d, retried in retryIn, made by instance.
func (e *clockEnv) fail(instance string, d store.ClaimedDelivery, retryIn time.Duration) {
	e.t.Helper()
	code := 500
	if n, err := e.q.Record(context.Background(), instance, []store.Outcome{{Delivery: d, Started: e.clk.Now(),
		StatusCode: &code, RetryIn: retryIn}}); err != nil || n != 1 {
		e.t.Fatalf("record: %d %v", n, err)
	}
}

// nextAttempt returns the next_attempt_at of a delivery's queue row.
func (e *clockEnv) nextAttempt(id uuid.UUID) time.Time {
	e.t.Helper()
	return testenv.QueryValue[time.Time](e.t, e.f, `SELECT next_attempt_at FROM delivery_queue WHERE delivery_id = $1`, id)
}

// TestClaimTakesWhatIsDueByTheClock: a claim takes a delivery once it is due by the queue's
// clock and not a moment before, and the queue depth counts it from then on.
func TestClaimTakesWhatIsDueByTheClock(t *testing.T) {
	e := newClockEnv(t)
	e.events(3, store.Claim{})
	t0 := e.clk.Now()
	depth := func() int64 {
		t.Helper()
		n, _, err := e.q.Depth(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := depth(); n != 3 {
		t.Fatalf("depth %d of new deliveries, want 3 (due when stored)", n)
	}
	// two of them due a minute and an hour from now
	ids := testenv.QueryValue[[]uuid.UUID](t, e.f, `SELECT array_agg(delivery_id ORDER BY created_at, event_id) FROM delivery_queue`)
	soon, later := ids[1], ids[2]
	e.f.Exec(t, `UPDATE delivery_queue SET next_attempt_at = $2 WHERE delivery_id = $1`, soon, t0.Add(time.Minute))
	e.f.Exec(t, `UPDATE delivery_queue SET next_attempt_at = $2 WHERE delivery_id = $1`, later, t0.Add(time.Hour))

	if c := e.claim("i"); len(c.Deliveries) != 1 || c.Deliveries[0].ID != ids[0] {
		t.Fatalf("claimed %+v, want the one due now", c.Deliveries)
	}
	e.clk.Advance(time.Minute - time.Microsecond)
	if c := e.claim("i"); len(c.Deliveries) != 0 || depth() != 0 {
		t.Fatalf("a microsecond before the next one is due: claimed %d, depth %d", len(c.Deliveries), depth())
	}
	e.clk.Advance(time.Microsecond)
	if n := depth(); n != 1 {
		t.Fatalf("depth %d once the next one is due, want 1", n)
	}
	if c := e.claim("i"); len(c.Deliveries) != 1 || c.Deliveries[0].ID != soon {
		t.Fatalf("claimed %+v once the next one is due, want it", c.Deliveries)
	}
	e.clk.Set(t0.Add(time.Hour))
	if c := e.claim("i"); len(c.Deliveries) != 1 || c.Deliveries[0].ID != later {
		t.Fatalf("claimed %+v an hour later, want the last one", c.Deliveries)
	}
}

// TestLeaseEndsByTheClock: a claimed delivery — by a claim or by the inbound hand-off — stays
// with its claim until its lease has ended by the queue's clock, and is then reclaimed by
// another instance's claim, under the same attempt number.
func TestLeaseEndsByTheClock(t *testing.T) {
	e := newClockEnv(t)
	e.lease = time.Minute
	e.events(1, store.Claim{})
	if c := e.claim("a"); len(c.Deliveries) != 1 {
		t.Fatalf("first claim took %d, want 1", len(c.Deliveries))
	}
	if res := e.events(1, store.Claim{Instance: "a", Lease: time.Minute, Max: 1}); len(res.Claimed) != 1 {
		t.Fatalf("hand-off %+v, want one delivery claimed", res)
	}
	e.clk.Advance(time.Minute)
	if c := e.claim("b"); len(c.Deliveries) != 0 {
		t.Fatalf("another instance took %d deliveries as their leases end, want none", len(c.Deliveries))
	}
	e.clk.Advance(time.Microsecond)
	c := e.claim("b")
	if len(c.Deliveries) != 2 || c.Reclaimed != 2 {
		t.Fatalf("after the leases ended another instance took %d (%d reclaimed), want both", len(c.Deliveries), c.Reclaimed)
	}
	for _, d := range c.Deliveries {
		if d.Attempt != 1 {
			t.Fatalf("reclaimed delivery %+v: a lost claim used up an attempt", d)
		}
		if until := testenv.QueryValue[time.Time](t, e.f, `SELECT locked_until FROM delivery_queue WHERE delivery_id = $1`, d.ID); !until.Equal(e.clk.Now().Add(time.Minute)) {
			t.Fatalf("the new lease ends at %v, want a minute after %v", until, e.clk.Now())
		}
	}
}

// TestRetryScheduledByTheClock: a failed attempt's retry is due its delay after the outcome is
// recorded, by the queue's clock, and not before; a claim handed back with a delay is due that
// long after; a manual retry of a failed delivery is due at once.
func TestRetryScheduledByTheClock(t *testing.T) {
	e := newClockEnv(t)
	e.events(3, store.Claim{})
	c := e.claim("i")
	if len(c.Deliveries) != 3 {
		t.Fatalf("claimed %d, want 3", len(c.Deliveries))
	}
	retried, handed, failed := c.Deliveries[0], c.Deliveries[1], c.Deliveries[2]
	e.clk.Advance(time.Second) // (the attempts took a second)
	t1 := e.clk.Now()
	e.fail("i", retried, 30*time.Second)
	e.fail("i", failed, -1)
	if err := e.q.Release(context.Background(), "i", []store.Handback{{ID: handed.ID, Claim: handed.Claim, After: 5 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	if at := e.nextAttempt(retried.ID); !at.Equal(t1.Add(30 * time.Second)) {
		t.Fatalf("retry due at %v, want 30s after the outcome (%v)", at, t1)
	}
	if at := e.nextAttempt(handed.ID); !at.Equal(t1.Add(5 * time.Second)) {
		t.Fatalf("handed-back claim due at %v, want 5s after %v", at, t1)
	}
	if n := testenv.QueryValue[int](t, e.f, `SELECT count(*) FROM deliveries WHERE updated_at = $1`, t1); n != 2 {
		t.Fatalf("%d log rows updated at the outcomes' time, want 2", n)
	}
	e.clk.Advance(5*time.Second - time.Microsecond)
	if c := e.claim("i"); len(c.Deliveries) != 0 {
		t.Fatalf("claimed %d before anything is due", len(c.Deliveries))
	}
	e.clk.Set(t1.Add(5 * time.Second))
	if c := e.claim("i"); len(c.Deliveries) != 1 || c.Deliveries[0].ID != handed.ID || c.Deliveries[0].Attempt != 1 {
		t.Fatalf("claimed %+v, want the handed-back claim under its first attempt", c.Deliveries)
	}
	e.clk.Set(t1.Add(30*time.Second - time.Microsecond))
	if c := e.claim("i"); len(c.Deliveries) != 0 {
		t.Fatalf("claimed %d before the retry is due", len(c.Deliveries))
	}
	e.clk.Set(t1.Add(30 * time.Second))
	if c := e.claim("i"); len(c.Deliveries) != 1 || c.Deliveries[0].ID != retried.ID || c.Deliveries[0].Attempt != 2 {
		t.Fatalf("claimed %+v, want the retry, attempt 2", c.Deliveries)
	}

	// a manual retry of the failed delivery: due at once, by the store's clock
	e.clk.Advance(time.Hour)
	if err := e.f.Store.RetryDelivery(context.Background(), e.org, e.hook, failed.ID); err != nil {
		t.Fatal(err)
	}
	if at := e.nextAttempt(failed.ID); !at.Equal(e.clk.Now()) {
		t.Fatalf("manual retry due at %v, want now (%v)", at, e.clk.Now())
	}
	if c := e.claim("i"); len(c.Deliveries) != 1 || c.Deliveries[0].ID != failed.ID || c.Deliveries[0].Attempt != 1 {
		t.Fatalf("claimed %+v, want the manual retry as a first attempt", c.Deliveries)
	}
}
