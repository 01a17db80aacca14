package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// timelineEnv is an org with a connected channel (and its number), for the timeline's tests.
type timelineEnv struct {
	f    *testenv.Fixture
	org  uuid.UUID
	ch   store.Channel
	pnid string
}

func newTimelineEnv(t *testing.T) *timelineEnv {
	f := testenv.NewStore(t)
	e := &timelineEnv{f: f, org: f.Org(t).ID}
	e.ch, e.pnid = e.channel(t, e.org)
	return e
}

// channel connects a new channel of org; it returns it with its phone number id.
func (e *timelineEnv) channel(t *testing.T, org uuid.UUID) (store.Channel, string) {
	conn := e.f.Connection()
	conn.DisplayPhoneNumber = "+1 555 " + conn.PhoneNumberID
	return e.f.Channel(t, org, &testenv.ChannelOpts{Connection: conn}), conn.PhoneNumberID
}

// post stores, as one upstream post to number pnid, the given statuses and messages (JSON
// objects), through inbound.Parse as the inbound handler does.
func (e *timelineEnv) post(t *testing.T, pnid string, statuses, messages []string) store.InboundResult {
	t.Helper()
	body := `{"object":"whatsapp_business_account","entry":[{"id":"waba","changes":[{"field":"messages","value":{
		"metadata":{"phone_number_id":"` + pnid + `"},"statuses":[` + strings.Join(statuses, ",") + `],"messages":[` + strings.Join(messages, ",") + `]}}]}]}`
	b, err := inbound.Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.f.Store.StoreEvents(context.Background(), b.Items, store.Claim{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// status is an upstream status object.
func status(wamid, st string, ts int64, recipient string) string {
	return fmt.Sprintf(`{"id":%q,"status":%q,"timestamp":"%d","recipient_id":%q}`, wamid, st, ts, recipient)
}

// messageRow reads a message's status, rank and recipient ("", 0, "" when it has no row).
func (e *timelineEnv) messageRow(t *testing.T, wamid string) (status string, rank int, recipient string) {
	t.Helper()
	err := e.f.Pool.QueryRow(context.Background(), `SELECT status, status_rank, recipient FROM messages WHERE wamid = $1`, wamid).
		Scan(&status, &rank, &recipient)
	if err != nil && !strings.Contains(err.Error(), "no rows") {
		t.Fatal(err)
	}
	return
}

// TestMessageStatusForwardOnly: statuses arriving out of order never move a message's latest
// status backwards (a late delivered leaves read), failed is final, and the first status creates
// the message's row (recipient from the status, created at its timestamp).
func TestMessageStatusForwardOnly(t *testing.T) {
	e := newTimelineEnv(t)
	const w = "wamid.FORWARD"
	steps := []struct{ status, want string }{
		{"sent", "sent"},
		{"read", "read"},
		{"delivered", "read"}, // late
		{"sent", "read"},      // a re-send of an old state is a duplicate anyway
		{"failed", "failed"},
		{"accepted", "failed"},
	}
	sentAt := time.Now().Add(-time.Minute).Truncate(time.Second)
	arrived := time.Now()
	for i, s := range steps {
		e.post(t, e.pnid, []string{status(w, s.status, sentAt.Unix()+int64(i), "15550001111")}, nil)
		got, rank, recipient := e.messageRow(t, w)
		if got != s.want {
			t.Fatalf("after %s: status %q, want %q", s.status, got, s.want)
		}
		if r, _ := store.StatusRank(got); r != rank {
			t.Errorf("after %s: rank %d, want %d", s.status, rank, r)
		}
		if recipient != "15550001111" {
			t.Errorf("recipient %q", recipient)
		}
	}
	// read after failed: still failed (a new state: not a duplicate)
	e.post(t, e.pnid, []string{status("wamid.F2", "failed", 1, "1"), status("wamid.F2", "read", 2, "1")}, nil)
	if got, _, _ := e.messageRow(t, "wamid.F2"); got != "failed" {
		t.Errorf("failed then read in one post: %q", got)
	}
	// The row created by the first status: this channel, this org, created when the status
	// arrived (no relay call: the message was sent around the relay), not at the upstream's
	// timestamp (a minute old here; days, or garbage, elsewhere).
	var ch, org uuid.UUID
	var created time.Time
	if err := e.f.Pool.QueryRow(context.Background(), `SELECT channel_id, org_id, created_at FROM messages WHERE wamid = $1`, w).
		Scan(&ch, &org, &created); err != nil {
		t.Fatal(err)
	}
	if ch != e.ch.ID || org != e.org || created.Before(arrived.Truncate(time.Microsecond)) || created.After(time.Now()) {
		t.Errorf("row: channel %s org %s created %s", ch, org, created)
	}
}

// TestMessageStatusOneStatement: a post holding several states of one message (and of others)
// applies the highest of each, in one statement (no "cannot affect row a second time"), and a
// failed status carries its error into the row.
func TestMessageStatusOneStatement(t *testing.T) {
	e := newTimelineEnv(t)
	failed := `{"id":"wamid.B2","status":"failed","timestamp":"5","recipient_id":"2","errors":[{"code":131026,"title":"Message undeliverable.","message":"x"}]}`
	res := e.post(t, e.pnid, []string{
		status("wamid.B1", "delivered", 2, "1"), status("wamid.B1", "read", 3, "1"), status("wamid.B1", "sent", 1, "1"),
		failed, status("wamid.B3", "sent", 1, "3"),
	}, nil)
	if res.Events != 5 {
		t.Fatalf("%d events stored", res.Events)
	}
	for w, want := range map[string]string{"wamid.B1": "read", "wamid.B2": "failed", "wamid.B3": "sent"} {
		if got, _, _ := e.messageRow(t, w); got != want {
			t.Errorf("%s: %q, want %q", w, got, want)
		}
	}
	code := testenv.QueryValue[*int](t, e.f, `SELECT error_code FROM messages WHERE wamid = 'wamid.B2'`)
	title := testenv.QueryValue[*string](t, e.f, `SELECT error_title FROM messages WHERE wamid = 'wamid.B2'`)
	at := testenv.QueryValue[time.Time](t, e.f, `SELECT status_at FROM messages WHERE wamid = 'wamid.B2'`)
	if code == nil || *code != 131026 || title == nil || *title != "Message undeliverable." || at.Unix() != 5 {
		t.Errorf("failed row: code %v title %v at %s", code, title, at)
	}
	if n := testenv.QueryValue[int](t, e.f, `SELECT count(*) FROM messages WHERE error_code IS NOT NULL`); n != 1 {
		t.Errorf("%d rows with an error, want 1", n)
	}
}

// TestMessageStatusDuplicatesDoNotApply: an upstream re-send of a status already stored is a
// duplicate event and leaves the message alone.
func TestMessageStatusDuplicatesDoNotApply(t *testing.T) {
	e := newTimelineEnv(t)
	s := status("wamid.DUP", "delivered", 10, "1")
	e.post(t, e.pnid, []string{s}, nil)
	// The row is put back (as if a later relay write had raced it): a re-send must not apply again.
	e.f.Exec(t, `UPDATE messages SET status = 'accepted', status_rank = 0 WHERE wamid = 'wamid.DUP'`)
	if res := e.post(t, e.pnid, []string{s}, nil); res.Duplicates != 1 || res.Events != 0 {
		t.Fatalf("re-send: %+v", res)
	}
	if got, _, _ := e.messageRow(t, "wamid.DUP"); got != "accepted" {
		t.Errorf("a duplicate moved the status to %q", got)
	}
}

// TestMessageStatusOtherChannel: a status for a message id whose row belongs to another channel
// (of another org) leaves that row alone; the event is stored all the same. Unknown upstream
// statuses are stored as events and leave messages alone.
func TestMessageStatusOtherChannel(t *testing.T) {
	e := newTimelineEnv(t)
	otherOrg := e.f.Org(t).ID
	other, _ := e.channel(t, otherOrg)
	e.f.Exec(t, `INSERT INTO messages (wamid, org_id, channel_id, recipient) VALUES ('wamid.OTHER', $1, $2, 'theirs')`, otherOrg, other.ID)
	res := e.post(t, e.pnid, []string{status("wamid.OTHER", "read", 1, "mine"), status("wamid.NEW", "deleted", 1, "1"),
		status("wamid.NEW2", "warning", 1, "1")}, nil)
	if res.Events != 3 {
		t.Fatalf("%d events", res.Events)
	}
	if got, _, recipient := e.messageRow(t, "wamid.OTHER"); got != "accepted" || recipient != "theirs" {
		t.Errorf("other channel's row: %q %q", got, recipient)
	}
	if n := e.f.Count(t, "messages"); n != 1 {
		t.Errorf("%d messages rows, want 1 (unknown statuses make none)", n)
	}
	if n := testenv.QueryValue[int](t, e.f, `SELECT count(*) FROM events WHERE wamid IN ('wamid.OTHER', 'wamid.NEW', 'wamid.NEW2')`); n != 3 {
		t.Errorf("%d events with their wamid, want 3", n)
	}
}

// insertMessages adds n outgoing messages to a channel as the relay and the statuses would:
// "wamid.<prefix><i>", sent to recipient "r<i%3>" with idempotency key "k<i>" (relay_log),
// a second apart (pairs of them at the same time, so that the wamid breaks ties), starting
// three minutes ago (within UnreportedWindow); status by i%5, where a message whose status is accepted (i%5 == 0) has no messages
// row (the upstream has not reported on it yet) and the others have the row their first status
// made, created at the send's second.
func (e *timelineEnv) insertMessages(t *testing.T, ch store.Channel, prefix string, n int) {
	base := time.Now().UTC().Add(-3 * time.Minute).Truncate(time.Second)
	var calls []store.RelayCall
	for i := range n {
		calls = append(calls, store.RelayCall{At: base.Add(time.Duration(i/2) * time.Second), OrgID: e.org, ChannelID: ch.ID,
			Status: 200, Outcome: "ok", IdempotencyKey: fmt.Sprintf("k%d", i), Recipient: fmt.Sprintf("r%d", i%3),
			WAMID: fmt.Sprintf("wamid.%s%d", prefix, i)})
	}
	if err := e.f.Store.WriteRelayLog(context.Background(), calls); err != nil {
		t.Fatal(err)
	}
	e.f.Exec(t, `
		INSERT INTO messages (wamid, org_id, channel_id, recipient, created_at, status, status_rank)
		SELECT 'wamid.' || $3 || i, $1, $2, 'r' || (i % 3), $4::timestamptz + (i / 2) * interval '1 second',
		       (ARRAY['accepted','sent','delivered','read','failed'])[i % 5 + 1], i % 5
		FROM generate_series(0, $5 - 1) i WHERE i % 5 <> 0`, e.org, ch.ID, prefix, base, n)
}

// pages follows a channel's list by pages of limit messages to its end and returns the wamids.
func (e *timelineEnv) pages(t *testing.T, channel uuid.UUID, limit int) []string {
	t.Helper()
	var out []string
	f := store.MessageFilter{Limit: limit}
	for {
		page, err := e.f.Store.ListMessages(context.Background(), e.org, channel, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range page {
			out = append(out, m.WAMID)
		}
		if len(page) < f.Limit {
			return out
		}
		f.After = page[len(page)-1].WAMID
	}
}

// TestListMessages: a channel's messages newest first (created_at, then wamid, descending) —
// those a status reported on and those only the relay log knows (accepted) merged —, by pages
// that cover every message once, filtered by status, recipient and search (wamid, recipient,
// idempotency key); another org's channel is not found, and a cursor naming no message of the
// channel is refused.
func TestListMessages(t *testing.T) {
	e := newTimelineEnv(t)
	ctx := context.Background()
	e.insertMessages(t, e.ch, "A", 23)
	other, _ := e.channel(t, e.org)
	e.insertMessages(t, other, "B", 5)

	all, err := e.f.Store.ListMessages(ctx, e.org, e.ch.ID, store.MessageFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 23 {
		t.Fatalf("%d messages, want 23", len(all))
	}
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if a.CreatedAt.Before(b.CreatedAt) || a.CreatedAt.Equal(b.CreatedAt) && a.WAMID < b.WAMID {
			t.Errorf("order: %s (%s) before %s (%s)", a.WAMID, a.CreatedAt, b.WAMID, b.CreatedAt)
		}
	}
	if all[0].WAMID != "wamid.A22" || all[1].WAMID != "wamid.A21" || all[2].WAMID != "wamid.A20" || all[0].ChannelID != e.ch.ID {
		t.Errorf("first: %+v %s %s", all[0], all[1].WAMID, all[2].WAMID)
	}
	if all[0].To != "r1" || all[0].Status != "delivered" || all[0].IdempotencyKey == nil || *all[0].IdempotencyKey != "k22" || all[0].Error != nil {
		t.Errorf("fields: %+v", all[0])
	}

	// pages of 4 (the pairs sharing a time are split across pages too)
	paged := e.pages(t, e.ch.ID, 4)
	var want []string
	for _, m := range all {
		want = append(want, m.WAMID)
	}
	if strings.Join(paged, " ") != strings.Join(want, " ") {
		t.Errorf("pages:\n%v\nwant\n%v", paged, want)
	}

	count := func(f store.MessageFilter) []string {
		t.Helper()
		f.Limit = 100
		ms, err := e.f.Store.ListMessages(ctx, e.org, e.ch.ID, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range ms {
			out = append(out, m.WAMID)
		}
		return out
	}
	if got := count(store.MessageFilter{Status: "failed"}); strings.Join(got, " ") != "wamid.A19 wamid.A14 wamid.A9 wamid.A4" {
		t.Errorf("failed: %v", got)
	}
	if got := count(store.MessageFilter{To: "r2"}); len(got) != 7 || got[0] != "wamid.A20" {
		t.Errorf("to r2: %v", got)
	}
	if got := count(store.MessageFilter{To: "r2", Status: "delivered"}); strings.Join(got, " ") != "wamid.A17 wamid.A2" {
		t.Errorf("to r2, delivered: %v", got)
	}
	for search, want := range map[string]string{"wamid.A7": "wamid.A7", "k8": "wamid.A8", "wamid.B1": "", "nothing": ""} {
		if got := count(store.MessageFilter{Search: search}); strings.Join(got, " ") != want {
			t.Errorf("search %q: %v, want %q", search, got, want)
		}
	}
	if got := count(store.MessageFilter{Search: "r0"}); len(got) != 8 {
		t.Errorf("search by recipient: %d messages, want 8", len(got))
	}
	// accepted: the sends no status reported on, with their keys from the relay log
	if got := count(store.MessageFilter{Status: "accepted"}); strings.Join(got, " ") != "wamid.A20 wamid.A15 wamid.A10 wamid.A5 wamid.A0" {
		t.Errorf("accepted: %v", got)
	}
	for _, m := range all {
		if m.IdempotencyKey == nil || *m.IdempotencyKey != "k"+strings.TrimPrefix(m.WAMID, "wamid.A") {
			t.Errorf("%s: key %v", m.WAMID, m.IdempotencyKey)
		}
	}
	// a recipient written as a phone number matches the status's digits and the caller's form
	e.f.Exec(t, `UPDATE messages SET recipient = '15550100' WHERE wamid = 'wamid.A3'`)
	if err := e.f.Store.WriteRelayLog(ctx, []store.RelayCall{{At: time.Now(), OrgID: e.org, ChannelID: e.ch.ID, Status: 200,
		Outcome: "ok", Recipient: "+1 555-0100", WAMID: "wamid.PHONE"}}); err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{"+1 555 0100", "15550100", "+1 (555) 01-00"} {
		if got := count(store.MessageFilter{To: to}); strings.Join(got, " ") != "wamid.PHONE wamid.A3" {
			t.Errorf("to %q: %v", to, got)
		}
	}
	// the other channel's message is no cursor here; an unknown one neither
	for _, c := range []string{"wamid.B1", "wamid.NONE"} {
		if _, err := e.f.Store.ListMessages(ctx, e.org, e.ch.ID, store.MessageFilter{After: c, Limit: 5}); !errors.Is(err, store.ErrCursorNotFound) {
			t.Errorf("cursor %s: %v", c, err)
		}
	}
	// the last message as cursor: an empty page, no error
	if ms, err := e.f.Store.ListMessages(ctx, e.org, e.ch.ID, store.MessageFilter{After: "wamid.A0", Limit: 5}); err != nil || len(ms) != 0 {
		t.Errorf("after the last: %v %v", ms, err)
	}
	otherOrg := e.f.Org(t).ID
	for _, org := range []uuid.UUID{otherOrg} {
		if _, err := e.f.Store.ListMessages(ctx, org, e.ch.ID, store.MessageFilter{Limit: 5}); !errors.Is(err, store.ErrChannelNotFound) {
			t.Errorf("other org: %v", err)
		}
	}
	if _, err := e.f.Store.ListMessages(ctx, e.org, uuid.New(), store.MessageFilter{Limit: 5}); !errors.Is(err, store.ErrChannelNotFound) {
		t.Errorf("unknown channel: %v", err)
	}
	// sends not reported on at one instant, paged by two: every one once, wamid descending
	tied, _ := e.channel(t, e.org)
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Microsecond)
	var calls []store.RelayCall
	for _, w := range []string{"wamid.T3", "wamid.T1", "wamid.T5", "wamid.T2", "wamid.T4"} {
		calls = append(calls, store.RelayCall{At: at, OrgID: e.org, ChannelID: tied.ID, Status: 200, Outcome: "ok", WAMID: w})
	}
	if err := e.f.Store.WriteRelayLog(ctx, calls); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(e.pages(t, tied.ID, 2), " "); got != "wamid.T5 wamid.T4 wamid.T3 wamid.T2 wamid.T1" {
		t.Errorf("tied sends by pages of 2: %s", got)
	}
	// a channel without messages: an empty page
	empty, _ := e.channel(t, e.org)
	if ms, err := e.f.Store.ListMessages(ctx, e.org, empty.ID, store.MessageFilter{Limit: 5}); err != nil || len(ms) != 0 {
		t.Errorf("empty channel: %v %v", ms, err)
	}
}

// TestMessageTimelineOutgoing: a message's relay call, its statuses in upstream timestamp order
// (whatever their arrival order), its error, and the deliveries of its status events to each
// of the org's webhooks that take them; another org never sees it.
func TestMessageTimelineOutgoing(t *testing.T) {
	e := newTimelineEnv(t)
	ctx := context.Background()
	ws := map[uuid.UUID]bool{}
	for range 2 {
		w, _ := e.f.Webhook(t, e.org, "https://h.example.com", &testenv.WebhookOpts{Events: []string{"message_status"}})
		ws[w.ID] = true
	}
	e.f.Webhook(t, e.org, "https://m.example.com", &testenv.WebhookOpts{Events: []string{"messages"}}) // takes none
	const w = "wamid.OUT/+="
	relayAt := time.Now().UTC().Add(-time.Minute).Truncate(time.Microsecond)
	// the send, and a retry of it answered from the idempotency store
	if err := e.f.Store.WriteRelayLog(ctx, []store.RelayCall{
		{At: relayAt, OrgID: e.org, ChannelID: e.ch.ID, Status: 200, Outcome: "ok", Latency: 123456 * time.Microsecond,
			IdempotencyKey: "key-1", Recipient: "15551234567", WAMID: w},
		{At: relayAt.Add(time.Second), OrgID: e.org, ChannelID: e.ch.ID, Status: 200, Outcome: "replayed",
			IdempotencyKey: "key-1", Recipient: "15551234567", WAMID: w, Replayed: true},
	}); err != nil {
		t.Fatal(err)
	}
	// before any status: accepted, from the relay log alone
	tl, err := e.f.Store.MessageTimeline(ctx, e.org, w)
	if err != nil {
		t.Fatal(err)
	}
	if tl.Status != "accepted" || tl.Direction != store.DirectionOutgoing || tl.ChannelID != e.ch.ID || tl.To == nil || *tl.To != "15551234567" ||
		!tl.CreatedAt.Equal(relayAt) || tl.Relay == nil || !tl.Relay.Replayed || len(tl.Statuses) != 0 {
		t.Errorf("before any status: %+v", tl)
	}
	// read (t=300) arrives before delivered (t=200), sent (t=100) last
	e.post(t, e.pnid, []string{status(w, "read", 300, "15551234567")}, nil)
	e.post(t, e.pnid, []string{status(w, "delivered", 200, "15551234567")}, nil)
	e.post(t, e.pnid, []string{status(w, "sent", 100, "15551234567")}, nil)

	tl, err = e.f.Store.MessageTimeline(ctx, e.org, w)
	if err != nil {
		t.Fatal(err)
	}
	if tl.WAMID != w || tl.ChannelID != e.ch.ID || tl.Direction != store.DirectionOutgoing || tl.Status != "read" || tl.Error != nil ||
		tl.To == nil || *tl.To != "15551234567" || tl.From == nil || *tl.From != "+1 555 "+e.pnid || !tl.CreatedAt.Equal(relayAt) {
		t.Errorf("timeline: %+v", tl)
	}
	if r := tl.Relay; r == nil || !r.At.Equal(relayAt) || r.Status != 200 || r.LatencyUS != 123456 || r.IdempotencyKey == nil || *r.IdempotencyKey != "key-1" || !r.Replayed {
		t.Errorf("relay call: %+v", tl.Relay)
	}
	var got []string
	for _, s := range tl.Statuses {
		got = append(got, fmt.Sprintf("%s@%d", s.Status, s.Timestamp.Unix()))
	}
	if strings.Join(got, " ") != "sent@100 delivered@200 read@300" {
		t.Errorf("statuses: %v", got)
	}
	if len(tl.Deliveries) != 6 {
		t.Fatalf("%d deliveries, want 6: %+v", len(tl.Deliveries), tl.Deliveries)
	}
	events := map[uuid.UUID]bool{}
	for _, s := range tl.Statuses {
		events[s.EventID] = true
	}
	for _, d := range tl.Deliveries {
		if !ws[d.WebhookID] || !events[d.EventID] || d.Type != "message_status" || d.Status != "pending" || d.Attempts != 0 {
			t.Errorf("delivery %+v", d)
		}
	}
	// a delivered one shows as delivered, with its attempts
	e.f.Exec(t, `UPDATE deliveries SET status = 'delivered', attempts = 2 WHERE id = (SELECT delivery_id FROM delivery_queue LIMIT 1)`)
	e.f.Exec(t, `DELETE FROM delivery_queue WHERE delivery_id = (SELECT id FROM deliveries WHERE status = 'delivered')`)
	tl, _ = e.f.Store.MessageTimeline(ctx, e.org, w)
	n := 0
	for _, d := range tl.Deliveries {
		if d.Status == "delivered" && d.Attempts == 2 {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d delivered deliveries, want 1", n)
	}

	// a failed message: its error; no relay call
	e.post(t, e.pnid, []string{`{"id":"wamid.FAIL","status":"failed","timestamp":"7","recipient_id":"9","errors":[{"code":131047,"title":"Re-engagement message"}]}`}, nil)
	tl, err = e.f.Store.MessageTimeline(ctx, e.org, "wamid.FAIL")
	if err != nil {
		t.Fatal(err)
	}
	if tl.Relay != nil || tl.Status != "failed" || tl.Error == nil || tl.Error.Code != 131047 || tl.Error.Title != "Re-engagement message" ||
		len(tl.Statuses) != 1 || tl.Statuses[0].Error == nil || tl.Statuses[0].Error.Code != 131047 {
		t.Errorf("failed: %+v %+v", tl, tl.Statuses)
	}

	for _, c := range []struct {
		org   uuid.UUID
		wamid string
	}{{e.f.Org(t).ID, w}, {e.org, "wamid.UNKNOWN"}, {e.org, ""}, {e.org, "bad\x00id"}, {e.org, strings.Repeat("x", 300)}} {
		if _, err := e.f.Store.MessageTimeline(ctx, c.org, c.wamid); !errors.Is(err, store.ErrMessageNotFound) {
			t.Errorf("%s in org %s: %v", c.wamid, c.org, err)
		}
	}
}

// TestMessageTimelineIncoming: an incoming message's timeline is its event: direction incoming,
// status received, the sender, no relay call and no statuses, and its deliveries.
func TestMessageTimelineIncoming(t *testing.T) {
	e := newTimelineEnv(t)
	ctx := context.Background()
	hook, _ := e.f.Webhook(t, e.org, "https://h.example.com", &testenv.WebhookOpts{Events: []string{"messages"}})
	e.f.Webhook(t, e.org, "https://s.example.com", &testenv.WebhookOpts{Events: []string{"message_status"}}) // takes none
	e.post(t, e.pnid, nil, []string{`{"from":"15557654321","id":"wamid.IN","timestamp":"1749416383","type":"text","text":{"body":"hi"}}`})
	if n := e.f.Count(t, "messages"); n != 0 {
		t.Errorf("an incoming message made %d messages rows", n)
	}
	tl, err := e.f.Store.MessageTimeline(ctx, e.org, "wamid.IN")
	if err != nil {
		t.Fatal(err)
	}
	if tl.Direction != store.DirectionIncoming || tl.Status != store.MessageReceived || tl.ChannelID != e.ch.ID || tl.Relay != nil ||
		tl.From == nil || *tl.From != "15557654321" || tl.To == nil || *tl.To != "+1 555 "+e.pnid || len(tl.Statuses) != 0 || tl.Error != nil {
		t.Errorf("timeline: %+v", tl)
	}
	if len(tl.Deliveries) != 1 || tl.Deliveries[0].WebhookID != hook.ID || tl.Deliveries[0].Type != "messages" || tl.Deliveries[0].Status != "pending" {
		t.Errorf("deliveries: %+v", tl.Deliveries)
	}
	if _, err := e.f.Store.MessageTimeline(ctx, e.f.Org(t).ID, "wamid.IN"); !errors.Is(err, store.ErrMessageNotFound) {
		t.Errorf("other org: %v", err)
	}
}

// TestUnreportedWindow: a send no status reported on is listed from the relay log (accepted) for
// UnreportedWindow and not after, when its timeline still finds it by its wamid; a reported
// one of the same age is listed (its messages row), a replay never.
func TestUnreportedWindow(t *testing.T) {
	e := newTimelineEnv(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	old := now.Add(-store.UnreportedWindow - time.Minute)
	call := func(at time.Time, wamid string, replayed bool) store.RelayCall {
		return store.RelayCall{At: at, OrgID: e.org, ChannelID: e.ch.ID, Status: 200, Outcome: "ok", Recipient: "+1 555-0199",
			IdempotencyKey: "key-" + wamid, WAMID: wamid, Replayed: replayed}
	}
	if err := e.f.Store.WriteRelayLog(ctx, []store.RelayCall{
		call(old, "wamid.OLD", false),
		call(old.Add(2*time.Second), "wamid.REPORTED", false),
		call(now.Add(-time.Minute), "wamid.YOUNG", false), call(now.Add(-time.Minute+time.Second), "wamid.YOUNG", true),
	}); err != nil {
		t.Fatal(err)
	}
	e.post(t, e.pnid, []string{status("wamid.REPORTED", "delivered", old.Unix()+3, "15550199")}, nil)
	ms, err := e.f.Store.ListMessages(ctx, e.org, e.ch.ID, store.MessageFilter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.WAMID+" "+m.Status)
	}
	if strings.Join(got, ", ") != "wamid.YOUNG accepted, wamid.REPORTED delivered" {
		t.Fatalf("list: %s", got)
	}
	if ms[0].To != "+1 555-0199" || ms[0].IdempotencyKey == nil || *ms[0].IdempotencyKey != "key-wamid.YOUNG" || !ms[0].CreatedAt.Equal(now.Add(-time.Minute)) {
		t.Errorf("the unreported send: %+v", ms[0])
	}
	tl, err := e.f.Store.MessageTimeline(ctx, e.org, "wamid.OLD")
	if err != nil || tl.Status != "accepted" || tl.Relay == nil || !tl.CreatedAt.Equal(old) {
		t.Fatalf("an old unreported send's timeline: %+v %v", tl, err)
	}
}

// TestMessageCreatedAtIsTheRelayTime: a message's created_at is its relay call's time, to the
// microsecond, whichever comes first, the call's log row or the message's first status, so that
// two sends within one second list in the order they were sent; a status with no call (a message
// sent around the relay) keeps its own time and stops waiting for one after RelayPendingFor.
func TestMessageCreatedAtIsTheRelayTime(t *testing.T) {
	e := newTimelineEnv(t)
	ctx := context.Background()
	second := time.Now().UTC().Truncate(time.Second).Add(-10 * time.Second)
	call := func(wamid string, ms int) store.RelayCall {
		return store.RelayCall{At: second.Add(time.Duration(ms) * time.Millisecond), OrgID: e.org, ChannelID: e.ch.ID,
			Status: 200, Outcome: "ok", Recipient: "15550100", WAMID: wamid}
	}
	row := func(wamid string) (created time.Time, pending *bool) {
		t.Helper()
		if err := e.f.Pool.QueryRow(ctx, `SELECT created_at, relay_pending FROM messages WHERE wamid = $1`, wamid).
			Scan(&created, &pending); err != nil {
			t.Fatalf("%s: %v", wamid, err)
		}
		return created, pending
	}
	// The log first: the statuses (posted newest send first, one upstream second for both)
	// take the calls' times.
	a, b := call("wamid.A", 100), call("wamid.B", 600)
	if err := e.f.Store.WriteRelayLog(ctx, []store.RelayCall{a, b}); err != nil {
		t.Fatal(err)
	}
	e.post(t, e.pnid, []string{status("wamid.B", "sent", second.Unix(), "15550100"), status("wamid.A", "sent", second.Unix(), "15550100")}, nil)
	for _, c := range []store.RelayCall{a, b} {
		if created, pending := row(c.WAMID); !created.Equal(c.At) || pending != nil {
			t.Errorf("%s after its call: created %v pending %v, want %v", c.WAMID, created, pending, c.At)
		}
	}
	// The statuses first (C's after D's): the rows wait; the batch that logs the calls gives
	// them the calls' times.
	c, d := call("wamid.C", 2100), call("wamid.D", 2700)
	arrived := time.Now().Truncate(time.Microsecond)
	e.post(t, e.pnid, []string{status("wamid.D", "delivered", second.Unix()+2, "15550100")}, nil)
	e.post(t, e.pnid, []string{status("wamid.C", "sent", second.Unix()+2, "15550100")}, nil)
	if created, pending := row("wamid.C"); created.Before(arrived) || pending == nil || !*pending {
		t.Errorf("C before its call: created %v pending %v", created, pending)
	}
	if err := e.f.Store.WriteRelayLog(ctx, []store.RelayCall{c, d}); err != nil {
		t.Fatal(err)
	}
	if err := e.f.Store.SettleMessages(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []store.RelayCall{c, d} {
		if created, pending := row(c.WAMID); !created.Equal(c.At) || pending != nil {
			t.Errorf("%s after its call: created %v pending %v, want %v", c.WAMID, created, pending, c.At)
		}
	}
	ms, err := e.f.Store.ListMessages(ctx, e.org, e.ch.ID, store.MessageFilter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.WAMID)
	}
	if strings.Join(got, " ") != "wamid.D wamid.C wamid.B wamid.A" {
		t.Errorf("list: %v, want the order of the sends", got)
	}

	// Sent around the relay: a young row keeps waiting through a settle, an old one (its status
	// stored longer than RelayPendingFor ago) is let go (by the writer's settle, and by Maintain
	// with the log off), their times unchanged.
	now := time.Now().UTC()
	e.post(t, e.pnid, []string{status("wamid.AROUND-YOUNG", "sent", now.Unix(), "15550100"),
		status("wamid.AROUND-OLD", "sent", now.Unix(), "15550100"), status("wamid.AROUND-MAINTAIN", "sent", now.Unix(), "15550100")}, nil)
	oldAt := now.Add(-store.RelayPendingFor - time.Minute).Truncate(time.Microsecond)
	e.f.Exec(t, `UPDATE messages SET created_at = $1 WHERE wamid IN ('wamid.AROUND-OLD', 'wamid.AROUND-MAINTAIN')`, oldAt)
	e.f.Exec(t, `UPDATE messages SET relay_pending = NULL WHERE wamid = 'wamid.AROUND-MAINTAIN'`) // (kept for Maintain below)
	if err := e.f.Store.SettleMessages(ctx); err != nil {
		t.Fatal(err)
	}
	if _, pending := row("wamid.AROUND-YOUNG"); pending == nil {
		t.Error("a young row without its call stopped waiting")
	}
	if created, pending := row("wamid.AROUND-OLD"); pending != nil || !created.Equal(oldAt) {
		t.Errorf("an old row without its call: created %v pending %v, want %v and let go", created, pending, oldAt)
	}
	e.f.Exec(t, `UPDATE messages SET relay_pending = true WHERE wamid = 'wamid.AROUND-MAINTAIN'`)
	// A status whose upstream timestamp is years old (re-sent late, or a wrong clock) makes a row
	// of now, which the retention keeps.
	e.post(t, e.pnid, []string{status("wamid.AROUND-2023", "sent", 1700000100, "15550100")}, nil)
	e.f.Store.Maintain(ctx, store.RetentionPolicy{}, nil)
	if created, _ := row("wamid.AROUND-2023"); created.Before(now) {
		t.Errorf("a row of an old status: created %v", created)
	}
	if created, pending := row("wamid.AROUND-MAINTAIN"); pending != nil || !created.Equal(oldAt) {
		t.Errorf("Maintain: created %v pending %v, want %v and let go", created, pending, oldAt)
	}
	if _, pending := row("wamid.AROUND-YOUNG"); pending == nil {
		t.Error("Maintain let go of a young row")
	}
}

// TestMessageReadsBounded: what a channel's page reads — its list, filtered by status
// or recipient, searched by wamid, recipient or key, and its per-minute chart — is bounded
// whatever its log holds: measured in rows read (EXPLAIN ANALYZE of the statements the reads
// run), before and after a flood of refusals (counted by the writer, and 20,000 relay_log rows
// of them as a log from before migration 023 holds) and 3,000 more reported sends in the
// unreported window; another org's channel reads the same rows as before the flood.
func TestMessageReadsBounded(t *testing.T) {
	e := newTimelineEnv(t)
	ctx := context.Background()
	otherOrg := e.f.Org(t).ID
	other, _ := e.channel(t, otherOrg)
	e.insertMessages(t, e.ch, "a", 100)
	now := time.Now().UTC()
	var calls []store.RelayCall
	for i := range 20 {
		calls = append(calls, store.RelayCall{At: now.Add(-time.Duration(i) * time.Second), OrgID: otherOrg, ChannelID: other.ID,
			Status: 200, Outcome: "ok", Recipient: "15550001111", WAMID: fmt.Sprintf("wamid.other%d", i)})
	}
	if err := e.f.Store.WriteRelayLog(ctx, calls); err != nil {
		t.Fatal(err)
	}

	type read struct {
		name string
		f    store.MessageFilter
	}
	reads := []read{
		{"list", store.MessageFilter{}}, {"accepted", store.MessageFilter{Status: "accepted"}},
		{"delivered", store.MessageFilter{Status: "delivered"}}, {"to", store.MessageFilter{To: "r1"}},
		{"search wamid", store.MessageFilter{Search: "wamid.a7"}}, {"search to", store.MessageFilter{Search: "r2"}},
		{"search key", store.MessageFilter{Search: "k5"}},
	}
	// cost returns the rows each read of a channel of org reads, by read and table.
	cost := func(org uuid.UUID, ch uuid.UUID) map[string]map[string]float64 {
		out := map[string]map[string]float64{}
		for _, r := range reads {
			r.f.Limit = 51 // the dashboard's page and one more
			out[r.name] = testenv.ReadCost(t, e.f.DSN, func(s *store.Store) {
				if _, err := s.ListMessages(ctx, org, ch, r.f); err != nil {
					t.Fatalf("%s: %v", r.name, err)
				}
			})
		}
		out["chart"] = testenv.ReadCost(t, e.f.DSN, func(s *store.Store) {
			if _, err := s.SendsPerMinute(ctx, org, ch, time.Now().Add(-24*time.Hour)); err != nil {
				t.Fatal(err)
			}
		})
		// the dashboard's 7-day chart: hours summed from the minutes, in the same one query
		out["chart 7d"] = testenv.ReadCost(t, e.f.DSN, func(s *store.Store) {
			if _, err := s.SendsPerBucket(ctx, org, ch, time.Now().Add(-7*24*time.Hour), time.Hour); err != nil {
				t.Fatal(err)
			}
		})
		return out
	}
	before, otherBefore := cost(e.org, e.ch.ID), cost(otherOrg, other.ID)

	// The flood: 50,000 refusals over a minute through the writer's path (counted), 20,000 rows
	// of refusals written one by one (a log from before migration 023), 3,000 sends reported on.
	calls = calls[:0]
	for i := range 50000 {
		calls = append(calls, store.RelayCall{At: now.Add(-time.Duration(i%60) * time.Second), OrgID: e.org, ChannelID: e.ch.ID,
			Status: 429, Outcome: "rate_limited", IdempotencyKey: strings.Repeat("k", 255), Recipient: strings.Repeat("9", 256)})
	}
	if err := e.f.Store.WriteRelayLog(ctx, calls); err != nil {
		t.Fatal(err)
	}
	if n := e.f.CountWhere(t, "relay_counts", "channel_id", e.ch.ID); n > 60 {
		t.Fatalf("50,000 refusals in 60 seconds made %d relay_counts rows", n)
	}
	e.f.Exec(t, `
		INSERT INTO relay_log (at, org_id, channel_id, status, outcome, latency_us, idempotency_key, recipient)
		SELECT $3::timestamptz - (i % 300) * interval '1 second', $1, $2, 429, 'rate_limited', 10, repeat('k', 255), repeat('9', 256)
		FROM generate_series(1, 20000) i`, e.org, e.ch.ID, now)
	e.f.Exec(t, `
		INSERT INTO relay_log (at, org_id, channel_id, status, outcome, latency_us, recipient, wamid)
		SELECT $3::timestamptz - (i % 500) * interval '1 second', $1, $2, 200, 'ok', 10, '15552223333', 'wamid.flood' || i
		FROM generate_series(1, 3000) i`, e.org, e.ch.ID, now)
	e.f.Exec(t, `
		INSERT INTO messages (wamid, org_id, channel_id, recipient, created_at, status, status_rank)
		SELECT 'wamid.flood' || i, $1, $2, '15552223333', $3::timestamptz - (i % 500) * interval '1 second', 'delivered', 2
		FROM generate_series(1, 3000) i`, e.org, e.ch.ID, now)
	e.f.Exec(t, `ANALYZE relay_log; ANALYZE messages; ANALYZE relay_counts; ANALYZE relay_minutes`)
	after, otherAfter := cost(e.org, e.ch.ID), cost(otherOrg, other.ID)

	for _, name := range []string{"list", "accepted", "delivered", "to", "search wamid", "search to", "search key", "chart", "chart 7d"} {
		t.Logf("%-12s rows read: before %v, after the flood %v; other org's channel %v, after %v",
			name, before[name], after[name], otherBefore[name], otherAfter[name])
		// Every read of the flooded channel: the relay log read through the index of sends,
		// at most maxUnreportedScan (2,000) of the window's, however many rows it holds;
		// messages through its channel indexes and the probes of those sends; the chart's
		// minutes.
		if n := after[name]["relay_log"]; n > 2000+2*51 {
			t.Errorf("%s read %.0f relay_log rows after the flood (%.0f before)", name, n, before[name]["relay_log"])
		}
		if n := after[name]["messages"]; n > 2000+2*51 {
			t.Errorf("%s read %.0f messages rows after the flood (%.0f before)", name, n, before[name]["messages"])
		}
		if n := after[name]["relay_minutes"]; n > 1440 {
			t.Errorf("%s read %.0f relay_minutes rows", name, n)
		}
		if after[name]["relay_counts"] != 0 {
			t.Errorf("%s read relay_counts", name)
		}
		// Another org's channel reads what it read before.
		for table, n := range otherAfter[name] {
			if n > otherBefore[name][table]+5 {
				t.Errorf("other org's %s read %.0f %s rows after the flood, %.0f before", name, n, table, otherBefore[name][table])
			}
		}
	}
	// The reads that do not look for unreported sends (a status other than accepted, the chart)
	// read none of the flood's rows.
	for _, name := range []string{"delivered", "chart", "chart 7d"} {
		if n := after[name]["relay_log"]; n > 60 {
			t.Errorf("%s read %.0f relay_log rows after the flood", name, n)
		}
	}
}
