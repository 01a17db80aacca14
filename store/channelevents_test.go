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

// channelEvent is a stored channel_status event as delivered.
type channelEvent struct {
	ID            uuid.UUID               `json:"id"`
	Type          string                  `json:"type"`
	ChannelID     uuid.UUID               `json:"channel_id"`
	PhoneNumberID string                  `json:"phone_number_id"`
	Data          store.ChannelStatusData `json:"data"`
}

// channelEvents returns the channel_status events of channel id in their order, with the
// number of deliveries of each.
func channelEvents(t *testing.T, f *testenv.Fixture, id uuid.UUID) ([]channelEvent, []int) {
	t.Helper()
	rows, err := f.Pool.Query(context.Background(), `
		SELECT e.payload, (SELECT count(*) FROM deliveries d WHERE d.event_id = e.id)
		FROM events e WHERE e.channel_id = $1 AND e.type = 'channel_status' ORDER BY e.id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var evs []channelEvent
	var deliveries []int
	for rows.Next() {
		var payload []byte
		var n int
		var e channelEvent
		if err := rows.Scan(&payload, &n); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(payload, &e); err != nil {
			t.Fatalf("event %s: %v", payload, err)
		}
		evs, deliveries = append(evs, e), append(deliveries, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return evs, deliveries
}

// orgStore is a fresh store with one org.
func orgStore(t *testing.T) (*testenv.Fixture, *store.Store, store.Org) {
	t.Helper()
	f := testenv.NewStore(t)
	return f, f.Store, f.Org(t)
}

// connected is a channel connected on number pn of business account waba.
func connected(t *testing.T, f *testenv.Fixture, org store.Org, pn, waba string) store.Channel {
	t.Helper()
	return f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: pn, WabaID: waba, UpstreamToken: "t"}})
}

// expectTransitions checks the channel's channel_status events: (previous, status, reason) each.
func expectTransitions(t *testing.T, f *testenv.Fixture, id uuid.UUID, want ...[3]string) []channelEvent {
	t.Helper()
	evs, _ := channelEvents(t, f, id)
	got := make([][3]string, len(evs))
	for i, e := range evs {
		got[i] = [3]string{e.Data.PreviousStatus, e.Data.Status, e.Data.Reason}
	}
	if len(got) != len(want) {
		t.Fatalf("channel_status events %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("channel_status events %v, want %v", got, want)
		}
	}
	return evs
}

// TestChannelStatusTransitions: each change of a channel's state stores exactly one
// channel_status event, and a change that leaves the state as it was stores none.
func TestChannelStatusTransitions(t *testing.T) {
	f, s, org := orgStore(t)
	ctx := context.Background()
	c := f.Channel(t, org.ID)
	expectTransitions(t, f, c.ID) // created pending: no event

	conn := store.Connection{PhoneNumberID: "p1", WabaID: "w1", UpstreamToken: "t"}
	if err := s.CompleteConnection(ctx, c.ID, conn); err != nil {
		t.Fatal(err)
	}
	evs := expectTransitions(t, f, c.ID, [3]string{"pending", "active", "connected"})
	if e := evs[0]; e.Type != "channel_status" || e.ChannelID != c.ID || e.PhoneNumberID != "p1" {
		t.Fatalf("event %+v", e)
	}
	// connecting an active channel again changes no state
	if err := s.ConnectChannel(ctx, c.ID, conn); err != nil {
		t.Fatal(err)
	}
	expectTransitions(t, f, c.ID, [3]string{"pending", "active", "connected"})

	// a dead token is announced once, however many calls meet it
	for i := 0; i < 3; i++ {
		if err := s.MarkUpstreamDisconnected(ctx, c.ID); err != nil {
			t.Fatal(err)
		}
	}
	expectTransitions(t, f, c.ID, [3]string{"pending", "active", "connected"},
		[3]string{"active", "upstream_disconnected", "upstream_token_invalid"})

	if err := s.ConnectChannel(ctx, c.ID, conn); err != nil {
		t.Fatal(err)
	}
	// the operator deactivates, twice: one event
	for i := 0; i < 2; i++ {
		if _, err := s.DeactivateChannel(ctx, c.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.DeactivateChannel(ctx, uuid.New()); !errors.Is(err, store.ErrChannelNotFound) {
		t.Fatalf("deactivating an unknown channel: %v", err)
	}
	// a dead token on an inactive channel changes no state
	if err := s.MarkUpstreamDisconnected(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteChannel(ctx, org.ID, c.ID, false); err != nil {
		t.Fatal(err)
	}
	expectTransitions(t, f, c.ID, [3]string{"pending", "active", "connected"},
		[3]string{"active", "upstream_disconnected", "upstream_token_invalid"},
		[3]string{"upstream_disconnected", "active", "reconnected"},
		[3]string{"active", "inactive", "operator"},
		[3]string{"inactive", "deleted", "deleted"})
}

// TestChannelStatusUpstreamChanges: the account changes the inbound handler applies announce
// each channel they change, with the reason, and only the channels whose state changes.
func TestChannelStatusUpstreamChanges(t *testing.T) {
	f, s, org := orgStore(t)
	ctx := context.Background()
	a := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "pa", WabaID: "w", DisplayPhoneNumber: "+1 555 0101", UpstreamToken: "t"}})
	b := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "pb", WabaID: "w", DisplayPhoneNumber: "+1 555 0102", UpstreamToken: "t"}})
	other := connected(t, f, org, "po", "w2")

	if ok, err := s.DeactivateByDisplayNumber(ctx, "w", "15550101"); err != nil || !ok {
		t.Fatalf("number removed: %v %v", ok, err)
	}
	if n, err := s.DeactivateByWaba(ctx, "w", store.ReasonAccountBanned); err != nil || n != 1 {
		t.Fatalf("account banned: %d %v, want 1 channel changed", n, err)
	}
	if n, err := s.DeactivateByWaba(ctx, "w", store.ReasonAccountDeleted); err != nil || n != 0 {
		t.Fatalf("account deleted after the ban: %d %v, want none changed", n, err)
	}
	connected := [3]string{"pending", "active", "connected"}
	expectTransitions(t, f, a.ID, connected, [3]string{"active", "inactive", "number_removed"})
	expectTransitions(t, f, b.ID, connected, [3]string{"active", "inactive", "account_banned"})
	expectTransitions(t, f, other.ID, connected)

	if n, err := s.DeactivateByWaba(ctx, "w2", store.ReasonAccountDeleted); err != nil || n != 1 {
		t.Fatalf("account deleted: %d %v", n, err)
	}
	expectTransitions(t, f, other.ID, connected, [3]string{"active", "inactive", "account_deleted"})
}

// TestChannelStatusDeliveries: a channel_status event goes to the webhooks subscribed to it that
// cover the channel — for a deleted channel, those that covered it at the moment of deletion —
// and a channel never connected has a null phone_number_id.
func TestChannelStatusDeliveries(t *testing.T) {
	f, s, org := orgStore(t)
	ctx := context.Background()
	c := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: f.Connection()})
	d := f.Channel(t, org.ID)
	orgWide, _ := f.Webhook(t, org.ID, "https://r.example/org", &testenv.WebhookOpts{Events: []string{"channel_status"}})
	assigned, _ := f.Webhook(t, org.ID, "https://r.example/c", &testenv.WebhookOpts{Events: []string{"channel_status"}, ChannelIDs: []uuid.UUID{c.ID}})
	f.Webhook(t, org.ID, "https://r.example/msgs", &testenv.WebhookOpts{Events: []string{"messages"}})
	f.Webhook(t, f.Org(t).ID, "https://r.example/other-org", &testenv.WebhookOpts{Events: []string{"channel_status"}})

	if _, err := s.DeleteChannel(ctx, org.ID, c.ID, false); !errors.Is(err, store.ErrChannelActive) {
		t.Fatalf("deleting an active channel without force: %v", err)
	}
	if _, err := s.DeleteChannel(ctx, org.ID, c.ID, true); err != nil {
		t.Fatal(err)
	}
	evs, deliveries := channelEvents(t, f, c.ID)
	if len(evs) != 2 || evs[1].Data.Status != "deleted" || evs[1].Data.PreviousStatus != "active" {
		t.Fatalf("events of the deleted channel: %+v", evs)
	}
	if deliveries[1] != 2 {
		t.Fatalf("the deletion went to %d webhooks, want 2 (org-wide and assigned)", deliveries[1])
	}
	for _, w := range []uuid.UUID{orgWide.ID, assigned.ID} {
		if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM deliveries WHERE webhook_id = $1 AND event_id = $2`, w, evs[1].ID); n != 1 {
			t.Errorf("webhook %s: %d deliveries of the deletion", w, n)
		}
	}
	if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM delivery_queue WHERE event_id = $1 AND status = 'pending'`, evs[1].ID); n != 2 {
		t.Errorf("%d queued deliveries of the deletion, want 2", n)
	}

	// a pending channel deleted: previous pending, phone_number_id null
	if _, err := s.DeleteChannel(ctx, org.ID, d.ID, false); err != nil {
		t.Fatal(err)
	}
	var payload []byte
	if err := f.Pool.QueryRow(ctx, `SELECT payload FROM events WHERE channel_id = $1`, d.ID).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	var e map[string]json.RawMessage
	if err := json.Unmarshal(payload, &e); err != nil || string(e["phone_number_id"]) != "null" ||
		string(e["data"]) != `{"status":"deleted","previous_status":"pending","reason":"deleted"}` {
		t.Fatalf("pending channel deleted: %s %v", payload, err)
	}
	if _, err := s.DeleteChannel(ctx, org.ID, d.ID, false); !errors.Is(err, store.ErrChannelNotFound) {
		t.Fatalf("deleting it again: %v", err)
	}
}

// TestChannelStatusMissingPartition: a change of state on a day whose history partition is
// missing makes it and succeeds.
func TestChannelStatusMissingPartition(t *testing.T) {
	f, s, org := orgStore(t)
	ctx := context.Background()
	c := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: f.Connection()})
	later := time.Now().AddDate(0, 0, 30)
	s.SetClock(clock.NewStub(later))
	defer s.SetClock(nil)
	if _, err := s.DeactivateChannel(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM events WHERE channel_id = $1 AND created_at >= $2`, c.ID, later.Add(-time.Minute)); n != 1 {
		t.Fatalf("%d events on the later day", n)
	}
}

// TestTemplateEventsByWaba: an item without a phone number id is routed by its business
// account: one event per channel of that account, each with its channel's number, and a
// re-send is a duplicate.
func TestTemplateEventsByWaba(t *testing.T) {
	f, s, org := orgStore(t)
	ctx := context.Background()
	a, b := connected(t, f, org, "pa", "w"), connected(t, f, org, "pb", "w")
	connected(t, f, org, "po", "w2")
	f.Webhook(t, org.ID, "https://r.example/t", &testenv.WebhookOpts{Events: []string{"message_template_status_update"}})
	items := []store.IncomingItem{
		{Type: "message_template_status_update", WabaID: "w", DedupeKey: "t:1:{}", Data: json.RawMessage(`{"template":{"event":"APPROVED"}}`)},
		{Type: "message_template_status_update", WabaID: "unknown", DedupeKey: "t:1:{}", Data: json.RawMessage(`{"template":{}}`)},
		{Type: "messages", PhoneNumberID: "pa", DedupeKey: "m:1", Data: json.RawMessage(`{}`)},
	}
	res, err := s.StoreEvents(ctx, items, store.Claim{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Events != 3 || res.Unknown != 1 || res.Deliveries != 2 || res.ByType["message_template_status_update"] != 2 {
		t.Fatalf("stored %+v, want 3 events (2 template), 1 unknown, 2 deliveries", res)
	}
	for _, c := range []store.Channel{a, b} {
		var payload []byte
		if err := f.Pool.QueryRow(ctx, `SELECT payload FROM events WHERE channel_id = $1 AND type = 'message_template_status_update'`, c.ID).Scan(&payload); err != nil {
			t.Fatalf("channel %s: %v", c.ID, err)
		}
		var e store.Event
		if err := json.Unmarshal(payload, &e); err != nil || e.ChannelID != c.ID || string(e.Data) != `{"template":{"event":"APPROVED"}}` {
			t.Fatalf("template event %s %v", payload, err)
		}
		if pn := map[uuid.UUID]string{a.ID: "pa", b.ID: "pb"}[c.ID]; e.PhoneNumberID != pn {
			t.Fatalf("phone_number_id %q, want %q", e.PhoneNumberID, pn)
		}
	}
	if res, err = s.StoreEvents(ctx, items[:1], store.Claim{}); err != nil || res.Events != 0 || res.Duplicates != 2 {
		t.Fatalf("re-send: %+v %v, want 2 duplicates", res, err)
	}
}
