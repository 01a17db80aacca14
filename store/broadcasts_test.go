package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
