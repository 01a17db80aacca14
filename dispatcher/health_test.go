package dispatcher

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// switchable is a receiver that answers 503 while down and 200 once up; it counts what it got
// while down.
type switchable struct {
	*testenv.Receiver
	down      atomic.Bool
	whileDown atomic.Int64
}

func newSwitchable(t *testing.T) *switchable {
	s := &switchable{}
	s.down.Store(true)
	s.Receiver = testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(n int, w http.ResponseWriter, r *http.Request) {
		if s.down.Load() {
			s.whileDown.Add(1)
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok"))
	}})
	return s
}

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

// probeBound is the most probes a schedule starting at first, doubling to most, can make within
// elapsed of failing's start (one more for a probe under way at the edge).
func probeBound(first, most, elapsed time.Duration) int {
	n, at, gap := 1, first, first
	for at <= elapsed {
		n++
		gap = min(2*gap, most)
		at += gap
	}
	return n
}

// TestFailingWebhookHeldAndProbed: a receiver that answers 503 makes its webhook failing after
// FailureThreshold attempts; from then on only probes reach it, at most as many as the probe
// schedule allows, and no delivery fails for good, however many attempts the retry schedule
// would have allowed; once it answers 2xx, the first probe ends failing and every held delivery
// arrives, delivered.
func TestFailingWebhookHeldAndProbed(t *testing.T) {
	e := newEnv(t)
	rc := newSwitchable(t)
	wid, _ := e.webhook(rc.URL)
	obs := &healthObs{}
	cfg := e.config(rc.Receiver)
	cfg.FailureThreshold, cfg.ProbeInterval, cfg.ProbeIntervalMax = 3, 100*time.Millisecond, 400*time.Millisecond
	cfg.PerWebhook, cfg.Observer = 2, obs
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
	before := rc.whileDown.Load()
	// more events while it is failing: held with the others
	ids = append(ids, e.events(10)...)
	testenv.Eventually(t, patience, func() bool { return rc.whileDown.Load() >= before+5 }, "5 probes")
	down, elapsed := rc.whileDown.Load(), time.Since(since)
	rc.down.Store(false)
	probes := int(down - before)
	bound := probeBound(cfg.ProbeInterval, cfg.ProbeIntervalMax, elapsed)
	t.Logf("down: %d attempts before failing (threshold %d, %d in flight at most), %d probes in %v while failing (schedule allows %d)",
		before, cfg.FailureThreshold, cfg.PerWebhook, probes, elapsed.Round(time.Millisecond), bound)
	if before > int64(cfg.FailureThreshold+cfg.PerWebhook) {
		t.Errorf("%d attempts before failing, want at most threshold + per_webhook = %d", before, cfg.FailureThreshold+cfg.PerWebhook)
	}
	if probes > bound+cfg.PerWebhook { // (attempts in flight when it became failing end after it)
		t.Errorf("%d attempts while failing for %v, the schedule allows %d", probes, elapsed, bound)
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
	e := newEnv(t)
	rc := newSwitchable(t)
	wid, _ := e.webhook(rc.URL)
	obs := &healthObs{}
	cfg := e.config(rc.Receiver)
	cfg.FailureThreshold, cfg.ProbeInterval, cfg.ProbeIntervalMax = 2, 50*time.Millisecond, 100*time.Millisecond
	cfg.DisableAfter, cfg.Observer = 300*time.Millisecond, obs
	ids := e.events(5)
	e.run(cfg)
	var w store.Webhook
	testenv.Eventually(t, patience, func() bool {
		var err error
		w, err = e.st.GetWebhook(context.Background(), e.org, wid)
		return err == nil && w.Status == store.WebhookPaused
	}, "webhook paused")
	if w.PausedReason == nil || *w.PausedReason != store.PausedFailing || w.Health.State() != store.HealthFailing || obs.count(HealthPaused) != 1 {
		t.Fatalf("auto-paused webhook: %+v (changes %v)", w, obs.n)
	}
	if n := testenv.QueryValue[int](t, e.fix, `SELECT count(*) FROM deliveries WHERE status = 'failed'`); n != 0 {
		t.Fatalf("%d deliveries failed for good", n)
	}
	rc.down.Store(false)
	w, err := e.st.SetWebhookStatus(context.Background(), e.org, wid, store.WebhookActive)
	if err != nil || w.PausedReason != nil || w.Health.State() != store.HealthOK {
		t.Fatalf("resumed: %+v %v", w, err)
	}
	for _, id := range ids {
		testenv.Eventually(t, patience, e.statusIs(id, "delivered"), "event %s delivered", id)
	}
}
