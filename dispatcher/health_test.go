package dispatcher

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// healthObs counts health changes.
type healthObs struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *healthObs) Attempt(string, time.Duration) {}
func (o *healthObs) HealthChange(c string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	o.n[c]++
}
func (o *healthObs) count(c string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[c]
}

// failingSetup is a test env with a receiver that is down, its webhook, a health observer and
// a config with the given threshold and probe schedule.
func failingSetup(t *testing.T, threshold int, first, longest time.Duration) (*env, *testenv.DownReceiver, uuid.UUID, *healthObs, Config) {
	e := newEnv(t)
	rc := testenv.NewDownReceiver(t)
	wid, _ := e.webhook(rc.URL)
	obs := &healthObs{}
	cfg := e.config(rc.Receiver)
	cfg.FailureThreshold, cfg.ProbeInterval, cfg.ProbeIntervalMax, cfg.Observer = threshold, first, longest, obs
	return e, rc, wid, obs, cfg
}

// webhookRow returns the webhook's row.
func (e *env) webhookRow(id uuid.UUID) store.Webhook {
	e.t.Helper()
	w, err := e.st.GetWebhook(context.Background(), e.org, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return w
}

// failingSince waits until the webhook is failing and returns since when: the env's clock's
// time, which stands still meanwhile.
func (e *env) failingSince(id uuid.UUID) time.Time {
	e.t.Helper()
	var since time.Time
	testenv.Eventually(e.t, patience, func() bool {
		if h := e.webhookRow(id).Health; h.FailingSince != nil {
			since = *h.FailingSince
			return true
		}
		return false
	}, "webhook failing")
	if !since.Equal(e.clk.Now()) {
		e.t.Fatalf("failing since %v, want the clock's time %v", since, e.clk.Now())
	}
	return since
}

// TestFailingWebhookHeldAndProbed: a receiver that answers 503 makes its webhook failing after
// FailureThreshold attempts; from then on only probes reach it, one each time the probe schedule
// (the product's: 30s doubling to 5m, by the clock) makes one due and none a moment before, at
// most as many as the schedule allows, and no delivery fails for good, however many attempts the
// retry schedule would have allowed; once it answers 2xx, the first probe ends failing and every
// held delivery arrives, delivered.
//
// That no probe goes out early is seen without waiting: a sentinel webhook, failing too, has its
// probe due a microsecond before each of the webhook's; the claim of probes that takes the
// sentinel's at that time would take the webhook's as well if it were due.
func TestFailingWebhookHeldAndProbed(t *testing.T) {
	e, rc, wid, obs, cfg := failingSetup(t, 3, DefaultProbeInterval, DefaultProbeIntervalMax)
	clk := e.useClock()
	cfg.Clock = clk
	cfg.PerWebhook = 2
	ids := e.events(20)
	sentinelRC := testenv.NewDownReceiver(t)
	sentinel, _ := e.fix.Webhook(t, e.org, sentinelRC.URL, &testenv.WebhookOpts{Name: "sentinel", Events: []string{"message_status"}})
	if res, err := e.st.StoreEvents(context.Background(), []store.IncomingItem{{Type: "message_status", PhoneNumberID: e.phone,
		DedupeKey: "s:sentinel", Data: json.RawMessage(`{"status":{"id":"sentinel"}}`)}}, store.Claim{}); err != nil || res.Deliveries != 1 {
		t.Fatalf("the sentinel's delivery: %+v %v", res, err)
	}
	e.fix.Exec(t, `UPDATE webhooks SET consecutive_failures = 3, failing_since = $2::timestamptz, probe_interval_ms = 3600000, next_probe_at = $2::timestamptz + interval '1 hour'
		WHERE id = $1`, sentinel.ID, clk.Now())
	core, logs := observer.New(zapcore.InfoLevel)
	e.launch(e.st.WebhookSecret, cfg, zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core())))
	logged := func(msg string, id uuid.UUID) int {
		n := 0
		for _, l := range logs.FilterMessage(msg).All() {
			if l.ContextMap()["webhook_id"] == id.String() {
				n++
			}
		}
		return n
	}
	probes := func() int { return logged("probing failing webhook", wid) } // the webhook's, not the sentinel's

	since := e.failingSince(wid)
	// more events while it is failing: held with the others
	ids = append(ids, e.events(10)...)
	// five probes, each made when the clock reaches its time and not a microsecond before, its
	// outcome doubling the gap
	for k := range 5 {
		h := e.webhookRow(wid).Health
		next, gap := *h.NextProbeAt, min(2*h.ProbeInterval, cfg.ProbeIntervalMax)
		e.fix.Exec(t, `UPDATE webhooks SET next_probe_at = $2 WHERE id = $1`, sentinel.ID, next.Add(-time.Microsecond))
		seen := sentinelRC.WhileDown()
		clk.Set(next.Add(-time.Microsecond))
		testenv.Eventually(t, patience, func() bool { return sentinelRC.WhileDown() > seen }, "the sentinel's probe %d", k+1)
		// and its outcome recorded: recorded after the next round's UPDATE, it would move the
		// sentinel's next probe an hour past the clock (a loaded machine did so, and the next
		// round waited for a probe that was never due)
		testenv.Eventually(t, patience, func() bool { return logged("probe of failing webhook failed", sentinel.ID) > k },
			"the outcome of the sentinel's probe %d", k+1)
		if n := probes(); n != k {
			t.Fatalf("%d probes a microsecond before probe %d is due, want %d", n, k+1, k)
		}
		clk.Set(next)
		testenv.Eventually(t, patience, func() bool {
			h := e.webhookRow(wid).Health
			return probes() > k && h.NextProbeAt != nil && h.NextProbeAt.Equal(next.Add(gap)) && h.ProbeInterval == gap
		}, "probe %d and its outcome, the next probe %v on", k+1, gap)
	}
	total, elapsed := rc.WhileDown(), clk.Now().Sub(since)
	rc.SetDown(false)
	bound := AttemptsWhileDown(cfg.FailureThreshold, cfg.PerWebhook, cfg.ProbeInterval, cfg.ProbeIntervalMax, elapsed)
	t.Logf("down: %d attempts, %v of them failing by the clock; bound %d (threshold %d, per_webhook %d, probes %v doubling to %v)",
		total, elapsed, bound, cfg.FailureThreshold, cfg.PerWebhook, cfg.ProbeInterval, cfg.ProbeIntervalMax)
	if total > int64(bound) {
		t.Errorf("%d attempts while down, the probe schedule allows %d", total, bound)
	}

	clk.Set(*e.webhookRow(wid).Health.NextProbeAt)
	for _, id := range ids {
		testenv.Eventually(t, patience, e.statusIs(id, "delivered"), "event %s delivered", id)
	}
	if n := testenv.QueryValue[int](t, e.fix, `SELECT count(*) FROM deliveries WHERE status = 'failed'`); n != 0 {
		t.Fatalf("%d deliveries failed for good", n)
	}
	w := e.webhookRow(wid)
	if w.Health.State() != store.HealthOK || w.Health.ConsecutiveFailures != 0 {
		t.Fatalf("webhook after recovery: %+v", w)
	}
	if obs.count(HealthFailing) != 1 || obs.count(HealthRecovered) != 1 {
		t.Fatalf("health changes observed: %v", obs.n)
	}
}

// TestFailingWebhookPausedAfterDisableAfter: a webhook failing for DisableAfter (the product's,
// by the clock) is paused with paused_reason "failing" by the outcome of its probe then, its
// deliveries held (none failed); resuming resets its health and they are delivered.
func TestFailingWebhookPausedAfterDisableAfter(t *testing.T) {
	e, rc, wid, obs, cfg := failingSetup(t, 2, DefaultProbeInterval, DefaultProbeIntervalMax)
	clk := e.useClock()
	cfg.Clock = clk
	ids := e.events(5)
	e.run(cfg)
	since := e.failingSince(wid)
	clk.Set(since.Add(DefaultDisableAfter))
	var w store.Webhook
	testenv.Eventually(t, patience, func() bool {
		w = e.webhookRow(wid)
		return w.Status == store.WebhookPaused
	}, "webhook paused")
	testenv.Eventually(t, patience, func() bool { return obs.count(HealthPaused) == 1 }, "the pause observed")
	if w.PausedReason == nil || *w.PausedReason != store.PausedFailing || w.Health.State() != store.HealthFailing {
		t.Fatalf("auto-paused webhook: %+v (changes %v)", w, obs.n)
	}
	if n := testenv.QueryValue[int](t, e.fix, `SELECT count(*) FROM deliveries WHERE status = 'failed'`); n != 0 {
		t.Fatalf("%d deliveries failed for good", n)
	}
	// (the last probe's outcome recorded first: an outcome recorded while the webhook is being
	// resumed can still see it paused and hold its delivery after the resume — a race of
	// store.Queue.Record with SetWebhookStatus that predates failing receivers)
	testenv.Eventually(t, patience, func() bool {
		return testenv.QueryValue[int](t, e.fix, `SELECT count(*) FROM delivery_queue WHERE status = 'in_flight'`) == 0
	}, "no attempt in flight")
	// This instance's own short hold of the webhook, from its last failure, passes while it is
	// paused (the hold is noted before the failure's outcome is recorded, and no attempt follows
	// while paused), and nothing is due after the clock then. Passed after the resume instead,
	// it raced the resume's claim: a claim within the hold hands the deliveries back due the rest
	// of the hold after the hand-back is written, and one written after the clock moved on was
	// due after a clock that stands still from then on.
	clk.Advance(localHold(cfg))
	if n := testenv.QueryValue[int](t, e.fix, `SELECT count(*) FROM delivery_queue WHERE webhook_id = $1 AND next_attempt_at > $2`,
		wid, clk.Now()); n != 0 {
		t.Fatalf("%d deliveries of the paused webhook due only after %v (its last failure and this instance's hold passed)", n, clk.Now())
	}
	rc.SetDown(false)
	w, err := e.st.SetWebhookStatus(context.Background(), e.org, wid, store.WebhookActive)
	if err != nil || w.PausedReason != nil || w.Health.State() != store.HealthOK {
		t.Fatalf("resumed: %+v %v", w, err)
	}
	for _, id := range ids {
		testenv.Eventually(t, patience, e.statusIs(id, "delivered"), "event %s delivered", id)
	}
}

// TestLocalHoldAtMostLocalHold: what is left of the local hold of a webhook (heldLocally) is
// never more than localHold, even by a time read before the clock jumped ahead and the hold was
// set (start reads the time once per claim, before taking the lock per delivery): a delivery
// handed back with it would otherwise be due the jump later (here DisableAfter), not within the
// hold.
func TestLocalHoldAtMostLocalHold(t *testing.T) {
	clk := clock.NewStub(time.Now())
	cfg := Config{FailureThreshold: 2, ProbeInterval: DefaultProbeInterval, Clock: clk}
	d := &Dispatcher{cfg: cfg, localFails: map[uuid.UUID]int{}, holdUntil: map[uuid.UUID]time.Time{}}
	j := job{ID: uuid.New(), WebhookID: uuid.New()}
	before := clk.Now() // (a claim's start reads the time)
	clk.Advance(DefaultDisableAfter)
	for range cfg.FailureThreshold {
		d.noteAttempt(result{job: j}) // failed attempts, the last at the threshold: held from now on
	}
	hold := localHold(cfg)
	for _, c := range []struct {
		what string
		now  time.Time
		want time.Duration
	}{
		{"by the time read before the jump", before, hold},
		{"at once", clk.Now(), hold},
		{"half the hold later", clk.Now().Add(hold / 2), hold / 2},
	} {
		if got := d.heldLocally(j, c.now); got != c.want {
			t.Errorf("held %s: %v, want %v", c.what, got, c.want)
		}
	}
	probe := j
	probe.Probe = true
	if got := d.heldLocally(probe, clk.Now()); got != 0 {
		t.Errorf("probe held %v", got)
	}
	if got := d.heldLocally(j, clk.Now().Add(hold)); got != 0 {
		t.Errorf("held %v once the hold has passed", got)
	}
}
