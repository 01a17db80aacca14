package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// replayFixture stores events of org A's channels "111" and "222" and org B's "333" on three
// days (3 days ago, yesterday, today) before any webhook exists.
type replayFixture struct {
	f            *testenv.Fixture
	orgA, orgB   store.Org
	c1, c2       store.Channel
	now          time.Time
	events       map[string]uuid.UUID // dedupe key → event id
	eventCreated map[string]time.Time
}

func newReplayFixture(t *testing.T) *replayFixture {
	t.Helper()
	f := testenv.NewStore(t)
	s := f.Store
	ctx := context.Background()
	rf := &replayFixture{f: f, now: time.Now().UTC(), events: map[string]uuid.UUID{}, eventCreated: map[string]time.Time{}}
	rf.orgA, rf.orgB = f.Org(t, &testenv.OrgOpts{Name: "a"}), f.Org(t, &testenv.OrgOpts{Name: "b"})
	connected := func(org uuid.UUID, pnid string) store.Channel {
		return f.Channel(t, org, &testenv.ChannelOpts{Name: "c" + pnid,
			Connection: &store.Connection{PhoneNumberID: pnid, WabaID: "w" + pnid, UpstreamToken: "t"}})
	}
	rf.c1, rf.c2 = connected(rf.orgA.ID, "111"), connected(rf.orgA.ID, "222")
	connected(rf.orgB.ID, "333")
	for i, day := range []time.Time{rf.now.AddDate(0, 0, -3), rf.now.AddDate(0, 0, -1), rf.now} {
		if err := s.EnsurePartitions(ctx, day, day); err != nil {
			t.Fatal(err)
		}
		s.SetClock(clock.NewStub(day))
		var batch []store.IncomingItem
		for _, pn := range []string{"111", "222", "333"} {
			batch = append(batch,
				store.IncomingItem{Type: "messages", PhoneNumberID: pn, DedupeKey: "m:" + pn + ":" + string(rune('a'+i)), Data: json.RawMessage(`{}`)},
				store.IncomingItem{Type: "message_status", PhoneNumberID: pn, DedupeKey: "s:" + pn + ":" + string(rune('a'+i)), Data: json.RawMessage(`{}`)})
		}
		if res, err := s.StoreEvents(ctx, batch, store.Claim{}); err != nil || res.Events != 6 || res.Deliveries != 0 {
			t.Fatalf("day %d: %+v %v", i, res, err)
		}
	}
	s.SetClock(nil)
	rows, err := s.Pool().Query(ctx, `SELECT dedupe_key, id, created_at FROM events`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var id uuid.UUID
		var at time.Time
		if err := rows.Scan(&k, &id, &at); err != nil {
			t.Fatal(err)
		}
		rf.events[k], rf.eventCreated[k] = id, at
	}
	return rf
}

// queued returns the dedupe keys of the events of the webhook's deliveries, each checked to
// be one log row and one queue row of queue status want, in the event's partition.
func (rf *replayFixture) queued(t *testing.T, webhook uuid.UUID, want string) map[string]int {
	t.Helper()
	rows, err := rf.f.Pool.Query(context.Background(), `
		SELECT e.dedupe_key, d.status, q.status, d.created_at = e.created_at AND q.created_at = e.created_at, d.attempts
		FROM deliveries d JOIN events e ON e.id = d.event_id
		LEFT JOIN delivery_queue q ON q.delivery_id = d.id
		WHERE d.webhook_id = $1`, webhook)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var key, logStatus string
		var queueStatus *string
		var samePartition bool
		var attempts int
		if err := rows.Scan(&key, &logStatus, &queueStatus, &samePartition, &attempts); err != nil {
			t.Fatal(err)
		}
		if logStatus != "pending" || queueStatus == nil || *queueStatus != want || !samePartition || attempts != 0 {
			t.Errorf("delivery of %s: log %s, queue %v (want %s), event's created_at %v, attempts %d", key, logStatus, queueStatus, want, samePartition, attempts)
		}
		out[key]++
	}
	return out
}

func keys(ks ...string) map[string]int {
	m := map[string]int{}
	for _, k := range ks {
		m[k]++
	}
	return m
}

func sameKeys(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, n := range a {
		if b[k] != n {
			return false
		}
	}
	return true
}

// TestReplay: a replay queues one delivery per stored event in the window that the webhook's
// scope and events cover (events stored before the webhook existed included), narrowed by
// channel_ids and types, with the events' own ids, in the events' partitions; a paused
// webhook's are held; another org's webhook and channels are not found.
func TestReplay(t *testing.T) {
	rf := newReplayFixture(t)
	s, f := rf.f.Store, rf.f
	ctx := context.Background()
	all, _ := f.Webhook(t, rf.orgA.ID, "https://h.example.com", &testenv.WebhookOpts{Events: []string{"messages", "message_status"}})
	statuses, _ := f.Webhook(t, rf.orgA.ID, "https://h.example.com", &testenv.WebhookOpts{Events: []string{"message_status"}})
	onlyC2, _ := f.Webhook(t, rf.orgA.ID, "https://h.example.com", &testenv.WebhookOpts{Events: []string{"messages", "message_status"}, ChannelIDs: []uuid.UUID{rf.c2.ID}})
	paused, _ := f.Webhook(t, rf.orgA.ID, "https://h.example.com", &testenv.WebhookOpts{Events: []string{"messages"}})
	bystander, _ := f.Webhook(t, rf.orgA.ID, "https://h.example.com", &testenv.WebhookOpts{Events: []string{"messages", "message_status"}})
	other, _ := f.Webhook(t, rf.orgB.ID, "https://h.example.com")
	if _, err := s.SetWebhookStatus(ctx, rf.orgA.ID, paused.ID, "paused"); err != nil {
		t.Fatal(err)
	}
	// yesterday and today (the events of 3 days ago are outside the window)
	window := store.Replay{Since: rf.now.AddDate(0, 0, -2), Until: rf.now.Add(time.Minute)}

	for _, c := range []struct {
		name    string
		webhook uuid.UUID
		r       store.Replay
		queue   string
		want    map[string]int
	}{
		{"org scope, both kinds", all.ID, window, "pending",
			keys("m:111:b", "s:111:b", "m:222:b", "s:222:b", "m:111:c", "s:111:c", "m:222:c", "s:222:c")},
		{"statuses only", statuses.ID, window, "pending", keys("s:111:b", "s:222:b", "s:111:c", "s:222:c")},
		{"channel c2 only", onlyC2.ID, window, "pending", keys("m:222:b", "s:222:b", "m:222:c", "s:222:c")},
		{"paused: held", paused.ID, window, "held", keys("m:111:b", "m:222:b", "m:111:c", "m:222:c")},
	} {
		n, err := s.Replay(ctx, rf.orgA.ID, c.webhook, c.r)
		got := rf.queued(t, c.webhook, c.queue)
		if err != nil || n != len(c.want) || !sameKeys(got, c.want) {
			t.Errorf("%s: queued %d %v, deliveries of %v, want %v", c.name, n, err, got, c.want)
		}
	}
	if n := f.CountWhere(t, "deliveries", "webhook_id", bystander.ID); n != 0 {
		t.Errorf("%d deliveries to the webhook not replayed to", n)
	}
	// the deliveries carry the events' own ids
	if id := testenv.QueryValue[uuid.UUID](t, f, `SELECT d.event_id FROM deliveries d JOIN events e ON e.id = d.event_id
		WHERE d.webhook_id = $1 AND e.dedupe_key = 'm:111:c'`, all.ID); id != rf.events["m:111:c"] {
		t.Errorf("event id %s, want %s", id, rf.events["m:111:c"])
	}

	// narrowed: the bystander, one channel (outside the 3-day-old day) and one kind
	n, err := s.Replay(ctx, rf.orgA.ID, bystander.ID, store.Replay{Since: rf.now.AddDate(0, 0, -4), Until: rf.now.AddDate(0, 0, -2),
		ChannelIDs: []uuid.UUID{rf.c1.ID}, Types: []string{"messages"}})
	if got := rf.queued(t, bystander.ID, "pending"); err != nil || n != 1 || !sameKeys(got, keys("m:111:a")) {
		t.Errorf("narrowed: queued %d %v, deliveries of %v", n, err, got)
	}
	// a channel outside a channels-scoped webhook's scope adds nothing; a kind it does not take neither
	if n, err := s.Replay(ctx, rf.orgA.ID, onlyC2.ID, store.Replay{Since: window.Since, Until: window.Until, ChannelIDs: []uuid.UUID{rf.c1.ID}}); n != 0 || err != nil {
		t.Errorf("channel outside the scope: queued %d %v", n, err)
	}
	if n, err := s.Replay(ctx, rf.orgA.ID, statuses.ID, store.Replay{Since: window.Since, Until: window.Until, Types: []string{"messages"}}); n != 0 || err != nil {
		t.Errorf("kind outside the webhook's events: queued %d %v", n, err)
	}
	// a second replay while the first's deliveries are queued queues nothing (idempotent per
	// webhook); once they have gone out, a replay queues the events again (new deliveries, same
	// event ids)
	if n, err := s.Replay(ctx, rf.orgA.ID, statuses.ID, window); n != 0 || err != nil {
		t.Errorf("second replay, the first's deliveries queued: queued %d %v, want 0", n, err)
	}
	f.Exec(t, `DELETE FROM delivery_queue WHERE webhook_id = $1`, statuses.ID) // (as delivered)
	if n, err := s.Replay(ctx, rf.orgA.ID, statuses.ID, window); n != 4 || err != nil {
		t.Errorf("replay after the first's went out: queued %d %v", n, err)
	}
	if n := f.CountWhere(t, "deliveries", "webhook_id", statuses.ID); n != 8 {
		t.Errorf("%d deliveries after two replays, want 8", n)
	}

	// another org's webhook, channels of another org
	if _, err := s.Replay(ctx, rf.orgA.ID, other.ID, window); !errors.Is(err, store.ErrWebhookNotFound) {
		t.Errorf("another org's webhook: %v", err)
	}
	otherChannel := testenv.QueryValue[uuid.UUID](t, f, `SELECT id FROM channels WHERE org_id = $1`, rf.orgB.ID)
	if _, err := s.Replay(ctx, rf.orgA.ID, all.ID, store.Replay{Since: window.Since, Until: window.Until, ChannelIDs: []uuid.UUID{rf.c1.ID, otherChannel}}); !errors.Is(err, store.ErrChannelsNotInOrg) {
		t.Errorf("another org's channel: %v", err)
	}
	if n := f.CountWhere(t, "deliveries", "webhook_id", other.ID); n != 0 {
		t.Errorf("%d deliveries to the other org's webhook", n)
	}
	// resuming the paused webhook releases its replayed deliveries
	if _, err := s.SetWebhookStatus(ctx, rf.orgA.ID, paused.ID, "active"); err != nil {
		t.Fatal(err)
	}
	rf.queued(t, paused.ID, "pending")
}

// TestReplayCap: a window holding more than store.MaxReplayEvents events queues nothing and
// says so; one event fewer queues them all.
func TestReplayCap(t *testing.T) {
	f := testenv.NewStore(t)
	s := f.Store
	ctx := context.Background()
	org := f.Org(t)
	ch := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: f.Connection()})
	wh, _ := f.Webhook(t, org.ID, "https://h.example.com")
	now := time.Now().UTC()
	if err := s.EnsurePartitions(ctx, now, now); err != nil {
		t.Fatal(err)
	}
	f.Exec(t, `INSERT INTO events (id, org_id, channel_id, type, dedupe_key, payload, created_at)
		SELECT gen_random_uuid(), $1, $2, 'messages', 'm:' || i, '\x7b7d', $3 FROM generate_series(1, $4) i`,
		org.ID, ch.ID, now, store.MaxReplayEvents+1)
	window := store.Replay{Since: now.Add(-time.Hour), Until: now.Add(time.Hour)}
	if n, err := s.Replay(ctx, org.ID, wh.ID, window); !errors.Is(err, store.ErrReplayTooLarge) || n != 0 {
		t.Fatalf("over the cap: queued %d %v", n, err)
	}
	if n := f.Count(t, "deliveries") + f.Count(t, "delivery_queue"); n != 0 {
		t.Fatalf("over the cap: %d rows written", n)
	}
	f.Exec(t, `DELETE FROM events WHERE dedupe_key = 'm:1'`)
	if n, err := s.Replay(ctx, org.ID, wh.ID, window); err != nil || n != store.MaxReplayEvents {
		t.Fatalf("at the cap: queued %d %v", n, err)
	}
	if n, q := f.Count(t, "deliveries"), f.Count(t, "delivery_queue"); n != store.MaxReplayEvents || q != n {
		t.Fatalf("at the cap: %d log rows, %d queue rows", n, q)
	}
}
