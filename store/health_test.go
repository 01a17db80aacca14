package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// healthPolicy is a test policy: threshold 3, probes 100ms doubling to 300ms, a long
// disable_after (tests that pause move failing_since back instead).
var healthPolicy = store.HealthPolicy{Threshold: 3, ProbeInterval: 100 * time.Millisecond,
	ProbeIntervalMax: 300 * time.Millisecond, DisableAfter: time.Hour}

// clockedQueue returns the fixture's queue deciding by a stubbed clock, and the clock.
func clockedQueue(f *testenv.Fixture) (*store.Queue, *clock.Stub) {
	clk := clock.NewStub(time.Now())
	return store.NewQueue(f.Pool).WithClock(clk), clk
}

func recordHealth(t *testing.T, q *store.Queue, outs ...store.HealthOutcome) map[uuid.UUID]store.HealthState {
	t.Helper()
	states, err := q.RecordHealth(context.Background(), healthPolicy, outs)
	if err != nil {
		t.Fatal(err)
	}
	m := map[uuid.UUID]store.HealthState{}
	for _, s := range states {
		m[s.WebhookID] = s
	}
	return m
}

func webhookHealth(t *testing.T, f *testenv.Fixture, org, id uuid.UUID) store.Webhook {
	t.Helper()
	w, err := f.Store.GetWebhook(context.Background(), org, id)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestHealthFailingAtThreshold: failures below the threshold only count; the one that reaches
// it makes the webhook failing then (by the queue's clock), its first probe one interval ahead;
// a 2xx makes it ok again and resets the count. Successes of a healthy webhook write nothing.
func TestHealthFailingAtThreshold(t *testing.T) {
	f := testenv.NewStore(t)
	org := f.Org(t)
	w, _ := f.Webhook(t, org.ID, "https://a.example.com")
	q, clk := clockedQueue(f)

	if got := recordHealth(t, q, store.HealthOutcome{WebhookID: w.ID, Delivered: true}); len(got) != 0 {
		t.Fatalf("a healthy webhook's success changed its row: %+v", got)
	}
	s := recordHealth(t, q, store.HealthOutcome{WebhookID: w.ID, Failures: 2})[w.ID]
	if s.ConsecutiveFailures != 2 || s.Failing || len(s.Changes) != 0 {
		t.Fatalf("after 2 failures: %+v", s)
	}
	if h := webhookHealth(t, f, org.ID, w.ID).Health; h.State() != store.HealthOK || h.ConsecutiveFailures != 2 {
		t.Fatalf("webhook after 2 failures: %+v", h)
	}
	became := clk.Advance(time.Minute)
	s = recordHealth(t, q, store.HealthOutcome{WebhookID: w.ID, Failures: 1})[w.ID]
	if !s.Failing || len(s.Changes) != 1 || s.Changes[0] != store.HealthBecameFailing || s.ConsecutiveFailures != 3 {
		t.Fatalf("at the threshold: %+v", s)
	}
	wh := webhookHealth(t, f, org.ID, w.ID)
	h := wh.Health
	if h.State() != store.HealthFailing || h.FailingSince == nil || h.NextProbeAt == nil || h.ProbeInterval != 100*time.Millisecond {
		t.Fatalf("failing webhook: %+v", h)
	}
	if !h.FailingSince.Equal(became) || !h.NextProbeAt.Equal(became.Add(100*time.Millisecond)) {
		t.Fatalf("failing since %v, first probe at %v; want since %v and 100ms later", h.FailingSince, h.NextProbeAt, became)
	}
	if wh.Status != store.WebhookActive || wh.PausedReason != nil {
		t.Fatalf("failing webhook: %+v", wh)
	}

	// more failures (attempts that were in flight) do not move the probe schedule
	clk.Advance(time.Second)
	s = recordHealth(t, q, store.HealthOutcome{WebhookID: w.ID, Failures: 5})[w.ID]
	if len(s.Changes) != 0 || !s.NextProbeAt.Equal(*h.NextProbeAt) || s.ConsecutiveFailures != 8 {
		t.Fatalf("failures while failing: %+v", s)
	}
	// a 2xx, then one failure: ok again, the count restarted
	s = recordHealth(t, q, store.HealthOutcome{WebhookID: w.ID, Delivered: true, Failures: 1})[w.ID]
	if s.Failing || len(s.Changes) != 1 || s.Changes[0] != store.HealthRecovered || s.ConsecutiveFailures != 1 {
		t.Fatalf("after a 2xx: %+v", s)
	}
	if h := webhookHealth(t, f, org.ID, w.ID).Health; h.State() != store.HealthOK || h.NextProbeAt != nil || h.ProbeInterval != 0 {
		t.Fatalf("recovered webhook: %+v", h)
	}
}

// TestHealthProbeBackoff: each failed probe doubles the interval up to the longest and
// schedules the next probe that far after its outcome (by the queue's clock).
func TestHealthProbeBackoff(t *testing.T) {
	f := testenv.NewStore(t)
	org := f.Org(t)
	w, _ := f.Webhook(t, org.ID, "https://a.example.com")
	q, clk := clockedQueue(f)
	recordHealth(t, q, store.HealthOutcome{WebhookID: w.ID, Failures: 3})
	for _, want := range []time.Duration{200 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond} {
		at := clk.Advance(time.Second)
		s := recordHealth(t, q, store.HealthOutcome{WebhookID: w.ID, Failures: 1, ProbeFailed: true})[w.ID]
		if s.ProbeInterval != want || !s.Failing {
			t.Fatalf("after a failed probe: interval %v, want %v (%+v)", s.ProbeInterval, want, s)
		}
		if next := webhookHealth(t, f, org.ID, w.ID).Health.NextProbeAt; next == nil || !next.Equal(at.Add(want)) {
			t.Fatalf("next probe at %v, want %v after the probe's outcome (%v)", next, want, at)
		}
	}
}

// TestHealthDisableAfterPauses: a webhook still failing disable_after after it began (by the
// queue's clock) is paused with paused_reason "failing" and its pending deliveries held, and not
// a moment before; resuming it makes it active and ok again, paused_reason null, the
// deliveries pending.
func TestHealthDisableAfterPauses(t *testing.T) {
	ctx := context.Background()
	f := testenv.NewStore(t)
	org := f.Org(t)
	w, _ := f.Webhook(t, org.ID, "https://a.example.com")
	q, clk := clockedQueue(f)
	queueDue(t, f.Pool, org.ID, w.ID, 4, "pending")
	recordHealth(t, q, store.HealthOutcome{WebhookID: w.ID, Failures: 3})

	clk.Advance(healthPolicy.DisableAfter - time.Microsecond)
	if s := recordHealth(t, q, store.HealthOutcome{WebhookID: w.ID, Failures: 1, ProbeFailed: true})[w.ID]; len(s.Changes) != 0 || !s.Failing {
		t.Fatalf("failing a microsecond short of disable_after: %+v", s)
	}
	clk.Advance(time.Microsecond)
	s := recordHealth(t, q, store.HealthOutcome{WebhookID: w.ID, Failures: 1, ProbeFailed: true})[w.ID]
	if len(s.Changes) != 1 || s.Changes[0] != store.HealthPaused || !s.Failing {
		t.Fatalf("failing past disable_after: %+v", s)
	}
	wh := webhookHealth(t, f, org.ID, w.ID)
	if wh.Status != store.WebhookPaused || wh.PausedReason == nil || *wh.PausedReason != store.PausedFailing || wh.Health.State() != store.HealthFailing {
		t.Fatalf("auto-paused webhook: %+v", wh)
	}
	if at := testenv.QueryValue[time.Time](t, f, `SELECT updated_at FROM webhooks WHERE id = $1`, w.ID); !at.Equal(clk.Now()) {
		t.Fatalf("paused at %v, want %v", at, clk.Now())
	}
	if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM delivery_queue WHERE webhook_id = $1 AND status = 'held'`, w.ID); n != 4 {
		t.Fatalf("held deliveries: %d, want 4", n)
	}
	// a paused webhook's late outcomes do not pause it again
	if s := recordHealth(t, q, store.HealthOutcome{WebhookID: w.ID, Failures: 1})[w.ID]; len(s.Changes) != 0 {
		t.Fatalf("outcome of a paused webhook: %+v", s)
	}

	wh, err := f.Store.SetWebhookStatus(ctx, org.ID, w.ID, store.WebhookActive)
	if err != nil {
		t.Fatal(err)
	}
	if wh.Status != store.WebhookActive || wh.PausedReason != nil || wh.Health.State() != store.HealthOK ||
		wh.Health.ConsecutiveFailures != 0 || wh.Health.NextProbeAt != nil {
		t.Fatalf("resumed webhook: %+v", wh)
	}
	if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM delivery_queue WHERE webhook_id = $1 AND status = 'pending'`, w.ID); n != 4 {
		t.Fatalf("pending deliveries after resume: %d, want 4", n)
	}
	// a pause by the owner has no paused_reason
	wh, err = f.Store.SetWebhookStatus(ctx, org.ID, w.ID, store.WebhookPaused)
	if err != nil || wh.PausedReason != nil {
		t.Fatalf("paused by its owner: %+v %v", wh, err)
	}
}

// TestClaimHoldsFailingWebhook: a failing webhook's deliveries are not claimed, expired leases
// included; ClaimProbes takes one — the oldest due — once its probe is due by the queue's clock,
// and no other until the probe's outcome is recorded (its next probe moved a lease ahead). A
// healthy webhook beside it is claimed as usual.
func TestClaimHoldsFailingWebhook(t *testing.T) {
	ctx := context.Background()
	f := testenv.NewStore(t)
	org := f.Org(t)
	bad, _ := f.Webhook(t, org.ID, "https://bad.example.com", &testenv.WebhookOpts{Name: "bad"})
	good, _ := f.Webhook(t, org.ID, "https://good.example.com", &testenv.WebhookOpts{Name: "good"})
	q, clk := clockedQueue(f)
	queueDue(t, f.Pool, org.ID, bad.ID, 5, "pending")
	queueDue(t, f.Pool, org.ID, good.ID, 2, "pending")
	clk.Advance(time.Minute) // (queueDue's rows are due by the database's clock)
	oldest := testenv.QueryValue[uuid.UUID](t, f, `UPDATE delivery_queue SET next_attempt_at = $2::timestamptz - interval '1 hour'
		WHERE delivery_id = (SELECT delivery_id FROM delivery_queue WHERE webhook_id = $1 LIMIT 1) RETURNING delivery_id`, bad.ID, clk.Now())
	recordHealth(t, q, store.HealthOutcome{WebhookID: bad.ID, Failures: 3}) // its first probe 100ms ahead
	// a lease of the failing webhook that expired is not reclaimed by Claim either
	f.Exec(t, `UPDATE delivery_queue SET status = 'in_flight', locked_by = 'gone', locked_until = $3::timestamptz - interval '1 second'
		WHERE delivery_id = (SELECT delivery_id FROM delivery_queue WHERE webhook_id = $1 AND delivery_id <> $2 LIMIT 1)`, bad.ID, oldest, clk.Now())

	c, err := q.Claim(ctx, store.QueueClaim{Instance: "i", Lease: time.Minute, Limit: 100, PerWebhook: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range c.Deliveries {
		if d.WebhookID == bad.ID {
			t.Fatalf("claim took a delivery of the failing webhook: %+v", d)
		}
	}
	if len(c.Deliveries) != 2 {
		t.Fatalf("claimed %d, want the healthy webhook's 2", len(c.Deliveries))
	}
	clk.Advance(100*time.Millisecond - time.Microsecond)
	if p, err := q.ClaimProbes(ctx, "i", time.Minute, 10); err != nil || len(p) != 0 {
		t.Fatalf("probe claimed before it was due: %v %v", p, err)
	}
	clk.Advance(time.Microsecond)
	p, err := q.ClaimProbes(ctx, "i", time.Minute, 10)
	if err != nil || len(p) != 1 || !p[0].Probe || p[0].WebhookID != bad.ID || p[0].Payload == nil {
		t.Fatalf("probes: %+v %v", p, err)
	}
	// the expired lease comes first (its instance died mid-probe), then the oldest due
	expired := p[0].ID
	if expired == oldest {
		t.Fatalf("probe took the oldest due delivery before the expired lease")
	}
	if again, err := q.ClaimProbes(ctx, "i", time.Minute, 10); err != nil || len(again) != 0 {
		t.Fatalf("second probe while one is out: %v %v", again, err)
	}
	if until := testenv.QueryValue[time.Time](t, f, `SELECT locked_until FROM delivery_queue WHERE delivery_id = $1`, p[0].ID); !until.Equal(clk.Now().Add(time.Minute)) {
		t.Fatalf("probe's lease ends at %v, want a minute after %v", until, clk.Now())
	}
	// a minute on, the probe's outcome never came: the probe is due again and takes over the
	// expired lease
	clk.Advance(time.Minute - time.Microsecond)
	if again, err := q.ClaimProbes(ctx, "i", time.Minute, 10); err != nil || len(again) != 0 {
		t.Fatalf("probe claimed again before the first one's lease ended: %v %v", again, err)
	}
	clk.Advance(2 * time.Microsecond)
	if p, err = q.ClaimProbes(ctx, "i", time.Minute, 10); err != nil || len(p) != 1 || p[0].ID != expired {
		t.Fatalf("probe after the first one's lease ended: %+v %v, want it again", p, err)
	}
	// its outcome: failed, due again at once with the held others; the next probe 200ms on
	code := 503
	if n, err := q.Record(ctx, "i", []store.Outcome{{Delivery: p[0], Started: clk.Now(), StatusCode: &code}}); err != nil || n != 1 {
		t.Fatalf("record the probe: %d %v", n, err)
	}
	recordHealth(t, q, store.HealthOutcome{WebhookID: bad.ID, Failures: 1, ProbeFailed: true})
	clk.Advance(200*time.Millisecond - time.Microsecond)
	if again, err := q.ClaimProbes(ctx, "i", time.Minute, 10); err != nil || len(again) != 0 {
		t.Fatalf("probe claimed before the doubled interval: %v %v", again, err)
	}
	clk.Advance(time.Microsecond)
	p, err = q.ClaimProbes(ctx, "i", time.Minute, 10)
	if err != nil || len(p) != 1 || p[0].ID != oldest {
		t.Fatalf("second probe: %+v %v, want the oldest due %s", p, err, oldest)
	}
}
