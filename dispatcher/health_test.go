package dispatcher

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

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

// TestFailingWebhookHeldAndProbed: a receiver that answers 503 makes its webhook failing after
// FailureThreshold attempts; from then on only probes reach it, at most as many as the probe
// schedule allows, and no delivery fails for good, however many attempts the retry schedule
// would have allowed; once it answers 2xx, the first probe ends failing and every held delivery
// arrives, delivered.
func TestFailingWebhookHeldAndProbed(t *testing.T) {
	e, rc, wid, obs, cfg := failingSetup(t, 3, 100*time.Millisecond, 400*time.Millisecond)
	cfg.PerWebhook = 2
	ids := e.events(20)
	e.run(cfg)

	var since time.Time
	testenv.Eventually(t, patience, func() bool {
		w, err := e.st.GetWebhook(context.Background(), e.org, wid)
		if err != nil || w.Health.FailingSince == nil {
			return false
		}
		since = *w.Health.FailingSince
		return true
	}, "webhook failing")
	// more events while it is failing: held with the others
	ids = append(ids, e.events(10)...)
	testenv.Eventually(t, patience, func() bool { return rc.WhileDown() >= int64(cfg.FailureThreshold+5) }, "5 probes")
	total, elapsed := rc.WhileDown(), time.Since(since)
	rc.SetDown(false)
	bound := AttemptsWhileDown(cfg.FailureThreshold, cfg.PerWebhook, cfg.ProbeInterval, cfg.ProbeIntervalMax, elapsed)
	t.Logf("down: %d attempts, %v of them failing; bound %d (threshold %d, per_webhook %d, probes %v doubling to %v)",
		total, elapsed.Round(time.Millisecond), bound, cfg.FailureThreshold, cfg.PerWebhook, cfg.ProbeInterval, cfg.ProbeIntervalMax)
	if total > int64(bound) {
		t.Errorf("%d attempts while down, the probe schedule allows %d", total, bound)
	}

	for _, id := range ids {
		testenv.Eventually(t, patience, e.statusIs(id, "delivered"), "event %s delivered", id)
	}
	if n := testenv.QueryValue[int](t, e.fix, `SELECT count(*) FROM deliveries WHERE status = 'failed'`); n != 0 {
		t.Fatalf("%d deliveries failed for good", n)
	}
	w, err := e.st.GetWebhook(context.Background(), e.org, wid)
	if err != nil || w.Health.State() != store.HealthOK || w.Health.ConsecutiveFailures != 0 {
		t.Fatalf("webhook after recovery: %+v %v", w, err)
	}
	if obs.count(HealthFailing) != 1 || obs.count(HealthRecovered) != 1 {
		t.Fatalf("health changes observed: %v", obs.n)
	}
}

// TestFailingWebhookPausedAfterDisableAfter: a webhook failing for DisableAfter is paused with
// paused_reason "failing", its deliveries held (none failed); resuming resets its health and
// they are delivered.
func TestFailingWebhookPausedAfterDisableAfter(t *testing.T) {
	e, rc, wid, obs, cfg := failingSetup(t, 2, 50*time.Millisecond, 100*time.Millisecond)
	cfg.DisableAfter = 300 * time.Millisecond
	ids := e.events(5)
	e.run(cfg)
	var w store.Webhook
	testenv.Eventually(t, patience, func() bool {
		var err error
		w, err = e.st.GetWebhook(context.Background(), e.org, wid)
		return err == nil && w.Status == store.WebhookPaused
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
	rc.SetDown(false)
	w, err := e.st.SetWebhookStatus(context.Background(), e.org, wid, store.WebhookActive)
	if err != nil || w.PausedReason != nil || w.Health.State() != store.HealthOK {
		t.Fatalf("resumed: %+v %v", w, err)
	}
	for _, id := range ids {
		testenv.Eventually(t, patience, e.statusIs(id, "delivered"), "event %s delivered", id)
	}
}
