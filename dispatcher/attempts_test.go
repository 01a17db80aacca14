package dispatcher

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap/zaptest"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// crashedInstance returns a dispatcher that is never run: what it claims stays claimed, with no
// attempt made or recorded, as if its instance had died right after the claim.
func (e *env) crashedInstance(rc *testenv.Receiver) *Dispatcher {
	e.t.Helper()
	cfg := e.config(rc)
	cfg.InstanceID = "crashed-" + uuid.NewString()[:6]
	d, err := New(e.pool, e.st.WebhookSecret, cfg, zaptest.NewLogger(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

// attemptNumbers returns the attempt numbers in the event's delivery log, in order.
func (e *env) attemptNumbers(eventID uuid.UUID) []int {
	e.t.Helper()
	var n []int
	for _, a := range e.attemptRows(eventID) {
		n = append(n, a.attempt)
	}
	return n
}

func isSequence(n []int, want int) bool {
	if len(n) != want {
		return false
	}
	for i, a := range n {
		if a != i+1 {
			return false
		}
	}
	return true
}

// TestReclaimedLeaseIsNotAnAttempt: a first attempt claimed by an instance that crashed before
// making it — claimed by the dispatcher's claim, or inserted already claimed by the inbound
// handler (the hand-off) — is left alone while its lease runs, reclaimed once its lease has
// passed by the clock (each at its own lease's end), delivered, and logged as attempt 1: the
// lost claim used up no attempt.
func TestReclaimedLeaseIsNotAnAttempt(t *testing.T) {
	e := newEnv(t)
	clk := e.useClock()
	t0 := clk.Now()
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	e.webhook(rc.URL)
	ctx := context.Background()

	claimed := e.events(1)[0]
	crashed := e.crashedInstance(rc)
	if jobs, _, err := crashed.claim(ctx, 10); err != nil || len(jobs) != 1 || jobs[0].EventID != claimed {
		t.Fatalf("claim by the crashing instance: %+v %v", jobs, err)
	}
	res := e.inbound(1, store.Claim{Instance: crashed.InstanceID(), Lease: 2 * crashed.Lease(), Max: 1})
	if len(res.Claimed) != 1 {
		t.Fatalf("inbound %+v", res)
	}
	handedOff := res.Claimed[0].EventID

	d, _ := e.start(e.config(rc))
	caughtUp(t, d) // its claim saw both leases running
	clk.Set(t0.Add(crashed.Lease()))
	if jobs, _, err := e.crashedInstance(rc).claim(ctx, 10); err != nil || len(jobs) != 0 {
		t.Fatalf("as the first lease ends another instance claimed %+v (%v), want nothing", jobs, err)
	}
	clk.Advance(time.Microsecond)
	testenv.Eventually(t, patience, e.statusIs(claimed, "delivered"), "the claim reclaimed and delivered once its lease passed")
	if row := e.delivery(handedOff); row.status != "in_flight" || rc.Count() != 1 {
		t.Fatalf("the hand-off's longer lease was taken over: %+v, %d receipts", row, rc.Count())
	}
	clk.Set(t0.Add(2*crashed.Lease() + time.Microsecond))
	testenv.Eventually(t, patience, e.statusIs(handedOff, "delivered"), "the hand-off reclaimed and delivered once its lease passed")
	for _, id := range []uuid.UUID{claimed, handedOff} {
		if row := e.delivery(id); row.attempts != 1 {
			t.Fatalf("reclaimed delivery %+v, want 1 attempt", row)
		}
		if at := e.attemptRows(id); len(at) != 1 || at[0].attempt != 1 || at[0].code == nil || *at[0].code != http.StatusOK {
			t.Fatalf("attempt log %+v, want attempt 1 only", at)
		}
	}
	if n := len(rc.Deliveries()); n != 2 {
		t.Fatalf("%d receipts, want 2", n)
	}
}

// TestAlwaysFailingWithExpiredLeaseGetsFourAttempts: a delivery whose receiver always fails, and
// whose second attempt was claimed by an instance that crashed before making it, still gets
// exactly four attempts, logged as 1, 2, 3, 4, and is failed after the fourth. The schedule is an
// hour between attempts: the test moves the clock on by the hour to make each retry due, and past
// the crashed claim's lease, instead of waiting.
func TestAlwaysFailingWithExpiredLeaseGetsFourAttempts(t *testing.T) {
	e := newEnv(t)
	clk := e.useClock()
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(n int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}})
	e.webhook(rc.URL)
	id := e.events(1)[0]
	ctx := context.Background()
	cfg := e.config(rc)
	cfg.RetryDelays = []time.Duration{time.Hour, time.Hour, time.Hour}

	// recorded waits until the outcome of attempt n is in (or the delivery failed), then checks
	// the log holds attempts 1..n and the delivery counts n and is status, its retry an hour on.
	recorded := func(n int, status string) {
		t.Helper()
		testenv.Eventually(t, patience, func() bool {
			return len(e.attemptRows(id)) >= n || e.delivery(id).status == "failed"
		}, "the outcome of the attempt")
		if got := e.attemptNumbers(id); !isSequence(got, n) {
			t.Fatalf("attempt log %v, want attempts 1..%d", got, n)
		}
		if row := e.delivery(id); row.status != status || row.attempts != n {
			t.Fatalf("after attempt %d: %+v, want %s with %d attempts", n, row, status, n)
		}
		if status == "pending" {
			if due := testenv.QueryValue[time.Time](t, e.fix, `SELECT next_attempt_at FROM delivery_queue WHERE event_id = $1`, id); !due.Equal(clk.Now().Add(time.Hour)) {
				t.Fatalf("after attempt %d the retry is due at %v, want an hour after %v", n, due, clk.Now())
			}
		}
	}

	stop := e.run(cfg)
	recorded(1, "pending")
	stop() // (so that the crashing instance is the one that claims the retry)

	clk.Advance(time.Hour)
	crashed := e.crashedInstance(rc)
	if jobs, _, err := crashed.claim(ctx, 10); err != nil || len(jobs) != 1 || jobs[0].EventID != id {
		t.Fatalf("claim by the crashing instance: %+v %v", jobs, err)
	}
	clk.Advance(crashed.Lease() + time.Microsecond)

	e.run(cfg) // reclaims the lease: attempt 2
	recorded(2, "pending")
	clk.Advance(time.Hour)
	recorded(3, "pending")
	clk.Advance(time.Hour)
	recorded(4, "failed")
	if n := len(rc.Deliveries()); n != 4 {
		t.Fatalf("%d receipts, want 4", n)
	}
}

// claimKinds claims limit rows with d and returns how many of the given retries (by event id)
// and how many other rows it took.
func claimKinds(t *testing.T, d *Dispatcher, limit int, late map[uuid.UUID]bool) (took []uuid.UUID, others int) {
	t.Helper()
	jobs, _, err := d.claim(context.Background(), limit)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != limit {
		t.Fatalf("claimed %d of %d", len(jobs), limit)
	}
	for _, j := range jobs {
		if late[j.EventID] {
			took = append(took, j.EventID)
		} else {
			others++
		}
	}
	return took, others
}

// TestRetriesNotStarvedByBacklog: under a backlog of due first attempts larger than a claim,
// expired leases (up to a quarter of the claim) and then due retries are taken in the order they
// fell due: a retry waits only for work that was due before it, never behind first attempts
// that came later.
func TestRetriesNotStarvedByBacklog(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	e.webhook(rc.URL)
	ctx := context.Background()
	ids := e.events(12)
	// ids[0..2]: retries, due for an hour, 50 and 40 minutes; ids[3]: a lease that expired 30
	// minutes ago; the other 8: first attempts, due since they were stored (now).
	for i, ago := range []int{60, 50, 40} {
		if _, err := e.pool.Exec(ctx, `UPDATE delivery_queue SET attempts = 1, next_attempt_at = now() - $2 * interval '1 minute'
			WHERE event_id = $1`, ids[i], ago); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pool.Exec(ctx, `UPDATE delivery_queue SET status = 'in_flight', locked_by = 'dead',
		locked_until = now() - interval '30 minutes' WHERE event_id = $1`, ids[3]); err != nil {
		t.Fatal(err)
	}
	late := map[uuid.UUID]bool{ids[0]: true, ids[1]: true, ids[2]: true, ids[3]: true}

	d := e.crashedInstance(rc) // (claims only)
	// 4 slots: the expired lease (a quarter), then the three retries, oldest due first
	took, first := claimKinds(t, d, 4, late)
	if !sameSet(took, ids[:4]) || first != 0 {
		t.Fatalf("claim of 4 took late work %v (want %v) and %d first attempts (want 0)", took, ids[:4], first)
	}
	took, first = claimKinds(t, d, 8, late)
	if len(took) != 0 || first != 8 {
		t.Fatalf("claim of 8 took %v and %d first attempts (want the 8 first attempts)", took, first)
	}

	// A retry that falls due after first attempts were stored waits for those only.
	e2 := newEnv(t)
	e2.webhook(rc.URL)
	ids = e2.events(6)
	if _, err := e2.pool.Exec(ctx, `UPDATE delivery_queue SET next_attempt_at = now() - interval '10 minutes' WHERE event_id = ANY($1)`, ids[1:4]); err != nil {
		t.Fatal(err)
	}
	if _, err := e2.pool.Exec(ctx, `UPDATE delivery_queue SET attempts = 2, next_attempt_at = now() - interval '5 minutes' WHERE event_id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	d = e2.crashedInstance(rc)
	took, first = claimKinds(t, d, 4, map[uuid.UUID]bool{ids[0]: true})
	if len(took) != 1 || first != 3 {
		t.Fatalf("claim of 4 took the retry %d times and %d first attempts; want the 3 due before it and the retry", len(took), first)
	}
}

func sameSet(a, b []uuid.UUID) bool {
	if len(a) != len(b) {
		return false
	}
	in := map[uuid.UUID]bool{}
	for _, x := range a {
		in[x] = true
	}
	for _, x := range b {
		if !in[x] {
			return false
		}
	}
	return len(in) == len(b)
}
