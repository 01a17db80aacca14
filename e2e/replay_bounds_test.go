package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// TestReplayBounded: replaying the same window again queues nothing more while its
// deliveries are queued; a replay that would leave more than store.MaxReplayBacklog deliveries
// queued for the webhook is refused with 422 naming the limit, queues nothing and is counted in
// a metric, while live events still reach the webhook; deleting the webhook answers at once and
// leaves its rows to the sweep, which removes them in batches.
func TestReplayBounded(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	ctx := context.Background()
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}", testAppSecret, testVerifyToken)
	origin := e.caddyWith("", appExtra, "handle /webhooks/upstream {\n wabarelay_inbound\n}\nhandle_path /v1/* {\n wabarelay_api\n}")
	_, key := e.fix.APIKey(t, e.org)
	e.channelOn(true, pnid)
	w, _ := e.fix.Webhook(t, e.org, "https://receiver.example.com/hook", &testenv.WebhookOpts{Name: "paused"})
	if _, err := e.store.SetWebhookStatus(ctx, e.org, w.ID, store.WebhookPaused); err != nil { // its deliveries wait, held
		t.Fatal(err)
	}
	post := func(ids ...string) {
		t.Helper()
		froms := make([]string, len(ids))
		for i := range froms {
			froms[i] = fmt.Sprintf("1555000%04d", i)
		}
		if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, conversationBatch(ids, froms)); status != 200 {
			t.Fatalf("inbound: %d %s", status, body)
		}
	}
	ids := make([]string, 30)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%02d", i)
	}
	post(ids...)
	queued := func() int { return e.countRows(`SELECT count(*) FROM delivery_queue WHERE webhook_id = $1`, w.ID) }
	if n := queued(); n != 30 {
		t.Fatalf("%d deliveries queued by the intake, want 30", n)
	}
	// the live deliveries are queued: a replay of their window adds nothing, however often
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)
	window := func() relayResp {
		return apiCall(t, "POST", origin+"/v1/webhooks/"+w.ID.String()+"/replay", key, `{"since":"`+since+`"}`)
	}
	for i := range 3 {
		if r := window(); r.status != 202 || strings.TrimSpace(string(r.body)) != `{"queued":0}` {
			t.Fatalf("replay %d of a window whose deliveries are all queued: %d %s, want 202 {\"queued\":0}", i, r.status, r.body)
		}
	}
	if n := queued(); n != 30 {
		t.Fatalf("%d deliveries queued after three replays, want 30", n)
	}
	// delivered or failed ones (gone from the queue) are replayed, once
	e.fix.Exec(t, `DELETE FROM delivery_queue WHERE delivery_id IN (SELECT delivery_id FROM delivery_queue WHERE webhook_id = $1 LIMIT 10)`, w.ID)
	for i, want := range []string{`{"queued":10}`, `{"queued":0}`} {
		if r := window(); r.status != 202 || strings.TrimSpace(string(r.body)) != want {
			t.Fatalf("replay %d after 10 went out: %d %s, want %s", i, r.status, r.body, want)
		}
	}

	// the backlog limit: 15 short of it, with 20 of the events replayable (5 too many)
	e.fix.Exec(t, `
		INSERT INTO delivery_queue (delivery_id, created_at, event_id, webhook_id, status)
		SELECT gen_random_uuid(), now(), gen_random_uuid(), $1, 'held' FROM generate_series(1, $2)`, w.ID, store.MaxReplayBacklog+5-30)
	e.fix.Exec(t, `DELETE FROM delivery_queue WHERE delivery_id IN (SELECT q.delivery_id FROM delivery_queue q JOIN events e ON e.id = q.event_id
		WHERE q.webhook_id = $1 LIMIT 20)`, w.ID)
	before := queued()
	r := window()
	if r.status != 422 || r.errorMsg(t) != managementapi.MsgReplayBacklog || !strings.Contains(managementapi.MsgReplayBacklog, fmt.Sprint(store.MaxReplayBacklog)) {
		t.Fatalf("replay over the backlog limit: %d %s, want 422 %q", r.status, r.body, managementapi.MsgReplayBacklog)
	}
	if n := queued(); n != before {
		t.Fatalf("a refused replay queued %d deliveries", n-before)
	}
	if m := string(call(t, "GET", origin+"/metrics", "", "").body); !strings.Contains(m, "caddy_wabarelay_replay_backlog_refused_total 1") {
		t.Fatalf("metrics: no replay_backlog_refused_total 1")
	}
	// live events are never refused by it
	post("live1", "live2")
	if n := queued(); n != before+2 {
		t.Fatalf("live events beside a full backlog: %d queued, want %d", n, before+2)
	}

	// deleting the webhook answers without removing its ~200,000 rows in the request; the sweep does
	if r := apiCall(t, "DELETE", origin+"/v1/webhooks/"+w.ID.String(), key, ""); r.status != 204 {
		t.Fatalf("delete webhook: %d %s", r.status, r.body)
	}
	if n := queued(); n < store.MaxReplayBacklog-100 {
		t.Fatalf("the delete removed the queue in the request (%d left)", n)
	}
	if r := window(); r.status != 404 {
		t.Fatalf("replay to the deleted webhook: %d %s", r.status, r.body)
	}
	n, err := e.store.SweepDeletedWebhooks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if left := queued() + e.countRows(`SELECT count(*) FROM deliveries WHERE webhook_id = $1`, w.ID) +
		e.countRows(`SELECT count(*) FROM deleted_webhooks`); left != 0 {
		t.Fatalf("after the sweep (%d deliveries removed): %d rows left", n, left)
	}
}
