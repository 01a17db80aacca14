package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestEventsEndToEnd: upstream batch → inbound handler → dispatcher → HTTPS receiver, signed; then the
// Caddy process is killed with SIGKILL mid-load and, once the leases of its attempts have
// passed (the queue aged by the lease), another started: every event is delivered at least once
// (the ledger shows none lost).
func TestEventsEndToEnd(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	var delay atomic.Int64
	rc := slowReceiver(t, &delay)
	const lease = time.Hour // (ends only when the test ages the queue)
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n retry_delays 200ms 200ms 200ms\n timeout 2s\n lease %s\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, lease, testenv.CAFile(t, rc.Certificate()))
	site := "handle /webhooks/upstream {\n wabarelay_inbound\n}"
	origin := e.caddyWith("", appExtra, site)

	e.channelOn(true, pnid)
	_, secret := e.fix.Webhook(t, e.org, rc.URL+"/hook", &testenv.WebhookOpts{Name: "r", Events: []string{"messages", "message_status"}})
	rc.Verify(secret) // every delivery's signatures, or the test fails
	delivered := func() int { return len(rc.PerEvent()) }

	post := func(origin string, msgs, sts []string) {
		t.Helper()
		if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, upstreamBatch(map[string][2][]string{pnid: {msgs, sts}})); status != 200 {
			t.Fatalf("inbound: %d %s", status, body)
		}
	}
	post(origin, []string{"a1", "a2", "a3"}, []string{"a1", "a2"})
	testenv.Eventually(t, 30*time.Second, func() bool { return delivered() == 5 }, "the first batch delivered")

	// crash mid-load: a slow receiver keeps attempts in flight, then SIGKILL
	delay.Store(int64(300 * time.Millisecond))
	const batches = 20
	for i := 0; i < batches; i++ {
		post(origin, []string{fmt.Sprint("c", i)}, nil)
	}
	// kill once attempts of the new batches are in flight (the receiver holds each 300 ms)
	testenv.Eventually(t, 30*time.Second, func() bool { return delivered() > 5 }, "an attempt of the new batches")
	e.caddies[origin].Kill()
	t.Logf("killed with %d of %d events delivered, %d deliveries in flight", delivered(), 5+batches, e.inFlight())
	delay.Store(0)
	e.fix.AgeQueue(t, lease)
	origin2 := e.caddyWith("", appExtra, site)
	took := testenv.Eventually(t, time.Minute, func() bool { return delivered() == 5+batches }, "every event delivered")
	distinct, total := delivered(), rc.Count()
	t.Logf("after restart: %d distinct events delivered (%d deliveries, %d duplicates) in %v; lost 0", distinct, total, total-distinct, took)
	testenv.Eventually(t, 30*time.Second, func() bool { return e.undelivered() == 0 }, "every delivery delivered")
	// metrics of the second instance: attempts by outcome, and the queue drained
	m := call(t, "GET", origin2+"/metrics", "", "")
	for _, want := range []string{`caddy_wabarelay_delivery_attempts_total{outcome="delivered"}`, "caddy_wabarelay_delivery_queue_depth 0",
		"caddy_wabarelay_delivery_oldest_due_seconds 0"} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestOverloadInboundAnswersEveryPost: a burst of posts far beyond what one inbound slot and a slow
// receiver can take at once (pool_max_conns 2: one inbound transaction at a time; per_webhook 2,
// the receiver holding each attempt 20 ms) is answered 200 post by post — waiting posts queue for
// the inbound handler, none is refused — and every event is then delivered exactly once, the backlog
// draining from the queue.
func TestOverloadInboundAnswersEveryPost(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	var delay atomic.Int64
	delay.Store(int64(20 * time.Millisecond))
	rc := slowReceiver(t, &delay)
	sep := "?"
	if strings.Contains(e.dsn, "?") {
		sep = "&"
	}
	e.dsn += sep + "pool_max_conns=2"
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n per_webhook 2\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, testenv.CAFile(t, rc.Certificate()))
	origin := e.caddyWith("", appExtra, "handle /webhooks/upstream {\n wabarelay_inbound\n}")
	e.channelOn(true, pnid)
	_, secret := e.fix.Webhook(t, e.org, rc.URL+"/hook", &testenv.WebhookOpts{Name: "r"})
	rc.Verify(secret)

	const posts, perPost = 40, 10
	statuses := make([]int, posts)
	var wg sync.WaitGroup
	for p := range posts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ids []string
			for i := range perPost {
				ids = append(ids, fmt.Sprintf("o%d-%d", p, i))
			}
			body := upstreamBatch(map[string][2][]string{pnid: {ids, nil}})
			resp, err := http.DefaultClient.Do(signedRequest(origin+"/webhooks/upstream", testAppSecret, body))
			if err != nil {
				return // status 0: reported below
			}
			_, _ = io.Copy(io.Discard, resp.Body) // the status is the answer; drained for the connection's reuse
			resp.Body.Close()
			statuses[p] = resp.StatusCode
		}()
	}
	wg.Wait()
	for p, st := range statuses {
		if st != http.StatusOK {
			t.Fatalf("post %d answered %d, want 200 (statuses %v)", p, st, statuses)
		}
	}
	testenv.Eventually(t, 2*time.Minute, func() bool { return len(rc.PerEvent()) == posts*perPost }, "every event delivered")
	testenv.Eventually(t, 30*time.Second, func() bool { return e.count("delivery_queue") == 0 }, "the queue drained")
	if distinct, total := len(rc.PerEvent()), rc.Count(); distinct != posts*perPost || total != distinct {
		t.Fatalf("%d distinct events delivered in %d deliveries, want %d once each", distinct, total, posts*perPost)
	}
}
