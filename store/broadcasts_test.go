package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// broadcastEnv is a store on a stub clock with an org and an active channel of it.
type broadcastEnv struct {
	f   *testenv.Fixture
	s   *store.Store
	clk *clock.Stub
	org uuid.UUID
	ch  uuid.UUID
}

func newBroadcastEnv(t *testing.T) *broadcastEnv {
	t.Helper()
	f := testenv.NewStore(t)
	clk := clock.NewStub(time.Now())
	f.Store.SetClock(clk)
	org := f.Org(t)
	ch := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: f.Connection()})
	return &broadcastEnv{f: f, s: f.Store, clk: clk, org: org.ID, ch: ch.ID}
}

const testTemplate = `{"name": "hello", "language": {"code": "en"}, "components": [{"type": "body"}]}`

// create creates a broadcast of n recipients "1000", "1001", … at rate, starting at start.
func (e *broadcastEnv) create(t *testing.T, n, rate int, start time.Time) store.Broadcast {
	t.Helper()
	nb := store.NewBroadcast{Name: "b", Template: json.RawMessage(testTemplate), StartAt: start, RatePerMinute: rate}
	for i := range n {
		nb.Recipients = append(nb.Recipients, store.NewRecipient{To: fmt.Sprint(1000 + i)})
	}
	b, err := e.s.CreateBroadcast(context.Background(), e.org, e.ch, nb)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (e *broadcastEnv) get(t *testing.T, id uuid.UUID) store.Broadcast {
	t.Helper()
	b, err := e.s.GetBroadcast(context.Background(), e.org, id)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (e *broadcastEnv) recipients(t *testing.T, id uuid.UUID, status string) []store.BroadcastRecipient {
	t.Helper()
	rs, err := e.s.BroadcastRecipients(context.Background(), e.org, id, status, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestBroadcastCreateAndRead: a broadcast is created with its recipients as given (the
// caller deduplicates), read with its counts, listed newest first, its recipients paged by seq;
// another org reads none of it; a channel that is not active takes none.
func TestBroadcastCreateAndRead(t *testing.T) {
	ctx := context.Background()
	e := newBroadcastEnv(t)
	now := e.clk.Now()
	nb := store.NewBroadcast{Name: "spring", Template: json.RawMessage(testTemplate), StartAt: now.Add(time.Hour), RatePerMinute: 60,
		Recipients: []store.NewRecipient{{To: "15550001"}, {To: "15550002", Components: json.RawMessage(`[{"type":"body","parameters":[{"type":"text","text":"Ann"}]}]`)}, {To: "15550003"}}}
	b, err := e.s.CreateBroadcast(ctx, e.org, e.ch, nb)
	if err != nil {
		t.Fatal(err)
	}
	if b.Status != store.BroadcastScheduled || b.Name != "spring" || b.ChannelID != e.ch || b.OrgID != e.org ||
		!b.StartAt.Equal(nb.StartAt) || b.RatePerMinute != 60 || b.PausedReason != "" ||
		b.Counts != (store.BroadcastCounts{Total: 3, Queued: 3}) {
		t.Fatalf("created %+v", b)
	}
	var tpl map[string]any
	if err := json.Unmarshal(b.Template, &tpl); err != nil || tpl["name"] != "hello" {
		t.Fatalf("template %s: %v", b.Template, err)
	}
	// starting now: sending at once
	b2 := e.create(t, 2, 60, now.Add(-time.Minute))
	if b2.Status != store.BroadcastSending || b2.Counts.Total != 2 {
		t.Fatalf("started now: %+v", b2)
	}
	list, err := e.s.ListBroadcasts(ctx, e.org, e.ch, 10)
	if err != nil || len(list) != 2 || list[0].ID != b2.ID || list[1].ID != b.ID || list[1].Counts.Total != 3 {
		t.Fatalf("list %+v %v", list, err)
	}
	if list, err := e.s.ListBroadcasts(ctx, e.org, e.ch, 1); err != nil || len(list) != 1 || list[0].ID != b2.ID {
		t.Fatalf("list limit 1: %+v %v", list, err)
	}
	rs := e.recipients(t, b.ID, "")
	if len(rs) != 3 || rs[0].Seq != 1 || rs[0].To != "15550001" || rs[1].To != "15550002" || rs[2].Status != store.RecipientQueued || rs[2].Attempts != 0 {
		t.Fatalf("recipients %+v", rs)
	}
	if page, err := e.s.BroadcastRecipients(ctx, e.org, b.ID, "", 1, 1); err != nil || len(page) != 1 || page[0].Seq != 2 {
		t.Fatalf("page after 1: %+v %v", page, err)
	}
	if rs := e.recipients(t, b.ID, "failed"); len(rs) != 0 {
		t.Fatalf("failed: %+v", rs)
	}

	// another org: not found
	other := e.f.Org(t)
	if _, err := e.s.GetBroadcast(ctx, other.ID, b.ID); !errors.Is(err, store.ErrBroadcastNotFound) {
		t.Fatalf("other org's get: %v", err)
	}
	if _, err := e.s.BroadcastRecipients(ctx, other.ID, b.ID, "", 0, 10); !errors.Is(err, store.ErrBroadcastNotFound) {
		t.Fatalf("other org's recipients: %v", err)
	}
	if _, err := e.s.ListBroadcasts(ctx, other.ID, e.ch, 10); !errors.Is(err, store.ErrChannelNotFound) {
		t.Fatalf("other org's list: %v", err)
	}
	if _, err := e.s.PauseBroadcast(ctx, other.ID, b.ID); !errors.Is(err, store.ErrBroadcastNotFound) {
		t.Fatalf("other org's pause: %v", err)
	}
	if _, err := e.s.CreateBroadcast(ctx, other.ID, e.ch, nb); !errors.Is(err, store.ErrChannelNotFound) {
		t.Fatalf("create on another org's channel: %v", err)
	}
	// a pending channel, an inactive one: not active
	pending := e.f.Channel(t, e.org)
	if _, err := e.s.CreateBroadcast(ctx, e.org, pending.ID, nb); !errors.Is(err, store.ErrChannelNotActive) {
		t.Fatalf("create on a pending channel: %v", err)
	}
	if _, err := e.s.DeactivateChannel(ctx, e.ch); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.CreateBroadcast(ctx, e.org, e.ch, nb); !errors.Is(err, store.ErrChannelNotActive) {
		t.Fatalf("create on an inactive channel: %v", err)
	}
}

// TestBroadcastCreateLarge: 100,000 recipients are created in one COPY, quickly.
func TestBroadcastCreateLarge(t *testing.T) {
	e := newBroadcastEnv(t)
	start := time.Now()
	b := e.create(t, 100_000, 600, e.clk.Now())
	took := time.Since(start)
	t.Logf("100,000 recipients created in %v", took)
	if b.Counts.Total != 100_000 || b.Counts.Queued != 100_000 {
		t.Fatalf("counts %+v", b.Counts)
	}
	if took > 10*time.Second {
		t.Fatalf("100,000 recipients took %v", took)
	}
}

// TestBroadcastTransitions: pause, resume and cancel from the states that allow them, and
// *BroadcastStateError with the current status from the others.
func TestBroadcastTransitions(t *testing.T) {
	ctx := context.Background()
	e := newBroadcastEnv(t)
	stateErr := func(err error, want string) {
		t.Helper()
		var se *store.BroadcastStateError
		if !errors.As(err, &se) || se.Status != want || err.Error() != "broadcast is "+want {
			t.Fatalf("got %v, want broadcast is %s", err, want)
		}
	}
	later := e.create(t, 2, 60, e.clk.Now().Add(time.Hour))
	_, err := e.s.ResumeBroadcast(ctx, e.org, later.ID)
	stateErr(err, "scheduled")
	b, err := e.s.PauseBroadcast(ctx, e.org, later.ID)
	if err != nil || b.Status != store.BroadcastPaused || b.PausedReason != store.PausedOperator {
		t.Fatalf("pause: %+v %v", b, err)
	}
	_, err = e.s.PauseBroadcast(ctx, e.org, later.ID)
	stateErr(err, "paused")
	if b, err = e.s.ResumeBroadcast(ctx, e.org, later.ID); err != nil || b.Status != store.BroadcastScheduled || b.PausedReason != "" {
		t.Fatalf("resume before the start: %+v %v", b, err)
	}
	if _, err = e.s.PauseBroadcast(ctx, e.org, later.ID); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(2 * time.Hour)
	if b, err = e.s.ResumeBroadcast(ctx, e.org, later.ID); err != nil || b.Status != store.BroadcastSending {
		t.Fatalf("resume after the start: %+v %v", b, err)
	}
	if b, err = e.s.CancelBroadcast(ctx, e.org, later.ID); err != nil || b.Status != store.BroadcastCancelled ||
		b.Counts != (store.BroadcastCounts{Total: 2}) {
		t.Fatalf("cancel: %+v %v", b, err)
	}
	if rs := e.recipients(t, later.ID, "cancelled"); len(rs) != 2 {
		t.Fatalf("cancelled recipients %+v", rs)
	}
	for _, f := range []func(context.Context, uuid.UUID, uuid.UUID) (store.Broadcast, error){e.s.PauseBroadcast, e.s.ResumeBroadcast, e.s.CancelBroadcast} {
		_, err = f(ctx, e.org, later.ID)
		stateErr(err, "cancelled")
	}
	// a paused broadcast can be cancelled
	p := e.create(t, 1, 60, e.clk.Now())
	if _, err = e.s.PauseBroadcast(ctx, e.org, p.ID); err != nil {
		t.Fatal(err)
	}
	if b, err = e.s.CancelBroadcast(ctx, e.org, p.ID); err != nil || b.Status != store.BroadcastCancelled {
		t.Fatalf("cancel paused: %+v %v", b, err)
	}
	if _, err = e.s.CancelBroadcast(ctx, e.org, uuid.New()); !errors.Is(err, store.ErrBroadcastNotFound) {
		t.Fatalf("cancel of none: %v", err)
	}
}

const broadcastLease = 2 * time.Minute

func (e *broadcastEnv) claim(t *testing.T) *store.BroadcastSend {
	t.Helper()
	send, _, err := e.s.ClaimBroadcastSend(context.Background(), broadcastLease)
	if err != nil {
		t.Fatal(err)
	}
	return send
}

func (e *broadcastEnv) finish(t *testing.T, send *store.BroadcastSend, o store.BroadcastOutcome) {
	t.Helper()
	if err := e.s.FinishBroadcastSend(context.Background(), send, o); err != nil {
		t.Fatal(err)
	}
}

// TestBroadcastClaimPace: the broadcasts row is the pace gate. Two claimers claim together
// at each step of the clock; exactly one send is claimed per interval (60 s / rate), and N
// claims move the gate on by exactly N intervals. A claim before the gate gets nothing and
// the gate as its wake; the body is the template message, with a recipient's own components.
func TestBroadcastClaimPace(t *testing.T) {
	ctx := context.Background()
	e := newBroadcastEnv(t)
	const rate = 600 // one send every 100 ms
	iv := 60 * time.Second / rate
	start := e.clk.Now().Add(time.Minute)
	nb := store.NewBroadcast{Name: "b", Template: json.RawMessage(testTemplate), StartAt: start, RatePerMinute: rate}
	for i := range 20 {
		nb.Recipients = append(nb.Recipients, store.NewRecipient{To: fmt.Sprint(2000 + i)})
	}
	nb.Recipients[0].Components = json.RawMessage(`[{"type":"body","parameters":[{"type":"text","text":"Ann"}]}]`)
	b, err := e.s.CreateBroadcast(ctx, e.org, e.ch, nb)
	if err != nil {
		t.Fatal(err)
	}
	// scheduled: nothing before its start, which is the wake
	send, wake, err := e.s.ClaimBroadcastSend(ctx, broadcastLease)
	if err != nil || send != nil || !wake.Equal(start) {
		t.Fatalf("before the start: %+v %v %v, want wake %v", send, wake, err, start)
	}
	e.clk.Set(start)
	const steps = 10
	seen := map[int]bool{}
	for step := range steps {
		results := make(chan *store.BroadcastSend, 2)
		errs := make(chan error, 2)
		for range 2 {
			go func() {
				send, _, err := e.s.ClaimBroadcastSend(ctx, broadcastLease)
				results <- send
				errs <- err
			}()
		}
		var got []*store.BroadcastSend
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
			if s := <-results; s != nil {
				got = append(got, s)
			}
		}
		if len(got) != 1 {
			t.Fatalf("step %d: %d sends claimed, want 1", step, len(got))
		}
		s := got[0]
		if seen[s.Seq] || s.Seq != step+1 || s.Attempt != 1 || s.BroadcastID != b.ID || s.OrgID != e.org || s.ChannelID != e.ch {
			t.Fatalf("step %d: claimed %+v", step, s)
		}
		seen[s.Seq] = true
		if want := start.Add(time.Duration(step+1) * iv); !s.NextSendAt.Equal(want) {
			t.Fatalf("step %d: gate %v, want %v", step, s.NextSendAt, want)
		}
		if step == 0 {
			var body struct {
				MessagingProduct string `json:"messaging_product"`
				RecipientType    string `json:"recipient_type"`
				To               string `json:"to"`
				Type             string `json:"type"`
				Template         struct {
					Name       string            `json:"name"`
					Language   map[string]string `json:"language"`
					Components json.RawMessage   `json:"components"`
				} `json:"template"`
			}
			if err := json.Unmarshal(s.Body, &body); err != nil || body.MessagingProduct != "whatsapp" || body.RecipientType != "individual" ||
				body.To != "2000" || body.Type != "template" || body.Template.Name != "hello" || body.Template.Language["code"] != "en" ||
				!sameJSON(body.Template.Components, `[{"type":"body","parameters":[{"type":"text","text":"Ann"}]}]`) {
				t.Fatalf("body %s: %v", s.Body, err)
			}
		} else if step == 1 && !sameJSON(s.Body, `{"messaging_product":"whatsapp","recipient_type":"individual","to":"2001","type":"template","template":`+testTemplate+`}`) {
			t.Fatalf("body %s", s.Body)
		}
		e.finish(t, s, store.BroadcastOutcome{Kind: store.OutcomeAccepted, WAMID: fmt.Sprintf("wamid.P%d", s.Seq)})
		e.clk.Advance(iv)
	}
	if got := e.get(t, b.ID); got.Status != store.BroadcastSending || got.Counts != (store.BroadcastCounts{Total: 20, Queued: 10, Accepted: 10}) {
		t.Fatalf("after %d sends: %+v", steps, got)
	}
	// fallen behind by more than an interval: the gate restarts from now, no burst
	e.clk.Advance(time.Hour)
	now := e.clk.Now()
	if s := e.claim(t); s == nil || !s.NextSendAt.Equal(now.Add(iv)) {
		t.Fatalf("after a pause: %+v, want gate %v", s, now.Add(iv))
	}
	if s := e.claim(t); s != nil {
		t.Fatalf("a second send at once: %+v", s)
	}
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a []byte, b string) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}

// TestBroadcastAtMostOnce: a claimed recipient is never claimed again; a lease that ends
// without an outcome leaves the recipient unknown, never claimed again; an outcome that comes
// after the lease's end still lands; an outcome for another attempt changes nothing.
func TestBroadcastAtMostOnce(t *testing.T) {
	e := newBroadcastEnv(t)
	b := e.create(t, 3, 60, e.clk.Now())
	a := e.claim(t)
	e.clk.Advance(time.Second)
	bb := e.claim(t)
	e.clk.Advance(time.Second)
	c := e.claim(t)
	if a == nil || bb == nil || c == nil || a.Seq != 1 || bb.Seq != 2 || c.Seq != 3 {
		t.Fatalf("claims %+v %+v %+v", a, bb, c)
	}
	e.clk.Advance(time.Minute) // (within the leases)
	if s := e.claim(t); s != nil {
		t.Fatalf("claimed again: %+v", s)
	}
	if got := e.get(t, b.ID); got.Status != store.BroadcastSending || got.Counts != (store.BroadcastCounts{Total: 3, Queued: 3}) {
		t.Fatalf("in flight: %+v", got)
	}
	e.clk.Advance(broadcastLease)
	if n, err := e.s.ExpireBroadcastLeases(context.Background()); err != nil || n != 3 {
		t.Fatalf("expired %d: %v", n, err)
	}
	if got := e.get(t, b.ID); got.Counts != (store.BroadcastCounts{Total: 3, Unknown: 3}) {
		t.Fatalf("after the leases: %+v", got)
	}
	// late outcomes land; one for another attempt does not
	e.finish(t, a, store.BroadcastOutcome{Kind: store.OutcomeAccepted, WAMID: "wamid.LATE"})
	e.finish(t, bb, store.BroadcastOutcome{Kind: store.OutcomeFailed, ErrorCode: 131047, ErrorTitle: "Re-engagement message"})
	stale := *c
	stale.Attempt = 2
	e.finish(t, &stale, store.BroadcastOutcome{Kind: store.OutcomeAccepted, WAMID: "wamid.STALE"})
	if s := e.claim(t); s != nil {
		t.Fatalf("claimed after the leases: %+v", s)
	}
	got := e.get(t, b.ID)
	if got.Status != store.BroadcastCompleted || got.Counts != (store.BroadcastCounts{Total: 3, Accepted: 1, Failed: 1, Unknown: 1}) {
		t.Fatalf("completed: %+v", got)
	}
	rs := e.recipients(t, b.ID, "")
	if rs[0].Status != "accepted" || rs[0].WAMID != "wamid.LATE" || rs[1].Status != "failed" || rs[1].ErrorCode != 131047 ||
		rs[1].ErrorTitle != "Re-engagement message" || rs[2].Status != "unknown" || rs[2].WAMID != "" || rs[2].Attempts != 1 {
		t.Fatalf("recipients %+v", rs)
	}
	// the accepted send's messages row carries the broadcast, and its statuses move the counts
	var bid uuid.UUID
	var pending bool
	if err := e.f.Pool.QueryRow(context.Background(), `SELECT broadcast_id, relay_pending FROM messages WHERE wamid = 'wamid.LATE'`).Scan(&bid, &pending); err != nil || bid != b.ID || !pending {
		t.Fatalf("messages row: %v %v %v", bid, pending, err)
	}
	if _, err := e.f.Pool.Exec(context.Background(), `UPDATE messages SET status = 'delivered', status_rank = 2 WHERE wamid = 'wamid.LATE'`); err != nil {
		t.Fatal(err)
	}
	if got := e.get(t, b.ID); got.Counts != (store.BroadcastCounts{Total: 3, Delivered: 1, Failed: 1, Unknown: 1}) {
		t.Fatalf("delivered: %+v", got.Counts)
	}
	if rs := e.recipients(t, b.ID, "delivered"); len(rs) != 1 || rs[0].Status != "delivered" || rs[0].Seq != 1 {
		t.Fatalf("delivered recipients %+v", rs)
	}
	if _, err := e.f.Pool.Exec(context.Background(), `UPDATE messages SET status = 'failed', status_rank = 4, error_code = 131026, error_title = 'Message undeliverable.' WHERE wamid = 'wamid.LATE'`); err != nil {
		t.Fatal(err)
	}
	if got := e.get(t, b.ID); got.Counts != (store.BroadcastCounts{Total: 3, Failed: 2, Unknown: 1}) {
		t.Fatalf("message failed: %+v", got.Counts)
	}
	if rs := e.recipients(t, b.ID, "failed"); len(rs) != 2 || rs[0].ErrorCode != 131026 || rs[0].Status != "failed" || rs[1].ErrorCode != 131047 {
		t.Fatalf("failed recipients %+v", rs)
	}
}

// TestBroadcastRetry: retryable errors requeue the recipient at the backoff, counting the
// attempt, until the sixth attempt fails it with the last error; a retry later than 24 h after
// the first attempt fails it too; a requeue does not count the attempt.
func TestBroadcastRetry(t *testing.T) {
	e := newBroadcastEnv(t)
	const iv = 10 * time.Millisecond // the pace of 6000 a minute
	b := e.create(t, 2, 6000, e.clk.Now())
	for attempt := 1; attempt <= 6; attempt++ {
		s := e.claim(t)
		if s == nil || s.Seq != 1 || s.Attempt != attempt {
			t.Fatalf("attempt %d: %+v", attempt, s)
		}
		retryAt := e.clk.Now().Add(time.Duration(1<<(2*attempt)) * time.Second)
		e.finish(t, s, store.BroadcastOutcome{Kind: store.OutcomeRetry, RetryAt: retryAt, ErrorCode: 130429, ErrorTitle: "Rate limit hit"})
		if attempt < 6 {
			// not before its backoff: the other recipient goes first (once), then nothing
			e.clk.Set(retryAt.Add(-time.Millisecond))
			if s := e.claim(t); s != nil && s.Seq == 1 {
				t.Fatalf("attempt %d: claimed before its backoff", attempt)
			} else if s != nil {
				e.finish(t, s, store.BroadcastOutcome{Kind: store.OutcomeRequeue, RetryAt: retryAt.Add(time.Hour)})
			}
			e.clk.Set(retryAt.Add(iv))
		}
	}
	rs := e.recipients(t, b.ID, "failed")
	if len(rs) != 1 || rs[0].Seq != 1 || rs[0].Attempts != 6 || rs[0].ErrorCode != 130429 || rs[0].ErrorTitle != "Rate limit hit" {
		t.Fatalf("failed after 6 attempts: %+v", rs)
	}
	// the other recipient was requeued (not sent) every time: no attempt counted
	if rs := e.recipients(t, b.ID, "queued"); len(rs) != 1 || rs[0].Attempts != 0 {
		t.Fatalf("requeued: %+v", rs)
	}
	// 24 h after the first attempt: failed
	e.clk.Advance(2 * time.Hour)
	s := e.claim(t)
	if s == nil || s.Seq != 2 || s.Attempt != 1 {
		t.Fatalf("second recipient: %+v", s)
	}
	e.finish(t, s, store.BroadcastOutcome{Kind: store.OutcomeRetry, RetryAt: e.clk.Now().Add(25 * time.Hour), ErrorCode: 500, ErrorTitle: "x"})
	if got := e.get(t, b.ID); got.Counts != (store.BroadcastCounts{Total: 2, Failed: 2}) {
		t.Fatalf("after 24 h: %+v", got.Counts)
	}
	e.clk.Advance(iv) // its gate
	if s := e.claim(t); s != nil {
		t.Fatalf("claimed: %+v", s)
	}
	if got := e.get(t, b.ID); got.Status != store.BroadcastCompleted {
		t.Fatalf("completed: %+v", got)
	}
}

// TestBroadcastDisconnectedAndCancel: a disconnected channel pauses the broadcast
// (upstream_disconnected) and requeues the recipient without counting the attempt; resumed, it
// is sent again; a cancel outcome cancels the broadcast and its unsent recipients.
func TestBroadcastDisconnectedAndCancel(t *testing.T) {
	ctx := context.Background()
	e := newBroadcastEnv(t)
	b := e.create(t, 3, 60, e.clk.Now())
	s := e.claim(t)
	e.finish(t, s, store.BroadcastOutcome{Kind: store.OutcomeDisconnected})
	got := e.get(t, b.ID)
	if got.Status != store.BroadcastPaused || got.PausedReason != store.PausedUpstreamDisconnected || got.Counts != (store.BroadcastCounts{Total: 3, Queued: 3}) {
		t.Fatalf("disconnected: %+v", got)
	}
	e.clk.Advance(time.Hour)
	if s := e.claim(t); s != nil {
		t.Fatalf("claimed while paused: %+v", s)
	}
	if _, err := e.s.ResumeBroadcast(ctx, e.org, b.ID); err != nil {
		t.Fatal(err)
	}
	s = e.claim(t)
	if s == nil || s.Seq != 1 || s.Attempt != 1 {
		t.Fatalf("after resume: %+v", s)
	}
	e.finish(t, s, store.BroadcastOutcome{Kind: store.OutcomeCancel})
	got = e.get(t, b.ID)
	if got.Status != store.BroadcastCancelled || got.Counts != (store.BroadcastCounts{Total: 3}) {
		t.Fatalf("cancelled: %+v", got)
	}
	if rs := e.recipients(t, b.ID, "cancelled"); len(rs) != 3 || rs[0].Attempts != 0 {
		t.Fatalf("cancelled recipients: %+v", rs)
	}
	e.clk.Advance(time.Hour)
	if s := e.claim(t); s != nil {
		t.Fatalf("claimed after cancel: %+v", s)
	}
}

// TestBroadcastCompletes: a broadcast whose recipients all have an outcome completes at the
// next claim its gate lets through; one with a recipient due later waits for it (its gate moves there).
func TestBroadcastCompletes(t *testing.T) {
	e := newBroadcastEnv(t)
	b := e.create(t, 2, 60, e.clk.Now())
	s1 := e.claim(t)
	e.finish(t, s1, store.BroadcastOutcome{Kind: store.OutcomeAccepted, WAMID: "wamid.C1"})
	e.clk.Advance(500 * time.Millisecond)
	if s := e.claim(t); s != nil {
		t.Fatalf("before the pace: %+v", s)
	}
	e.clk.Advance(time.Minute)
	s2 := e.claim(t)
	retryAt := e.clk.Now().Add(10 * time.Minute)
	e.finish(t, s2, store.BroadcastOutcome{Kind: store.OutcomeRetry, RetryAt: retryAt, ErrorCode: 131056})
	e.clk.Advance(2 * time.Minute)
	send, wake, err := e.s.ClaimBroadcastSend(context.Background(), broadcastLease)
	if err != nil || send != nil || !wake.Equal(retryAt) {
		t.Fatalf("waiting for the retry: %+v %v %v, want wake %v", send, wake, err, retryAt)
	}
	if got := e.get(t, b.ID); got.Status != store.BroadcastSending {
		t.Fatalf("waiting: %+v", got)
	}
	e.clk.Set(retryAt)
	s3 := e.claim(t)
	if s3 == nil || s3.Seq != 2 || s3.Attempt != 2 {
		t.Fatalf("retry: %+v", s3)
	}
	e.finish(t, s3, store.BroadcastOutcome{Kind: store.OutcomeAccepted, WAMID: "wamid.C2"})
	if send, wake, err = e.s.ClaimBroadcastSend(context.Background(), broadcastLease); err != nil || send != nil || !wake.Equal(s3.NextSendAt) {
		t.Fatalf("before its gate: %+v %v %v", send, wake, err)
	}
	e.clk.Set(s3.NextSendAt) // completed at the claim its gate lets through
	send, wake, err = e.s.ClaimBroadcastSend(context.Background(), broadcastLease)
	if err != nil || send != nil || !wake.IsZero() {
		t.Fatalf("done: %+v %v %v", send, wake, err)
	}
	if got := e.get(t, b.ID); got.Status != store.BroadcastCompleted || got.Counts != (store.BroadcastCounts{Total: 2, Accepted: 2}) {
		t.Fatalf("completed: %+v", got)
	}
}

// TestBroadcastDeleteChannelCancels: deleting a channel cancels its broadcasts that may still
// send, their queued recipients with them; they stay readable; a send in flight still lands;
// finished broadcasts are left as they are.
func TestBroadcastDeleteChannelCancels(t *testing.T) {
	ctx := context.Background()
	e := newBroadcastEnv(t)
	done := e.create(t, 1, 60, e.clk.Now())
	s := e.claim(t)
	e.finish(t, s, store.BroadcastOutcome{Kind: store.OutcomeAccepted, WAMID: "wamid.D1"})
	e.clk.Advance(time.Minute)
	if s := e.claim(t); s != nil {
		t.Fatalf("claimed %+v", s)
	}
	sending := e.create(t, 3, 60, e.clk.Now())
	inFlight := e.claim(t)
	scheduled := e.create(t, 2, 60, e.clk.Now().Add(time.Hour))
	paused := e.create(t, 2, 60, e.clk.Now().Add(time.Hour))
	if _, err := e.s.PauseBroadcast(ctx, e.org, paused.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.DeleteChannel(ctx, e.org, e.ch, true); err != nil {
		t.Fatal(err)
	}
	if got := e.get(t, done.ID); got.Status != store.BroadcastCompleted {
		t.Fatalf("completed one: %+v", got)
	}
	for _, b := range []store.Broadcast{sending, scheduled, paused} {
		got := e.get(t, b.ID)
		if got.Status != store.BroadcastCancelled {
			t.Fatalf("after the delete: %+v", got)
		}
	}
	if got := e.get(t, sending.ID); got.Counts != (store.BroadcastCounts{Total: 3, Queued: 1}) {
		t.Fatalf("in flight: %+v", got.Counts)
	}
	e.finish(t, inFlight, store.BroadcastOutcome{Kind: store.OutcomeAccepted, WAMID: "wamid.D2"})
	if got := e.get(t, sending.ID); got.Counts != (store.BroadcastCounts{Total: 3, Accepted: 1}) {
		t.Fatalf("landed: %+v", got.Counts)
	}
	e.clk.Advance(time.Hour)
	if s := e.claim(t); s != nil {
		t.Fatalf("claimed after the delete: %+v", s)
	}
	if _, err := e.s.ListBroadcasts(ctx, e.org, e.ch, 10); !errors.Is(err, store.ErrChannelNotFound) {
		t.Fatalf("list of a deleted channel: %v", err)
	}
}

// TestBroadcastStatusesMoveCounts: the upstream's statuses, stored by the intake, move an
// accepted send's count and its recipient's status, whether the status comes after the outcome
// or before it (the intake created the messages row; the outcome gives it the broadcast).
func TestBroadcastStatusesMoveCounts(t *testing.T) {
	e := newTimelineEnv(t)
	s := e.f.Store
	ctx := context.Background()
	nb := store.NewBroadcast{Name: "b", Template: json.RawMessage(testTemplate), StartAt: time.Now().Add(-time.Minute), RatePerMinute: 60000,
		Recipients: []store.NewRecipient{{To: "15550001"}, {To: "15550002"}}}
	b, err := s.CreateBroadcast(ctx, e.org, e.ch.ID, nb)
	if err != nil {
		t.Fatal(err)
	}
	claim := func() *store.BroadcastSend {
		t.Helper()
		for {
			send, wake, err := s.ClaimBroadcastSend(ctx, time.Minute)
			if err != nil || send != nil {
				if err != nil {
					t.Fatal(err)
				}
				return send
			}
			time.Sleep(time.Until(wake)) // (the gate: a millisecond at 60,000 a minute)
		}
	}
	first := claim()
	if err := s.FinishBroadcastSend(ctx, first, store.BroadcastOutcome{Kind: store.OutcomeAccepted, WAMID: "wamid.BA", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	e.post(t, e.pnid, []string{status("wamid.BA", "sent", 1, "15550001"), status("wamid.BA", "delivered", 2, "15550001")}, nil)
	second := claim()
	e.post(t, e.pnid, []string{status("wamid.BB", "read", 3, "15550002")}, nil) // before the outcome
	if err := s.FinishBroadcastSend(ctx, second, store.BroadcastOutcome{Kind: store.OutcomeAccepted, WAMID: "wamid.BB", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetBroadcast(ctx, e.org, b.ID)
	if err != nil || got.Counts != (store.BroadcastCounts{Total: 2, Delivered: 1, Read: 1}) {
		t.Fatalf("counts %+v %v", got.Counts, err)
	}
	rs, err := s.BroadcastRecipients(ctx, e.org, b.ID, "", 0, 10)
	if err != nil || len(rs) != 2 || rs[0].Status != "delivered" || rs[0].WAMID != "wamid.BA" || rs[1].Status != "read" {
		t.Fatalf("recipients %+v %v", rs, err)
	}
	if n := testenv.QueryValue[int](t, e.f, `SELECT count(*) FROM messages WHERE broadcast_id = $1`, b.ID); n != 2 {
		t.Fatalf("%d messages of the broadcast", n)
	}
}

// TestBroadcastCompletesSoonAfterItsLastSend: a claim that finds the broadcast's last recipient
// still being sent looks again within a second, not when that send's lease ends: once its
// outcome lands the broadcast completes at the next claim (it stayed "sending" for the whole
// lease before).
func TestBroadcastCompletesSoonAfterItsLastSend(t *testing.T) {
	e := newBroadcastEnv(t)
	b := e.create(t, 1, 600, e.clk.Now())
	s1 := e.claim(t)
	e.clk.Set(s1.NextSendAt) // the gate lets a claim through while the send is in flight
	send, wake, err := e.s.ClaimBroadcastSend(context.Background(), broadcastLease)
	if err != nil || send != nil || wake.IsZero() || wake.After(e.clk.Now().Add(time.Second)) {
		t.Fatalf("a claim during the last send: %+v wake %v (now %v) %v, want wake within 1 s", send, wake, e.clk.Now(), err)
	}
	e.finish(t, s1, store.BroadcastOutcome{Kind: store.OutcomeAccepted, WAMID: "wamid.L1"})
	e.clk.Set(wake)
	if send, wake, err = e.s.ClaimBroadcastSend(context.Background(), broadcastLease); err != nil || send != nil || !wake.IsZero() {
		t.Fatalf("after the last outcome: %+v %v %v", send, wake, err)
	}
	if got := e.get(t, b.ID); got.Status != store.BroadcastCompleted {
		t.Fatalf("not completed a second after its last send: %+v", got)
	}
}
