package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// orderingEnv is an org with channel "111", an ordered webhook and a plain one, and helpers to
// store messages of a customer and claim.
type orderingEnv struct {
	t              *testing.T
	f              *testenv.Fixture
	q              *store.Queue
	org            uuid.UUID
	ordered, plain uuid.UUID
	names          map[uuid.UUID]string // event id → item name
	claimed        map[uuid.UUID]store.ClaimedDelivery
	clk            *clock.Stub // set by useClock
}

// useClock makes the env's store and queue decide by a stubbed clock, set to the time now, and
// returns it. Call it before storing.
func (e *orderingEnv) useClock() *clock.Stub {
	e.clk = clock.NewStub(time.Now())
	e.f.Store.SetClock(e.clk)
	e.q = e.q.WithClock(e.clk)
	return e.clk
}

func newOrderingEnv(t *testing.T) *orderingEnv {
	f := testenv.NewStore(t)
	org := f.Org(t)
	f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "111", WabaID: "w", UpstreamToken: "t"}})
	ordered, _ := f.Webhook(t, org.ID, "https://ordered.example.com", &testenv.WebhookOpts{Events: []string{"messages", "message_status"}})
	plain, _ := f.Webhook(t, org.ID, "https://plain.example.com", &testenv.WebhookOpts{Events: []string{"messages", "message_status"}})
	w, err := f.Store.SetWebhookOrdering(context.Background(), org.ID, ordered.ID, store.OrderingConversation)
	if err != nil || w.Ordering != store.OrderingConversation {
		t.Fatalf("set ordering: %+v %v", w, err)
	}
	return &orderingEnv{t: t, f: f, q: store.NewQueue(f.Pool), org: org.ID, ordered: ordered.ID, plain: plain.ID,
		names: map[uuid.UUID]string{}, claimed: map[uuid.UUID]store.ClaimedDelivery{}}
}

// store stores one batch of messages named "<customer><n>" (e.g. "x1": customer x), handing
// off up to handOff deliveries, and returns the names of those handed off.
func (e *orderingEnv) store(handOff int, names ...string) []string {
	e.t.Helper()
	items := make([]store.IncomingItem, len(names))
	for i, n := range names {
		items[i] = store.IncomingItem{Type: "messages", PhoneNumberID: "111", Customer: n[:1], DedupeKey: "m:" + n,
			Data: json.RawMessage(fmt.Sprintf(`{"message":{"id":%q,"from":%q}}`, n, n[:1]))}
	}
	claim := store.Claim{}
	if handOff > 0 {
		claim = store.Claim{Instance: "i1", Lease: 24 * time.Hour, Max: handOff}
	}
	res, err := e.f.Store.StoreEvents(context.Background(), items, claim)
	if err != nil || res.Events != len(names) {
		e.t.Fatalf("store events: %+v %v", res, err)
	}
	rows, err := e.f.Pool.Query(context.Background(), `SELECT id, convert_from(payload, 'UTF8')::json->'data'->'message'->>'id' FROM events WHERE type = 'messages'`)
	if err != nil {
		e.t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		var n string
		if err := rows.Scan(&id, &n); err != nil {
			e.t.Fatal(err)
		}
		e.names[id] = n
	}
	rows.Close()
	var handed []string
	for _, d := range res.Claimed {
		e.claimed[d.ID] = d
		handed = append(handed, e.hookName(d.WebhookID)+":"+e.names[d.EventID])
	}
	slices.Sort(handed)
	return handed
}

func (e *orderingEnv) hookName(id uuid.UUID) string {
	if id == e.ordered {
		return "ordered"
	}
	return "plain"
}

// claim claims everything claimable (under a lease of a day) and returns "<hook>:<name>" sorted.
func (e *orderingEnv) claim() []string {
	e.t.Helper()
	c, err := e.q.Claim(context.Background(), store.QueueClaim{Instance: "i1", Lease: 24 * time.Hour, Limit: 100, PerWebhook: 100})
	if err != nil {
		e.t.Fatal(err)
	}
	var got []string
	for _, d := range c.Deliveries {
		e.claimed[d.ID] = d
		got = append(got, e.hookName(d.WebhookID)+":"+e.names[d.EventID])
	}
	slices.Sort(got)
	return got
}

// record records the outcome of the claimed delivery "<hook>:<name>": ok, or a retry in retryIn
// (negative: failed for good).
func (e *orderingEnv) record(which string, ok bool, retryIn time.Duration) {
	e.t.Helper()
	for id, d := range e.claimed {
		if e.hookName(d.WebhookID)+":"+e.names[d.EventID] == which {
			n, err := e.q.Record(context.Background(), "i1", []store.Outcome{{Delivery: d, Started: time.Now(), OK: ok, RetryIn: retryIn}})
			if err != nil || n != 1 {
				e.t.Fatalf("record %s: %d %v", which, n, err)
			}
			delete(e.claimed, id)
			return
		}
	}
	e.t.Fatalf("%s is not claimed", which)
}

func (e *orderingEnv) want(got []string, want ...string) {
	e.t.Helper()
	if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
		e.t.Fatalf("claimed %q, want %q", got, want)
	}
}

// TestClaimOrderedConversation: a webhook with ordering "conversation" gets one delivery of a
// conversation at a time, in inbound order, while its other conversations and a plain webhook
// go on; a retry holds its conversation until it is due by the clock, and then goes first; the
// hand-off takes an ordered delivery only when it is the first of a conversation with nothing
// queued (issue 35: it took none before, and every ordered delivery went through a claim; the
// rule is the same, and the conversation's lock keeps concurrent writers out, see
// TestOrderedHandOffUnderConcurrentIntake).
func TestClaimOrderedConversation(t *testing.T) {
	e := newOrderingEnv(t)
	clk := e.useClock()
	// the hand-off takes the plain webhook's deliveries and x1 and y1, the first of their
	// conversations; x2 waits behind x1
	e.want(e.store(10, "x1", "y1", "x2"), "ordered:x1", "ordered:y1", "plain:x1", "plain:x2", "plain:y1")
	e.store(0, "x3", "y2")
	e.want(e.claim(), "plain:x3", "plain:y2")
	e.want(e.claim()) // x and y each have one in flight

	e.record("ordered:x1", false, time.Hour) // x1 waits an hour for its retry: x2, x3 wait with it
	retryAt := clk.Now().Add(time.Hour)
	e.want(e.claim())
	e.record("ordered:y1", true, 0)
	e.want(e.claim(), "ordered:y2")
	// x1 is pending an hour ahead; x2 and x3 wait behind it, out of the claims' index
	var later, waiting int
	if err := e.f.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE status = 'pending' AND next_attempt_at = $2),
		count(*) FILTER (WHERE status = 'waiting') FROM delivery_queue WHERE webhook_id = $1`, e.ordered, retryAt).Scan(&later, &waiting); err != nil {
		t.Fatal(err)
	}
	if later != 1 || waiting != 2 {
		t.Fatalf("x's deliveries: %d pending for x1's retry (want 1), %d waiting (want 2: x2, x3)", later, waiting)
	}
	// a new message of x waits for x1's retry too, not due meanwhile
	e.store(0, "x4")
	e.want(e.claim(), "plain:x4")
	clk.Set(retryAt.Add(-time.Microsecond))
	e.want(e.claim())

	// x1's retry is due, before x2; it fails for good: x2 goes, then a manual retry puts x1
	// back before x3 and x4
	clk.Set(retryAt)
	e.want(e.claim(), "ordered:x1")
	e.record("ordered:x1", false, -1)
	e.want(e.claim(), "ordered:x2")
	var x1 uuid.UUID
	if err := e.f.Pool.QueryRow(context.Background(), `SELECT d.id FROM deliveries d WHERE d.webhook_id = $1 AND d.status = 'failed'`, e.ordered).Scan(&x1); err != nil {
		t.Fatal(err)
	}
	if err := e.f.Store.RetryDelivery(context.Background(), e.org, e.ordered, x1); err != nil {
		t.Fatal(err)
	}
	e.want(e.claim()) // x2 is in flight
	e.record("ordered:x2", true, 0)
	e.want(e.claim(), "ordered:x1")
	e.record("ordered:x1", true, 0)
	e.want(e.claim(), "ordered:x3")
	e.record("ordered:x3", true, 0)
	e.want(e.claim(), "ordered:x4")
}

// TestOrderedPauseAndHandBack: a paused ordered webhook holds its conversations in order; a
// claim handed back keeps its place.
func TestOrderedPauseAndHandBack(t *testing.T) {
	e := newOrderingEnv(t)
	ctx := context.Background()
	if _, err := e.f.Store.SetWebhookStatus(ctx, e.org, e.ordered, store.WebhookPaused); err != nil {
		t.Fatal(err)
	}
	e.store(10, "x1", "x2", "x3")
	for _, d := range e.claimed {
		e.record(e.hookName(d.WebhookID)+":"+e.names[d.EventID], true, 0) // the plain webhook's
	}
	e.want(e.claim())
	if _, err := e.f.Store.SetWebhookStatus(ctx, e.org, e.ordered, store.WebhookActive); err != nil {
		t.Fatal(err)
	}
	e.want(e.claim(), "ordered:x1")
	for id, d := range e.claimed {
		if err := e.q.Release(ctx, "i1", []store.Handback{{ID: id, Claim: d.Claim}}); err != nil {
			t.Fatal(err)
		}
		delete(e.claimed, id)
	}
	e.want(e.claim(), "ordered:x1")
	e.record("ordered:x1", true, 0)
	e.want(e.claim(), "ordered:x2")
}

// TestOrderingChangeAndRefusal: an unknown ordering is refused; switching back to none lets
// the deliveries created after the switch go in parallel.
func TestOrderingChangeAndRefusal(t *testing.T) {
	e := newOrderingEnv(t)
	ctx := context.Background()
	if _, err := e.f.Store.SetWebhookOrdering(ctx, e.org, e.ordered, "fifo"); !errors.Is(err, store.ErrBadOrdering) {
		t.Fatalf("ordering fifo: %v", err)
	}
	if _, err := e.f.Store.SetWebhookOrdering(ctx, e.org, uuid.New(), store.OrderingNone); !errors.Is(err, store.ErrWebhookNotFound) {
		t.Fatalf("unknown webhook: %v", err)
	}
	w, err := e.f.Store.SetWebhookOrdering(ctx, e.org, e.ordered, store.OrderingNone)
	if err != nil || w.Ordering != store.OrderingNone {
		t.Fatalf("%+v %v", w, err)
	}
	e.store(0, "x1", "x2")
	e.want(e.claim(), "ordered:x1", "ordered:x2", "plain:x1", "plain:x2")
}

// TestOrderedClaimReadsFewRows: a conversation's backlog waiting behind a retry is not read by
// claims (its rows are not due before the retry), and a webhook at ordering none pays nothing.
func TestOrderedClaimReadsFewRows(t *testing.T) {
	e := newOrderingEnv(t)
	e.store(0, "x1")
	e.claim()
	e.record("ordered:x1", false, time.Hour)
	for i := range 10 {
		names := make([]string, 100)
		for k := range names {
			names[k] = fmt.Sprintf("x%d", 2+i*100+k)
		}
		e.store(0, names...)
	}
	e.store(0, "y1")
	took, read, _ := claimCost(t, e.f.Pool, store.QueueClaim{Instance: "i2", Lease: time.Minute, Limit: 100, PerWebhook: 100})
	if took[e.ordered] != 1 {
		t.Fatalf("took %v from the ordered webhook, want y1 only", took)
	}
	t.Logf("took %v, read %.0f queue rows", took, read)
	if read > 300 {
		t.Fatalf("the claim read %.0f queue rows, want a few per row taken", read)
	}
}

// TestReplayKeepsConversations: a replay to a webhook with ordering "conversation" gives its
// deliveries the conversation of their events, the same key as the live deliveries of an ordered
// webhook; a replay to a webhook with ordering "none" gives none.
func TestReplayKeepsConversations(t *testing.T) {
	e := newOrderingEnv(t)
	e.store(0, "x1", "y1", "x2")
	ctx := context.Background()
	hook := func(ordering string) uuid.UUID {
		w, _ := e.f.Webhook(t, e.org, "https://replay-"+ordering+".example.com", &testenv.WebhookOpts{Events: []string{"messages"}})
		if _, err := e.f.Store.SetWebhookOrdering(ctx, e.org, w.ID, ordering); err != nil {
			t.Fatal(err)
		}
		n, err := e.f.Store.Replay(ctx, e.org, w.ID, store.Replay{Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Minute)})
		if err != nil || n != 3 {
			t.Fatalf("replay to %s: %d %v", ordering, n, err)
		}
		return w.ID
	}
	ordered, plain := hook(store.OrderingConversation), hook(store.OrderingNone)
	convOf := func(webhook uuid.UUID) map[uuid.UUID]*int64 {
		rows, err := e.f.Pool.Query(ctx, `SELECT event_id, conversation FROM delivery_queue WHERE webhook_id = $1`, webhook)
		if err != nil {
			t.Fatal(err)
		}
		m := map[uuid.UUID]*int64{}
		for rows.Next() {
			var id uuid.UUID
			var c *int64
			if err := rows.Scan(&id, &c); err != nil {
				t.Fatal(err)
			}
			m[id] = c
		}
		return m
	}
	live, replayed, none := convOf(e.ordered), convOf(ordered), convOf(plain)
	if len(live) != 3 || len(replayed) != 3 || len(none) != 3 {
		t.Fatalf("rows: live %d, replayed %d, none %d", len(live), len(replayed), len(none))
	}
	for id, c := range live {
		if c == nil || replayed[id] == nil || *replayed[id] != *c {
			t.Errorf("event %s (%s): live conversation %v, replayed %v", id, e.names[id], c, replayed[id])
		}
		if none[id] != nil {
			t.Errorf("event %s: a none webhook's replay carries conversation %d", id, *none[id])
		}
	}
	if *live[e.idOf("x1")] != *live[e.idOf("x2")] || *live[e.idOf("x1")] == *live[e.idOf("y1")] {
		t.Errorf("conversations: x1 %d, x2 %d, y1 %d", *live[e.idOf("x1")], *live[e.idOf("x2")], *live[e.idOf("y1")])
	}
}

// idOf returns the event id of the item named n.
func (e *orderingEnv) idOf(n string) uuid.UUID {
	for id, name := range e.names {
		if name == n {
			return id
		}
	}
	e.t.Fatalf("no event %q", n)
	return uuid.Nil
}

// TestOrderedBacklogInFlightBounded: while a conversation's head is in flight (a receiver that
// does not answer), its backlog grows from 1,000 to 100,000 deliveries (the intake's, then
// replays' copies of them); a claim reads a bounded number of queue rows whatever the size —
// the backlog waits outside the claims' index — and still takes another conversation's head.
func TestOrderedBacklogInFlightBounded(t *testing.T) {
	e := newOrderingEnv(t)
	ctx := context.Background()
	e.store(0, "x0")
	e.want(e.claim(), "ordered:x0", "plain:x0") // x0 in flight on the ordered webhook, never answered
	e.record("plain:x0", true, 0)
	for b := range 10 {
		names := make([]string, 100)
		for k := range names {
			names[k] = fmt.Sprintf("x%d", 1+b*100+k)
		}
		e.store(0, names...)
	}
	e.f.Exec(t, `DELETE FROM delivery_queue WHERE webhook_id = $1`, e.plain) // only the ordered webhook's backlog matters here
	var waiting int
	if err := e.f.Pool.QueryRow(ctx, `SELECT count(*) FROM delivery_queue WHERE webhook_id = $1 AND status = 'waiting'`, e.ordered).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	if waiting != 1000 {
		t.Fatalf("the intake queued %d of x's 1,000 deliveries waiting behind x0, want all", waiting)
	}
	reads := map[int]float64{}
	for _, size := range []int{1000, 10000, 100000} {
		// grow x's backlog to size: copies of its waiting rows, as replays of its events queue them
		e.f.Exec(t, `
			INSERT INTO delivery_queue (delivery_id, created_at, event_id, webhook_id, status, next_attempt_at, conversation)
			SELECT gen_random_uuid(), created_at, event_id, webhook_id, 'waiting', now() - interval '1 minute', conversation
			FROM delivery_queue WHERE webhook_id = $1 AND status = 'waiting' LIMIT $2`, e.ordered, size-waiting)
		waiting = size
		e.f.Exec(t, `ANALYZE delivery_queue`)
		for _, y := range []string{fmt.Sprintf("y%d", size)} {
			e.store(0, y)
		}
		e.f.Exec(t, `DELETE FROM delivery_queue WHERE webhook_id = $1`, e.plain)
		took, read, _ := claimCost(t, e.f.Pool, store.QueueClaim{Instance: "i2", Lease: time.Minute, Limit: 100, PerWebhook: 100})
		if took[e.ordered] != 1 || len(took) != 1 {
			t.Fatalf("backlog %d: took %v, want y's head only", size, took)
		}
		reads[size] = read
		t.Logf("backlog of %d behind a head in flight: the claim read %.0f queue rows", size, read)
		if read > 20 {
			t.Fatalf("backlog %d: the claim read %.0f queue rows to take one, want a few whatever the backlog", size, read)
		}
		got := e.claim()
		e.want(got, fmt.Sprintf("ordered:y%d", size))
		e.record(got[0], true, 0)
	}
	if reads[100000] > reads[1000]+4 {
		t.Fatalf("rows read per claim grew with the backlog: %v", reads)
	}
	// x0 finally answers: x1 is next, alone
	e.record("ordered:x0", true, 0)
	e.want(e.claim(), "ordered:x1")
}

// TestOrderedConcurrentWritersNeverStrand: deliveries of one conversation stored by concurrent
// intake transactions while a dispatcher claims and records them one by one: every delivery is
// delivered, at most one of the conversation is ever in flight, and the queue ends empty — no
// row is left waiting behind a head that is gone (the locks of queueStatusSQL and Record).
func TestOrderedConcurrentWritersNeverStrand(t *testing.T) {
	e := newOrderingEnv(t)
	ctx := context.Background()
	const writers, batches = 6, 40
	done := make(chan error, writers)
	for w := range writers {
		go func() {
			for b := range batches {
				items := []store.IncomingItem{{Type: "messages", PhoneNumberID: "111", Customer: "x",
					DedupeKey: fmt.Sprintf("c:%d:%d", w, b), Data: json.RawMessage(`{"message":{"id":"m","from":"x"}}`)}}
				if _, err := e.f.Store.StoreEvents(ctx, items, store.Claim{}); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	delivered, finished := 0, 0
	for delivered < writers*batches {
		c, err := e.q.Claim(ctx, store.QueueClaim{Instance: "i1", Lease: time.Minute, Limit: 100, PerWebhook: 100})
		if err != nil {
			t.Fatal(err)
		}
		var outs []store.Outcome
		ordered := 0
		for _, d := range c.Deliveries {
			if d.WebhookID == e.ordered {
				ordered++
				delivered++
			}
			outs = append(outs, store.Outcome{Delivery: d, Started: time.Now(), OK: true})
		}
		if ordered > 1 {
			t.Fatalf("a claim took %d deliveries of one conversation", ordered)
		}
		if _, err := e.q.Record(ctx, "i1", outs); err != nil {
			t.Fatal(err)
		}
		if finished < writers {
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
				finished++
			default:
			}
			continue
		}
		if len(c.Deliveries) == 0 {
			var left int
			if err := e.f.Pool.QueryRow(ctx, `SELECT count(*) FROM delivery_queue WHERE webhook_id = $1`, e.ordered).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left > 0 {
				rows, _ := e.f.Pool.Query(ctx, `SELECT status FROM delivery_queue WHERE webhook_id = $1`, e.ordered)
				st, err := pgx.CollectRows(rows, pgx.RowTo[string])
				t.Fatalf("writers done, %d of %d delivered, nothing claimable, %d left queued: %v (%v)", delivered, writers*batches, left, st, err)
			}
		}
	}
	if n := e.f.CountWhere(t, "delivery_queue", "webhook_id", e.ordered); n != 0 {
		t.Fatalf("%d rows left in the ordered webhook's queue", n)
	}
}

// TestFailHeldPromotes: a paused ordered webhook's held head and the rows waiting behind it fail
// together once older than the cutoff; a conversation's rows queued after the cutoff are
// promoted (held) and go out in order after the webhook resumes.
func TestFailHeldPromotes(t *testing.T) {
	e := newOrderingEnv(t)
	ctx := context.Background()
	if _, err := e.f.Store.SetWebhookStatus(ctx, e.org, e.ordered, store.WebhookPaused); err != nil {
		t.Fatal(err)
	}
	e.store(0, "x1", "x2")
	e.f.Exec(t, `DELETE FROM delivery_queue WHERE webhook_id = $1`, e.plain)
	cutoff := time.Now() // the next batch is created after it
	e.store(0, "x3", "x4")
	e.f.Exec(t, `DELETE FROM delivery_queue WHERE webhook_id = $1`, e.plain)
	n, err := e.f.Store.FailHeld(ctx, cutoff, "held too long")
	if err != nil || n != 2 {
		t.Fatalf("FailHeld: %d %v, want x1 and x2", n, err)
	}
	var held, waiting int
	if err := e.f.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'held'), count(*) FILTER (WHERE status = 'waiting')
		FROM delivery_queue WHERE webhook_id = $1`, e.ordered).Scan(&held, &waiting); err != nil {
		t.Fatal(err)
	}
	if held != 1 || waiting != 1 {
		t.Fatalf("after FailHeld: %d held, %d waiting; want x3 held, x4 waiting", held, waiting)
	}
	if _, err := e.f.Store.SetWebhookStatus(ctx, e.org, e.ordered, store.WebhookActive); err != nil {
		t.Fatal(err)
	}
	e.want(e.claim(), "ordered:x3")
	e.record("ordered:x3", true, 0)
	e.want(e.claim(), "ordered:x4")
}

// TestPromoteStranded: a conversation whose head was ended without promoting the rows behind
// it (as an older release, still running during a rolling upgrade, ends heads) is found by the
// maintenance and its first waiting row promoted; a conversation with a live head is left alone.
func TestPromoteStranded(t *testing.T) {
	e := newOrderingEnv(t)
	ctx := context.Background()
	e.store(0, "x1", "x2", "x3", "y1", "y2")
	e.f.Exec(t, `DELETE FROM delivery_queue WHERE webhook_id = $1`, e.plain)
	e.want(e.claim(), "ordered:x1", "ordered:y1")
	// x1 ended the old way: its row deleted, nothing promoted
	e.f.Exec(t, `DELETE FROM delivery_queue WHERE delivery_id = $1`, e.claimedID("ordered:x1"))
	e.want(e.claim())
	n, err := e.f.Store.PromoteStranded(ctx)
	if err != nil || n != 1 {
		t.Fatalf("PromoteStranded: %d %v, want x's conversation only", n, err)
	}
	e.want(e.claim(), "ordered:x2")
	if n, err := e.f.Store.PromoteStranded(ctx); err != nil || n != 0 {
		t.Fatalf("PromoteStranded again: %d %v, want none", n, err)
	}
}

// claimedID returns the delivery id of the claimed "<hook>:<name>".
func (e *orderingEnv) claimedID(which string) uuid.UUID {
	e.t.Helper()
	for id, d := range e.claimed {
		if e.hookName(d.WebhookID)+":"+e.names[d.EventID] == which {
			delete(e.claimed, id)
			return id
		}
	}
	e.t.Fatalf("%s is not claimed", which)
	return uuid.Nil
}

// TestOrderedHandOffUnderConcurrentIntake: an ordered webhook's delivery is handed off only
// when it is its conversation's first with nothing queued (a later one of the same post, or
// one stored while the head is in flight, waits), and two intakes storing a new conversation's
// first messages at once hand off at most one of them: the events insert takes the
// conversation's lock, and the intake that gets it second sees the first one's head.
func TestOrderedHandOffUnderConcurrentIntake(t *testing.T) {
	e := newOrderingEnv(t)
	ctx := context.Background()
	e.want(e.store(10, "x1", "x2"), "ordered:x1", "plain:x1", "plain:x2")
	e.want(e.store(10, "x3"), "plain:x3") // x1 in flight: x3 waits behind x2
	if n := testenv.QueryValue[int](t, e.f, `SELECT count(*) FROM delivery_queue WHERE webhook_id = $1 AND status = 'waiting'`, e.ordered); n != 2 {
		t.Fatalf("%d of x's deliveries waiting, want 2 (x2, x3)", n)
	}

	// A test transaction holds conversation z's lock while two intakes store z1 and z2.
	tx, err := e.f.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back below already: a no-op
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, store.ConversationKey("111", "z")); err != nil {
		t.Fatal(err)
	}
	handed := make(chan []store.ClaimedDelivery, 2)
	for _, n := range []string{"z1", "z2"} {
		go func() {
			res, err := e.f.Store.StoreEvents(ctx, []store.IncomingItem{{Type: "messages", PhoneNumberID: "111", Customer: "z",
				DedupeKey: "m:" + n, Data: json.RawMessage(fmt.Sprintf(`{"message":{"id":%q,"from":"z"}}`, n))}},
				store.Claim{Instance: "i1", Lease: 24 * time.Hour, Max: 10})
			if err != nil {
				t.Error(err)
			}
			handed <- res.Claimed
		}()
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		return testenv.QueryValue[int](t, e.f, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'`) == 2
	}, "both intakes waiting on z's lock")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	ordered := 0
	for range 2 {
		for _, d := range <-handed {
			if d.WebhookID == e.ordered {
				ordered++
				if d.Conversation == nil || *d.Conversation != store.ConversationKey("111", "z") {
					t.Fatalf("handed-off ordered delivery without its conversation: %+v", d)
				}
			}
		}
	}
	live := testenv.QueryValue[int](t, e.f, `SELECT count(*) FROM delivery_queue WHERE webhook_id = $1 AND conversation = $2 AND status <> 'waiting'`,
		e.ordered, store.ConversationKey("111", "z"))
	if ordered != 1 || live != 1 {
		t.Fatalf("z: %d ordered deliveries handed off, %d live rows; want 1 and 1 (the other waiting)", ordered, live)
	}
}
