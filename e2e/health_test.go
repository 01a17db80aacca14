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

// TestFailingReceiverHeldNotBurned is issue 19's "receiver down for 5 minutes under 50 events/s",
// scaled down: the receiver is down (503) for 4 s under 50 events/s (200 events), with
// failure_threshold 3 and probe_interval 200ms 800ms standing in for 10 and 30s 5m (the same
// schedule 150 times faster, so 4 s cover what 10 minutes would: the interval reaches its
// longest). The webhook becomes failing (the API shows health "failing" and failing_since), the
// attempts against the receiver while down are bounded by the threshold, the attempts in flight
// and the probe schedule, no event fails for good (retry_delays allow 4 attempts: an event
// attempted every 100 ms would have failed for good within 300 ms), and once the receiver is up
// every event is delivered, the webhook ok again, the changes counted in the metrics. Then the
// receiver goes down again and, while its deliveries are held, the instance is killed (SIGKILL)
// and another started on the same database: the held deliveries and the health survive, and all
// are delivered once the receiver is back.
func TestFailingReceiverHeldNotBurned(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	rc := testenv.NewDownReceiver(t)
	const threshold, perWebhook = 3, 4
	first, longest := 200*time.Millisecond, 800*time.Millisecond
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n retry_delays 100ms 100ms 100ms\n timeout 2s\n lease 3s\n per_webhook %d\n"+
		" failure_threshold %d\n probe_interval %s %s\n disable_after 1h\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, perWebhook, threshold, first, longest, testenv.CAFile(t, rc.Certificate()))
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
	// the load: 5 events every 100 ms (50 events/s) for 4 s, while the receiver is down
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	for range 40 {
		post(5)
		<-tick.C // (the load's pace, not a wait for a result)
	}
	tick.Stop()
	down := time.Since(start)
	w := webhook()
	if w["health"] != "failing" || w["failing_since"] == nil || w["status"] != "active" || w["paused_reason"] != nil {
		t.Fatalf("webhook after %v down: %v", down, w)
	}
	since, err := time.Parse(time.RFC3339, w["failing_since"].(string))
	if err != nil {
		t.Fatal(err)
	}
	attempts := rc.WhileDown()
	failing := time.Since(since)
	bound := dispatcher.AttemptsWhileDown(threshold, perWebhook, first, longest, failing)
	t.Logf("receiver down %v under 50 events/s (%d events): %d attempts against it; bound %d = threshold %d + 2 × per_webhook %d + probes of the schedule %v doubling to %v over %v failing",
		down.Round(time.Millisecond), seq, attempts, bound, threshold, perWebhook, first, longest, failing.Round(time.Millisecond))
	if attempts > int64(bound) {
		t.Errorf("%d attempts while down, the probe schedule allows %d", attempts, bound)
	}
	if n := e.countRows("SELECT count(*) FROM deliveries WHERE status = 'failed'"); n != 0 {
		t.Fatalf("%d deliveries failed for good while the receiver was down", n)
	}

	rc.SetDown(false)
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
	origin = e.caddyWith("", appExtra, site)
	if w := webhook(); w["health"] != "failing" {
		t.Fatalf("health after the restart: %v", w)
	}
	if n := e.countRows("SELECT count(*) FROM deliveries WHERE status = 'failed'"); n != 0 {
		t.Fatalf("%d deliveries failed for good", n)
	}
	rc.SetDown(false)
	testenv.Eventually(t, time.Minute, func() bool { return len(rc.PerEvent()) == seq }, "the %d held events delivered after the restart", seq-before)
	testenv.Eventually(t, 30*time.Second, func() bool { return e.undelivered() == 0 }, "every delivery delivered")
}
