package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestReplayThroughCaddy: events arrive from the upstream and are delivered to a webhook; then
// a new webhook is created through the API, and a replay since before the events delivers each
// of them exactly once to it, signed with its secret and with webhook-id the event's id, and
// nothing to the other webhooks. Then the replayed deliveries survive a SIGKILL of the instance
// mid-flight: a replay to a slow receiver (two attempts at a time), Caddy killed once its first
// attempt is in flight; once their leases have passed (the queue aged by the lease), another
// Caddy started on the database delivers every event.
func TestReplayThroughCaddy(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	var delay atomic.Int64
	rcOld, rcNew, rcOther, rcKill := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true}), testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true}),
		testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true}), slowReceiver(t, &delay)
	const lease = time.Hour // (ends only when the test ages the queue)
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n per_webhook 2\n retry_delays 200ms 200ms 200ms\n timeout 2s\n lease %s\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, lease, testenv.CAFile(t, rcOld.Certificate(), rcNew.Certificate(), rcOther.Certificate(), rcKill.Certificate()))
	site := "handle /webhooks/upstream {\n wabarelay_inbound\n}\nhandle_path /v1/* {\n wabarelay_api\n}"
	origin := e.caddyWith("", appExtra, site)
	_, key := e.fix.APIKey(t, e.org)

	e.channelOn(true, pnid)
	_, oldSecret := e.fix.Webhook(t, e.org, rcOld.URL+"/old", &testenv.WebhookOpts{Name: "old", Events: []string{"messages", "message_status"}})
	rcOld.Verify(oldSecret)
	since := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	const msgs = 20
	var ids []string
	for i := range msgs {
		ids = append(ids, fmt.Sprint("r", i))
	}
	if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret,
		upstreamBatch(map[string][2][]string{pnid: {ids, []string{"r0", "r1"}}})); status != 200 {
		t.Fatalf("inbound: %d %s", status, body)
	}
	const events = msgs + 2
	testenv.Eventually(t, time.Minute, func() bool { return len(rcOld.PerEvent()) == events }, "the events delivered to the first webhook")

	// new webhooks, created through the API after the events arrived
	create := func(name, url string) (id, secret string) {
		t.Helper()
		r := apiCall(t, "POST", origin+"/v1/webhooks", key, fmt.Sprintf(`{"name":%q,"url":%q,"events":["messages","message_status"]}`, name, url))
		var wh struct {
			ID         string `json:"id"`
			HMACSecret string `json:"hmac_secret"`
		}
		if r.status != 201 || json.Unmarshal(r.body, &wh) != nil {
			t.Fatalf("create webhook: %d %s", r.status, r.body)
		}
		return wh.ID, wh.HMACSecret
	}
	newID, newSecret := create("new", rcNew.URL+"/new")
	rcNew.Verify(newSecret)
	_, otherSecret := create("other", rcOther.URL+"/other")
	rcOther.Verify(otherSecret)

	replay := func(webhook string) {
		t.Helper()
		r := apiCall(t, "POST", origin+"/v1/webhooks/"+webhook+"/replay", key, fmt.Sprintf(`{"since":%q}`, since))
		if r.status != 202 || strings.TrimSpace(string(r.body)) != fmt.Sprintf(`{"queued":%d}`, events) {
			t.Fatalf("replay: %d %s", r.status, r.body)
		}
	}
	replay(newID)
	testenv.Eventually(t, time.Minute, func() bool { return len(rcNew.PerEvent()) == events }, "the replayed events delivered")
	testenv.Eventually(t, 30*time.Second, func() bool { return e.undelivered() == 0 }, "every delivery finished")
	perNew, perOld := rcNew.PerEvent(), rcOld.PerEvent()
	for id, n := range perNew {
		if n != 1 || perOld[id] != 1 {
			t.Errorf("event %s: %d replayed deliveries, %d original ones; want 1 and 1", id, n, perOld[id])
		}
		if e.countWhere("events", "id::text", id) != 1 {
			t.Errorf("webhook-id %s is no stored event's id", id)
		}
	}
	if n := rcNew.Count(); n != events {
		t.Errorf("%d deliveries to the new webhook, want %d", n, events)
	}
	if n, m := rcOther.Count(), rcOld.Count(); n != 0 || m != events {
		t.Errorf("deliveries to the other webhook %d (want 0), to the first %d (want %d)", n, m, events)
	}

	// SIGKILL mid-flight: the replayed deliveries are queue rows, and the next instance sends them
	killID, killSecret := create("kill", rcKill.URL+"/kill")
	rcKill.Verify(killSecret)
	delay.Store(int64(300 * time.Millisecond))
	replay(killID)
	testenv.Eventually(t, 30*time.Second, func() bool { return rcKill.Count() > 0 }, "an attempt of the replay in flight")
	e.caddies[origin].Kill()
	t.Logf("killed with %d of %d replayed events delivered, %d in flight", len(rcKill.PerEvent()), events, e.inFlight())
	delay.Store(0)
	e.fix.AgeQueue(t, lease)
	e.caddyWith("", appExtra, site)
	testenv.Eventually(t, time.Minute, func() bool { return len(rcKill.PerEvent()) == events }, "every replayed event delivered after the restart")
	testenv.Eventually(t, 30*time.Second, func() bool { return e.undelivered() == 0 }, "every delivery finished")
	t.Logf("after restart: %d distinct events in %d deliveries; lost 0", len(rcKill.PerEvent()), rcKill.Count())
	if n := rcOther.Count(); n != 0 {
		t.Errorf("%d deliveries to the other webhook", n)
	}
}
