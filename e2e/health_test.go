package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/dispatcher"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestFailingReceiverHeldNotBurned: a receiver down for 10 minutes under load, on the queue's
// time. It answers 503 while 200 events arrive, 5 every 15 s (the test ages the queue by 15 s
// between posts, each time once the dispatcher has done what fell due), with failure_threshold
// 3 and probes doubling from 50 ms to the default longest gap, 5 min (reached within the 10
// minutes). The webhook becomes failing (the API shows health "failing" and failing_since), the
// attempts against the receiver while down are bounded by the threshold, the attempts in flight
// and the probe schedule, no event fails for good (retry_delays allow 4 attempts: an event
// attempted at every step would have failed for good within 3 steps), and once the receiver is
// up every event is delivered after the next probe, the webhook ok again, the changes counted in
// the metrics. Then the receiver goes down again and, while its deliveries are held, the
// instance is killed (SIGKILL) and another started on the same database: the held deliveries
// and the health survive, and all are delivered once the receiver is back and the killed
// instance's leases have passed.
func TestFailingReceiverHeldNotBurned(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	rc := testenv.NewDownReceiver(t)
	const threshold, perWebhook = 3, 4
	// The probe gap doubles from 50 ms to the default longest, 5 min: past its first few doublings
	// it is minutes of the queue's time, which pass as the test ages the queue. (The dispatcher
	// looks for due probes every half the first gap, at most every second: this short first gap
	// has a probe that an ageing made due go out at once, instead of up to a second later.)
	const first, longest = 50 * time.Millisecond, dispatcher.DefaultProbeIntervalMax
	const step, steps = 15 * time.Second, 40 // (the queue's time between posts)
	const lease = time.Hour                  // (ends only when the test ages the queue)
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n retry_delays %s %s %s\n timeout 2s\n lease %s\n per_webhook %d\n"+
		" failure_threshold %d\n probe_interval %s %s\n disable_after 24h\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, step, step, step, lease, perWebhook, threshold, first, longest, testenv.CAFile(t, rc.Certificate()))
	site := "handle /webhooks/upstream {\n wabarelay_inbound\n}\nhandle_path /v1/* {\n wabarelay_api\n}"
	origin := e.caddyWith("", appExtra, site)

	e.channelOn(true, pnid)
	wh, secret := e.fix.Webhook(t, e.org, rc.URL+"/hook", &testenv.WebhookOpts{Name: "r"})
	rc.Verify(secret)
	_, key := e.fix.APIKey(t, e.org)
	webhook := func() map[string]any {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, origin+"/v1/webhooks/"+wh.ID.String(), nil)
		req.Header.Set("X-Api-Key", key)
		r := do(t, req)
		var out map[string]any
		if r.status != 200 || json.Unmarshal(r.body, &out) != nil {
			t.Fatalf("GET webhook: %d %s", r.status, r.body)
		}
		return out
	}
	if w := webhook(); w["health"] != "ok" || w["failing_since"] != nil || w["paused_reason"] != nil {
		t.Fatalf("new webhook: %v", w)
	}

	seq := 0
	post := func(n int) {
		t.Helper()
		ids := make([]string, n)
		for i := range ids {
			seq++
			ids[i] = fmt.Sprint("h", seq)
		}
		if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, upstreamBatch(map[string][2][]string{pnid: {ids, nil}})); status != 200 {
			t.Fatalf("inbound: %d %s", status, body)
		}
	}
	// settled: the dispatcher has done what is due for the webhook at the queue's time — no
	// attempt in flight, and nothing due that a claim takes (its deliveries while it is ok, its
	// probe while it is failing)
	settled := func() {
		t.Helper()
		testenv.Eventually(t, testenv.Patience, func() bool {
			return e.countRows(`
				SELECT count(*) FROM webhooks w WHERE w.id = $1
				AND NOT EXISTS (SELECT 1 FROM delivery_queue q WHERE q.webhook_id = w.id AND q.status = 'in_flight')
				AND (w.failing_since IS NOT NULL AND w.next_probe_at > now()
				     OR NOT EXISTS (SELECT 1 FROM delivery_queue q WHERE q.webhook_id = w.id AND q.status = 'pending' AND q.next_attempt_at <= now()))`,
				wh.ID) == 1
		}, "the dispatcher to do what is due for the webhook")
	}
	// the load while the receiver is down: 5 events, then 15 s of the queue's time, 40 times
	for range steps {
		post(5)
		settled()
		e.fix.AgeQueue(t, step)
	}
	settled()
	w := webhook()
	if w["health"] != "failing" || w["failing_since"] == nil || w["status"] != "active" || w["paused_reason"] != nil {
		t.Fatalf("webhook after %v down: %v", steps*step, w)
	}
	since, err := time.Parse(time.RFC3339, w["failing_since"].(string))
	if err != nil {
		t.Fatal(err)
	}
	attempts := rc.WhileDown()
	failing := time.Since(since) // (failing_since aged with the queue)
	bound := dispatcher.AttemptsWhileDown(threshold, perWebhook, first, longest, failing)
	t.Logf("receiver down %v of the queue's time (%d events): %d attempts against it; bound %d = threshold %d + 2 × per_webhook %d + probes of the schedule %v doubling to %v over %v failing",
		steps*step, seq, attempts, bound, threshold, perWebhook, first, longest, failing.Round(time.Second))
	if attempts > int64(bound) {
		t.Errorf("%d attempts while down, the probe schedule allows %d", attempts, bound)
	}
	if n := e.countRows("SELECT count(*) FROM deliveries WHERE status = 'failed'"); n != 0 {
		t.Fatalf("%d deliveries failed for good while the receiver was down", n)
	}

	// up: the next probe (at most the longest interval away) succeeds and the held events flow
	rc.SetDown(false)
	e.fix.AgeQueue(t, longest)
	took := testenv.Eventually(t, time.Minute, func() bool { return len(rc.PerEvent()) == seq }, "every event delivered after the receiver came back")
	t.Logf("receiver up: all %d events delivered in %v", seq, took)
	testenv.Eventually(t, 30*time.Second, func() bool { return e.undelivered() == 0 }, "every delivery delivered")
	if w := webhook(); w["health"] != "ok" || w["failing_since"] != nil {
		t.Fatalf("webhook after recovery: %v", w)
	}
	m := string(call(t, "GET", origin+"/metrics", "", "").body)
	for _, want := range []string{`caddy_wabarelay_webhook_health_changes_total{change="failing"} 1`,
		`caddy_wabarelay_webhook_health_changes_total{change="recovered"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// down again; the held deliveries and the health survive a SIGKILL
	rc.SetDown(true)
	before := seq
	post(5)
	testenv.Eventually(t, 30*time.Second, func() bool { return webhook()["health"] == "failing" }, "failing again")
	post(20)
	e.caddies[origin].Kill()
	t.Logf("killed with %d deliveries in flight", e.inFlight())
	origin = e.caddyWith("", appExtra, site)
	if w := webhook(); w["health"] != "failing" {
		t.Fatalf("health after the restart: %v", w)
	}
	if n := e.countRows("SELECT count(*) FROM deliveries WHERE status = 'failed'"); n != 0 {
		t.Fatalf("%d deliveries failed for good", n)
	}
	// up, and the killed instance's leases pass (its next probe, at most a lease ahead, falls due)
	rc.SetDown(false)
	e.fix.AgeQueue(t, lease)
	testenv.Eventually(t, time.Minute, func() bool { return len(rc.PerEvent()) == seq }, "the %d held events delivered after the restart", seq-before)
	testenv.Eventually(t, 30*time.Second, func() bool { return e.undelivered() == 0 }, "every delivery delivered")
}
