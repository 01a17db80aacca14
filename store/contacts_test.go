package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// incoming is an upstream message from customer on number pnid, sent at sent.
func incoming(pnid, customer, id string, sent time.Time) store.IncomingItem {
	return store.IncomingItem{Type: "messages", PhoneNumberID: pnid, DedupeKey: "m:" + id, Customer: customer,
		WAMID: id, Sent: sent, Data: json.RawMessage(`{"message":{"id":"` + id + `"}}`)}
}

// lastInbound returns the channel's recorded time for customer (zero: no row).
func lastInbound(t *testing.T, f *testenv.Fixture, ch uuid.UUID, customer string) time.Time {
	t.Helper()
	var at time.Time
	err := f.Pool.QueryRow(context.Background(), `SELECT last_inbound_at FROM contacts WHERE channel_id = $1 AND wa_id = $2`,
		ch, customer).Scan(&at)
	if err == pgx.ErrNoRows {
		return time.Time{}
	}
	if err != nil {
		t.Fatal(err)
	}
	return at.UTC()
}

// listenContacts returns a connection listening on the contacts channel, and a function that
// returns the next notification's updates.
func listenContacts(t *testing.T, f *testenv.Fixture) func() []store.ContactUpdate {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, f.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+store.ContactsNotifyChannel); err != nil {
		t.Fatal(err)
	}
	return func() []store.ContactUpdate {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, testenv.Patience)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return store.ParseContactsNotification(n.Payload)
	}
}

// TestContactsNewestWins: intake records each customer's newest incoming timestamp; a late
// webhook carrying an older message never moves it back (and announces nothing), a newer one
// moves it forward and is announced; statuses, customers that are not digits and messages
// without a timestamp record nothing; a timestamp in the future is recorded as the intake's now.
func TestContactsNewestWins(t *testing.T) {
	f, org := storeWithChannel(t)
	ch := testenv.QueryValue[uuid.UUID](t, f, `SELECT id FROM channels WHERE org_id = $1`, org.ID)
	ctx := context.Background()
	next := listenContacts(t, f)
	clk := clock.NewStub(time.Now())
	f.Store.SetClock(clk)
	t0 := clk.Now().Add(-time.Hour).Truncate(time.Second)
	put := func(items ...store.IncomingItem) {
		t.Helper()
		if _, err := f.Store.StoreEvents(ctx, items, store.Claim{}); err != nil {
			t.Fatal(err)
		}
	}

	put(incoming("1", "15550100", "a", t0))
	if got := lastInbound(t, f, ch, "15550100"); !got.Equal(t0) {
		t.Fatalf("first message: %v, want %v", got, t0)
	}
	if u := next(); len(u) != 1 || u[0] != (store.ContactUpdate{ChannelID: ch, WAID: "15550100", LastInboundAt: t0}) {
		t.Fatalf("notification: %+v", u)
	}

	// a late webhook: an older message, stored after the newer one
	put(incoming("1", "15550100", "late", t0.Add(-30*time.Minute)))
	if got := lastInbound(t, f, ch, "15550100"); !got.Equal(t0) {
		t.Fatalf("after a late webhook: %v, want %v (never moved back)", got, t0)
	}
	// ... announced nothing: the next notification is the next move's
	t1 := t0.Add(10 * time.Minute)
	put(incoming("1", "15550100", "b", t1))
	if got := lastInbound(t, f, ch, "15550100"); !got.Equal(t1) {
		t.Fatalf("a newer message: %v, want %v", got, t1)
	}
	if u := next(); len(u) != 1 || !u[0].LastInboundAt.Equal(t1) {
		t.Fatalf("notification after the late webhook and a newer message: %+v, want only the newer one", u)
	}
	// a re-sent copy of it (a duplicate) changes nothing
	put(incoming("1", "15550100", "b", t1))
	if got := lastInbound(t, f, ch, "15550100"); !got.Equal(t1) {
		t.Fatalf("after a duplicate: %v", got)
	}

	// recorded: only incoming messages from a wa_id, with a timestamp
	status := incoming("1", "15550101", "s", t1)
	status.Type, status.DedupeKey = "message_status", "s:x:sent"
	put(status, incoming("1", "user.abc", "u", t1), incoming("1", "15550102", "n", time.Time{}))
	if n := f.Count(t, "contacts"); n != 1 {
		t.Fatalf("%d contacts after a status, a user id and a message without timestamp; want 1", n)
	}

	// a timestamp ahead of the intake's clock is recorded as the intake's time
	put(incoming("1", "15550103", "f", clk.Now().Add(48*time.Hour)))
	if got := lastInbound(t, f, ch, "15550103"); !got.Equal(clk.Now()) {
		t.Fatalf("future timestamp recorded as %v, want the intake's %v", got, clk.Now())
	}
}

// TestContactsBatch: one batch of many customers, some of them several times and in any order,
// across two channels: one row per channel and customer with its newest timestamp, the two
// channels' rows apart, every move announced (in notifications of at most 64 lines).
func TestContactsBatch(t *testing.T) {
	f := testenv.NewStore(t)
	org := f.Org(t)
	c1 := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "1", WabaID: "w", UpstreamToken: "t"}})
	c2 := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "2", WabaID: "w", UpstreamToken: "t"}})
	next := listenContacts(t, f)
	base := time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Second)
	const customers = 300
	var items []store.IncomingItem
	for i := range customers {
		wa := fmt.Sprintf("1555%04d", customers-1-i) // in descending order: the statement sorts them
		// on number 1: two messages, the newer first; on number 2: one, an hour later
		items = append(items,
			incoming("1", wa, "n"+wa, base.Add(time.Duration(i)*time.Second+time.Minute)),
			incoming("1", wa, "o"+wa, base.Add(time.Duration(i)*time.Second)),
			incoming("2", wa, "t"+wa, base.Add(time.Hour)))
	}
	if _, err := f.Store.StoreEvents(context.Background(), items, store.Claim{}); err != nil {
		t.Fatal(err)
	}
	if n := f.Count(t, "contacts"); n != 2*customers {
		t.Fatalf("%d contacts, want %d", n, 2*customers)
	}
	for i := range customers {
		wa := fmt.Sprintf("1555%04d", customers-1-i)
		if got, want := lastInbound(t, f, c1.ID, wa), base.Add(time.Duration(i)*time.Second+time.Minute); !got.Equal(want) {
			t.Fatalf("channel 1, %s: %v, want %v", wa, got, want)
		}
		if got, want := lastInbound(t, f, c2.ID, wa), base.Add(time.Hour); !got.Equal(want) {
			t.Fatalf("channel 2, %s: %v, want %v", wa, got, want)
		}
	}
	seen := map[store.ContactUpdate]bool{}
	for len(seen) < 2*customers {
		u := next()
		if len(u) == 0 || len(u) > 64 {
			t.Fatalf("a notification of %d updates", len(u))
		}
		for _, x := range u {
			seen[x] = true
		}
	}
	if len(seen) != 2*customers {
		t.Fatalf("%d distinct updates announced, want %d", len(seen), 2*customers)
	}
}

// TestContactWindowRead: ContactWindow reads the customer's row and the channel's receiving time
// (active: the later of its connection and the start of the record), and refuses another org's
// channel; WindowSnapshot returns the customers who wrote after since, newest first, bounded.
func TestContactWindowRead(t *testing.T) {
	f := testenv.NewStore(t)
	org := f.Org(t)
	channel := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "1", WabaID: "w", UpstreamToken: "t"}})
	ch := channel.ID
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	connected, since := now.Add(-50*time.Hour), now.Add(-30*time.Hour)
	f.Exec(t, `UPDATE channels SET connected_at = $2, contacts_since = $3 WHERE id = $1`, ch, connected, since)
	var items []store.IncomingItem
	for i := range 5 {
		items = append(items, incoming("1", fmt.Sprintf("100%d", i), fmt.Sprint(i), now.Add(-time.Duration(i)*10*time.Hour)))
	}
	if _, err := f.Store.StoreEvents(ctx, items, store.Claim{}); err != nil {
		t.Fatal(err)
	}

	w, err := f.Store.ContactWindow(ctx, org.ID, ch, "1001")
	if err != nil || !w.LastInboundAt.Equal(now.Add(-10*time.Hour)) || !w.ReceivingSince.Equal(since) || w.At.IsZero() {
		t.Fatalf("ContactWindow: %+v %v", w, err)
	}
	if w, err := f.Store.ContactWindow(ctx, org.ID, ch, "999"); err != nil || !w.LastInboundAt.IsZero() {
		t.Fatalf("a customer never heard from: %+v %v", w, err)
	}
	other := f.Org(t)
	if _, err := f.Store.ContactWindow(ctx, other.ID, ch, "1001"); err != store.ErrChannelNotFound {
		t.Fatalf("another org's channel: %v", err)
	}
	// the relay's view of the channel carries the same receiving time
	if rc, err := f.Store.RelayChannelByToken(ctx, channel.ChannelToken); err != nil || !rc.ReceivingSince.Equal(since) {
		t.Fatalf("relay channel: receiving since %v (%v), want %v", rc.ReceivingSince, err, since)
	}
	f.Exec(t, `UPDATE channels SET status = 'inactive', inactive_reason = 'operator' WHERE id = $1`, ch)
	if w, err := f.Store.ContactWindow(ctx, org.ID, ch, "1001"); err != nil || !w.ReceivingSince.IsZero() {
		t.Fatalf("an inactive channel is not receiving: %+v %v", w, err)
	}
	if rc, err := f.Store.RelayChannelByToken(ctx, channel.ChannelToken); err != nil || !rc.ReceivingSince.IsZero() {
		t.Fatalf("an inactive relay channel: receiving since %v (%v)", rc.ReceivingSince, err)
	}
	f.Exec(t, `UPDATE channels SET status = 'active', inactive_reason = NULL WHERE id = $1`, ch)

	// the last 24 hours: customers 1000, 1001 and 1002 (0, 10 and 20 hours ago)
	snap, err := f.Store.WindowSnapshot(ctx, ch, now.Add(-24*time.Hour), 10)
	if err != nil || len(snap.Open) != 3 || snap.Truncated ||
		!snap.Open["1002"].Equal(now.Add(-20*time.Hour)) {
		t.Fatalf("snapshot: %+v %v", snap, err)
	}
	snap, err = f.Store.WindowSnapshot(ctx, ch, now.Add(-24*time.Hour), 2)
	if err != nil || len(snap.Open) != 2 || !snap.Truncated || !snap.Open["1000"].Equal(now) || !snap.Open["1001"].Equal(now.Add(-10*time.Hour)) {
		t.Fatalf("bounded snapshot: %+v %v (want the 2 newest, truncated)", snap, err)
	}
	if _, err := f.Store.WindowSnapshot(ctx, uuid.New(), now, 2); err != store.ErrChannelNotFound {
		t.Fatalf("unknown channel: %v", err)
	}
}

// TestWindowRefusalLogged: a send the relay refused for a closed window (outcome window_closed)
// is a relay_log row with its status and the upstream's code 131047, though it is a refusal (the
// other refusals are only counted).
func TestWindowRefusalLogged(t *testing.T) {
	f, org := storeWithChannel(t)
	ch := testenv.QueryValue[uuid.UUID](t, f, `SELECT id FROM channels WHERE org_id = $1`, org.ID)
	at := time.Now().UTC()
	if err := f.Store.WriteRelayLog(context.Background(), []store.RelayCall{
		{At: at, OrgID: org.ID, ChannelID: ch, Status: 400, Outcome: "window_closed", ErrorCode: 131047, Recipient: "15550100", IdempotencyKey: "k"},
		{At: at, OrgID: org.ID, ChannelID: ch, Status: 429, Outcome: "rate_limited"},
	}); err != nil {
		t.Fatal(err)
	}
	if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM relay_log WHERE channel_id = $1 AND outcome = 'window_closed'
		AND status = 400 AND error_code = 131047 AND recipient = '15550100'`, ch); n != 1 {
		t.Fatalf("%d window_closed rows, want 1", n)
	}
	if n := f.Count(t, "relay_log"); n != 1 {
		t.Fatalf("%d relay_log rows, want 1 (the 429 is counted)", n)
	}
}
