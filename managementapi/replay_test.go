package managementapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// TestReplayEndpoint: POST /webhooks/{id}/replay queues the stored events of the window that
// the webhook covers — events stored before it existed — and answers 202 {"queued": n}; every
// refusal in the interface's style, in the documented order; another org's webhook is not
// found.
func TestReplayEndpoint(t *testing.T) {
	e := newEnv(t, func(o *managementapi.Options) { o.Retention = 8 * 24 * time.Hour })
	old := e.deliveries("777", 3) // 3 messages, delivered to old
	e.Exec(t, `DELETE FROM delivery_queue`)
	e.Exec(t, `UPDATE deliveries SET status = 'delivered'`)
	fresh := e.createWebhook(e.keyA, `{"name":"new","url":"https://new.example.com","events":["messages","message_status"]}`)
	statuses := e.createWebhook(e.keyA, `{"name":"st","url":"https://st.example.com","events":["message_status"]}`)
	path := "/webhooks/" + fresh.ID + "/replay"
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)

	r := e.do("POST", path, e.keyA, fmt.Sprintf(`{"since":%q}`, since))
	if r.status != 202 || strings.TrimSpace(string(r.body)) != `{"queued":3}` {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	count := func(webhook string) int {
		return e.CountWhere(t, "deliveries", "webhook_id", webhook)
	}
	if n, q := count(fresh.ID), e.CountWhere(t, "delivery_queue", "webhook_id", fresh.ID); n != 3 || q != 3 {
		t.Fatalf("new webhook: %d log rows, %d queue rows", n, q)
	}
	if n := count(old.ID); n != 3 {
		t.Fatalf("old webhook: %d deliveries, want its 3", n)
	}
	// the same events: one replayed delivery per event the old webhook had
	if n := e.Count(t, "(SELECT DISTINCT event_id FROM deliveries) x"); n != 3 {
		t.Fatalf("%d distinct events among the deliveries, want 3", n)
	}
	// kinds, types and a window with nothing in it
	for body, want := range map[string]string{
		fmt.Sprintf(`{"since":%q}`, since):                                         `{"queued":0}`, // statuses only: no message_status events
		fmt.Sprintf(`{"since":%q,"types":["message_status"],"until":null}`, since): `{"queued":0}`,
	} {
		if r := e.do("POST", "/webhooks/"+statuses.ID+"/replay", e.keyA, body); r.status != 202 || strings.TrimSpace(string(r.body)) != want {
			t.Errorf("%s: %d %s", body, r.status, r.body)
		}
	}
	r = e.do("POST", path, e.keyA, fmt.Sprintf(`{"since":%q,"until":%q,"types":["messages"],"channel_ids":[]}`,
		time.Now().Add(-3*time.Hour).UTC().Format(time.RFC3339), since))
	if r.status != 202 || strings.TrimSpace(string(r.body)) != `{"queued":0}` {
		t.Fatalf("empty window: %d %s", r.status, r.body)
	}

	now := time.Now().UTC()
	ts := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339Nano) }
	otherChannel := e.createChannel(e.keyB, "b")
	for _, c := range []struct{ body, msg string }{
		{`{}`, `"since" is required`},
		{`{"since":""}`, `"since" is required`},
		{`{"since":5}`, `"since" must be a string`},
		{`{"since":"yesterday"}`, `"since" must be an ISO 8601 timestamp with a time zone`},
		{`{"since":"2026-11-20T00:00:00"}`, `"since" must be an ISO 8601 timestamp with a time zone`},
		{fmt.Sprintf(`{"since":%q,"until":"soon"}`, ts(-time.Hour)), `"until" must be an ISO 8601 timestamp with a time zone`},
		{fmt.Sprintf(`{"since":%q,"until":%q}`, ts(-time.Hour), ts(-2*time.Hour)), `"until" must be after "since"`},
		{fmt.Sprintf(`{"since":%q}`, ts(time.Hour)), `"until" must be after "since"`},
		{fmt.Sprintf(`{"since":%q}`, ts(-7*24*time.Hour-time.Minute)), `"until" must be at most 7 days after "since"`},
		{fmt.Sprintf(`{"since":%q,"until":%q}`, ts(-9*24*time.Hour), ts(-8*24*time.Hour)), `"since" must be within the event retention (192h)`},
		{fmt.Sprintf(`{"since":%q,"channel_ids":"x"}`, since), `"channel_ids" must be an array of strings`},
		{fmt.Sprintf(`{"since":%q,"channel_ids":["nope"]}`, since), `One or more channel_ids not found in this org`},
		{fmt.Sprintf(`{"since":%q,"channel_ids":[%q]}`, since, otherChannel.ID), `One or more channel_ids not found in this org`},
		{fmt.Sprintf(`{"since":%q,"types":"messages"}`, since), `"types" must be an array of strings`},
		{fmt.Sprintf(`{"since":%q,"types":["messages","bogus"]}`, since), `"types" values must be one of: messages, message_status, channel_status, message_template_status_update, channel_health`},
	} {
		expectError(t, e.do("POST", path, e.keyA, c.body), 422, c.msg)
	}
	expectError(t, e.do("POST", path, e.keyB, fmt.Sprintf(`{"since":%q}`, since)), 404, "Webhook not found")
	expectError(t, e.do("POST", "/webhooks/"+uuid.NewString()+"/replay", e.keyA, fmt.Sprintf(`{"since":%q}`, since)), 404, "Webhook not found")
	expectError(t, e.do("POST", "/webhooks/x/replay", e.keyA, `not json`), 404, "Webhook not found")
	expectError(t, e.do("POST", path, e.keyA, `{"since":`), 400, "Invalid JSON body")
	e.expectBodyRefused(path)
	if n := count(fresh.ID); n != 3 {
		t.Fatalf("refused replays queued deliveries: %d", n)
	}

	// the service's typed form (the dashboard's) takes the same checks (the endpoint's
	// deliveries gone out first: a replay queues no event that has one queued)
	e.Exec(t, `DELETE FROM delivery_queue WHERE webhook_id = $1`, fresh.ID)
	svc := managementapi.NewService(managementapi.Options{Store: e.Store})
	key, _ := e.APIKey(t, e.orgA)
	p := managementapi.Principal{Key: key}
	if n, err := svc.Replay(context.Background(), p, fresh.ID, managementapi.ReplayInput{Since: since, Types: []string{"messages"}}); n != 3 || err != nil {
		t.Fatalf("service replay: %d %v", n, err)
	}
	if _, err := svc.Replay(context.Background(), p, fresh.ID, managementapi.ReplayInput{Since: since, Until: "x"}); err == nil ||
		err.Error() != `"until" must be an ISO 8601 timestamp with a time zone` {
		t.Fatalf("service replay, bad until: %v", err)
	}
}

// TestReplayTooLarge: a window holding more than 100000 events is refused with the exact
// message and queues nothing.
func TestReplayTooLarge(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	wh := e.deliveries("778", 1)
	e.Exec(t, `INSERT INTO events (id, org_id, channel_id, type, dedupe_key, payload, created_at)
		SELECT gen_random_uuid(), org_id, channel_id, type, 'x:' || i, payload, created_at FROM events, generate_series(1, $1) i WHERE type <> 'channel_status'`,
		store.MaxReplayEvents)
	expectError(t, e.do("POST", "/webhooks/"+wh.ID+"/replay", e.keyA, fmt.Sprintf(`{"since":%q}`, time.Now().Add(-time.Hour).Format(time.RFC3339))),
		422, "Replay window holds more than 100000 events; narrow it")
	if n := e.CountWhere(t, "deliveries", "webhook_id", wh.ID); n != 1 {
		t.Fatalf("%d deliveries after the refused replay, want the 1 it had", n)
	}
}
