package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

const healthLease = 2 * time.Minute

// healthStore is a fresh store on a stub clock with one org.
func healthStore(t *testing.T) (*testenv.Fixture, *store.Store, store.Org, *clock.Stub) {
	t.Helper()
	f := testenv.NewStore(t)
	clk := clock.NewStub(time.Now())
	f.Store.SetClock(clk)
	return f, f.Store, f.Org(t), clk
}

// claimHealth claims the due reads and returns them by channel.
func claimHealth(t *testing.T, s *store.Store) map[uuid.UUID]store.HealthRead {
	t.Helper()
	reads, err := s.ClaimHealthReads(context.Background(), 1000, healthLease)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uuid.UUID]store.HealthRead{}
	for _, r := range reads {
		if _, dup := out[r.ChannelID]; dup {
			t.Fatalf("channel %s claimed twice in one claim", r.ChannelID)
		}
		out[r.ChannelID] = r
	}
	return out
}

func str(s string) *string { return &s }

// healthEvent is a stored channel_health event.
type healthEvent struct {
	Type      string    `json:"type"`
	ChannelID uuid.UUID `json:"channel_id"`
	Data      struct {
		Health   map[string]*string `json:"health"`
		Previous map[string]*string `json:"previous"`
		Changed  []string           `json:"changed"`
		Upstream json.RawMessage    `json:"upstream"`
	} `json:"data"`
}

// healthEvents returns the channel's channel_health events, oldest first.
func healthEvents(t *testing.T, f *testenv.Fixture, id uuid.UUID) []healthEvent {
	t.Helper()
	rows, err := f.Pool.Query(context.Background(), `SELECT payload FROM events WHERE channel_id = $1 AND type = 'channel_health' ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []healthEvent
	for rows.Next() {
		var p []byte
		var e healthEvent
		if err := rows.Scan(&p); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(p, &e); err != nil {
			t.Fatalf("event %s: %v", p, err)
		}
		out = append(out, e)
	}
	return out
}

// TestHealthReadAtConnect: a connection makes a read due at once; the claim takes it with the
// channel's number and token and no upstream change; a second claim finds nothing (the claim
// moved the due time), and a claim whose instance died is read again after the lease.
func TestHealthReadAtConnect(t *testing.T) {
	t.Parallel()
	f, s, org, clk := healthStore(t)
	pending := f.Channel(t, org.ID)
	c := connected(t, f, org, "15550001", "waba1")
	got := claimHealth(t, s)
	r, ok := got[c.ID]
	if len(got) != 1 || !ok {
		t.Fatalf("claimed %v, want channel %s only (not the pending %s)", got, c.ID, pending.ID)
	}
	if r.PhoneNumberID != "15550001" || r.UpstreamToken != "t" || !r.Readable || r.Upstream != nil || r.OrgID != org.ID {
		t.Fatalf("read %+v", r)
	}
	if again := claimHealth(t, s); len(again) != 0 {
		t.Fatalf("claimed again while the claim runs: %v", again)
	}
	clk.Advance(healthLease + time.Second)
	if again := claimHealth(t, s); len(again) != 1 {
		t.Fatalf("after the lease: claimed %v, want the read again", again)
	}
}

// TestHealthChanges: the first fill after a connect announces nothing; a change of a known
// value after an account webhook is one channel_health event (to the webhooks subscribed to
// the kind), one history row, and the channel's health; a field the answer lacks keeps its
// value; an unknown string is kept verbatim.
func TestHealthChanges(t *testing.T) {
	t.Parallel()
	f, s, org, clk := healthStore(t)
	ctx := context.Background()
	c := connected(t, f, org, "15550002", "waba2")
	sub, _ := f.Webhook(t, org.ID, "https://a.example.com", &testenv.WebhookOpts{Events: []string{"channel_health"}})
	other, _ := f.Webhook(t, org.ID, "https://b.example.com", &testenv.WebhookOpts{Events: []string{"channel_status", "messages"}})

	r := claimHealth(t, s)[c.ID]
	out, err := s.RecordHealthRead(ctx, r, store.ChannelHealth{QualityRating: str("GREEN"), MessagingLimit: str("TIER_1K"),
		Throughput: str("STANDARD"), NameStatus: str("APPROVED")}, 6*time.Hour)
	if err != nil || len(out.Changed) != 0 || out.Stale {
		t.Fatalf("first fill: %+v %v", out, err)
	}
	if evs := healthEvents(t, f, c.ID); len(evs) != 0 {
		t.Fatalf("first fill emitted %v", evs)
	}
	ch, err := s.GetChannel(ctx, org.ID, c.ID)
	if err != nil || ch.Health.QualityRating == nil || *ch.Health.QualityRating != "GREEN" || *ch.Health.MessagingLimit != "TIER_1K" ||
		ch.Health.CheckedAt == nil || !ch.Health.CheckedAt.Equal(clk.Now()) {
		t.Fatalf("channel health %+v %v", ch.Health, err)
	}

	value := json.RawMessage(`{"display_phone_number":"15550002", "event":"FLAGGED","current_limit":"TIER_1K"}`)
	if n, err := s.PromptHealth(ctx, "waba2", "phone_number_quality_update", value); err != nil || n != 1 {
		t.Fatalf("prompt: %d %v", n, err)
	}
	if n, err := s.PromptHealth(ctx, "no-such-waba", "phone_number_quality_update", value); err != nil || n != 0 {
		t.Fatalf("prompt for an account no channel has: %d %v", n, err)
	}
	clk.Advance(store.HealthPromptDelay)
	r = claimHealth(t, s)[c.ID]
	wantUp := `{"field":"phone_number_quality_update","value":` + string(value) + `}`
	if string(r.Upstream) != wantUp {
		t.Fatalf("upstream %s, want %s", r.Upstream, wantUp)
	}
	out, err = s.RecordHealthRead(ctx, r, store.ChannelHealth{QualityRating: str("YELLOW"), MessagingLimit: str("TIER_NEW_ONE"),
		Throughput: nil, NameStatus: str("APPROVED")}, 6*time.Hour)
	if err != nil || !slices.Equal(out.Changed, []string{"quality_rating", "messaging_limit"}) {
		t.Fatalf("change: %+v %v", out, err)
	}
	evs := healthEvents(t, f, c.ID)
	if len(evs) != 1 {
		t.Fatalf("events %v", evs)
	}
	d := evs[0].Data
	if *d.Health["quality_rating"] != "YELLOW" || *d.Previous["quality_rating"] != "GREEN" || *d.Health["throughput"] != "STANDARD" ||
		*d.Health["messaging_limit"] != "TIER_NEW_ONE" || d.Health["checked_at"] == nil || d.Previous["checked_at"] == nil ||
		!slices.Equal(d.Changed, []string{"quality_rating", "messaging_limit"}) || string(d.Upstream) != wantUp {
		t.Fatalf("event data %+v", d)
	}
	if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM deliveries d JOIN events e ON e.id = d.event_id
		WHERE e.type = 'channel_health' AND d.webhook_id = $1`, sub.ID); n != 1 {
		t.Fatalf("deliveries to the subscribed webhook: %d", n)
	}
	if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM deliveries WHERE webhook_id = $1`, other.ID); n != 0 {
		t.Fatalf("deliveries to the webhook not subscribed to channel_health: %d", n)
	}
	hist, err := s.ChannelHealthChanges(ctx, org.ID, c.ID, 10)
	if err != nil || len(hist) != 1 || !slices.Equal(hist[0].Changed, []string{"quality_rating", "messaging_limit"}) ||
		*hist[0].Health.QualityRating != "YELLOW" || *hist[0].Previous.QualityRating != "GREEN" || string(hist[0].Upstream) != wantUp {
		t.Fatalf("history %+v %v", hist, err)
	}
	if _, err := s.ChannelHealthChanges(ctx, f.Org(t).ID, c.ID, 10); !errors.Is(err, store.ErrChannelNotFound) {
		t.Fatalf("another org's history: %v", err)
	}
	// the read is done: nothing due until the periodic read
	if again := claimHealth(t, s); len(again) != 0 {
		t.Fatalf("claimed after the read: %v", again)
	}
	// the retention prunes the history
	if n, err := s.PruneHealthChanges(ctx, clk.Now().Add(time.Second)); err != nil || n != 1 {
		t.Fatalf("prune: %d %v", n, err)
	}
}

// TestHealthPromptsCoalesced: account webhooks within the delay are one read, due the delay
// after the first (the latest change named); a prompt that lands while the read is in flight
// asks for one more read.
func TestHealthPromptsCoalesced(t *testing.T) {
	t.Parallel()
	f, s, org, clk := healthStore(t)
	ctx := context.Background()
	a := connected(t, f, org, "15550003", "waba3")
	b := connected(t, f, org, "15550004", "waba3")
	for _, r := range claimHealth(t, s) {
		if _, err := s.RecordHealthRead(ctx, r, store.ChannelHealth{QualityRating: str("GREEN")}, 0); err != nil {
			t.Fatal(err)
		}
	}
	prompt := func(v string) {
		t.Helper()
		if n, err := s.PromptHealth(ctx, "waba3", "phone_number_quality_update", json.RawMessage(v)); err != nil || n != 2 {
			t.Fatalf("prompt: %d %v", n, err)
		}
	}
	prompt(`{"event":"FLAGGED"}`)
	clk.Advance(store.HealthPromptDelay / 2)
	prompt(`{"event":"UNFLAGGED"}`)
	if got := claimHealth(t, s); len(got) != 0 {
		t.Fatalf("claimed before the delay after the first webhook: %v", got)
	}
	clk.Advance(store.HealthPromptDelay / 2)
	got := claimHealth(t, s)
	if len(got) != 2 || got[a.ID].Upstream == nil || got[b.ID].Upstream == nil {
		t.Fatalf("claimed %v, want both channels of the account once", got)
	}
	if want := `{"field":"phone_number_quality_update","value":{"event":"UNFLAGGED"}}`; string(got[a.ID].Upstream) != want {
		t.Fatalf("upstream %s, want the latest %s", got[a.ID].Upstream, want)
	}
	// a webhook while the reads are in flight
	prompt(`{"event":"FLAGGED"}`)
	for _, r := range got {
		if _, err := s.RecordHealthRead(ctx, r, store.ChannelHealth{QualityRating: str("GREEN")}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := claimHealth(t, s); len(got) != 0 {
		t.Fatalf("claimed at once after the reads: %v", got)
	}
	clk.Advance(store.HealthPromptDelay)
	if got := claimHealth(t, s); len(got) != 2 {
		t.Fatalf("the webhook that landed during the reads asked for no read: claimed %v", got)
	}
}

// TestHealthRefreshSpread: the periodic reads of channels connected together fall at their
// own moments of the interval, spread over it, not all at once; with the refresh off none is
// due; a failed read is tried again after the back-off.
func TestHealthRefreshSpread(t *testing.T) {
	t.Parallel()
	f, s, org, clk := healthStore(t)
	ctx := context.Background()
	const n, refresh, buckets = 200, 6 * time.Hour, 10
	for i := range n {
		connected(t, f, org, "1666"+string(rune('a'+i/26))+string(rune('a'+i%26)), "waba-spread")
	}
	if err := s.ScheduleHealth(ctx, refresh); err != nil {
		t.Fatal(err)
	}
	start := clk.Now()
	dues := testenv.QueryValue[[]time.Time](t, f, `SELECT array_agg(refresh_due_at) FROM channel_health`)
	if len(dues) != n {
		t.Fatalf("%d periodic reads scheduled, want %d", len(dues), n)
	}
	counts := make([]int, buckets)
	for _, d := range dues {
		off := d.Sub(start)
		if off <= 0 || off > refresh {
			t.Fatalf("periodic read due at +%v, want within (0, %v]", off, refresh)
		}
		counts[min(int(off*buckets/refresh), buckets-1)]++
	}
	for _, c := range counts {
		// 20 expected per tenth; a burst puts them all in one
		if c == 0 || c > 50 {
			t.Fatalf("periodic reads per tenth of the interval %v: not spread", counts)
		}
	}
	// the connect reads, then every periodic read at its moment, each channel once
	connects := claimHealth(t, s)
	if len(connects) != n {
		t.Fatalf("connect reads: %d", len(connects))
	}
	for _, r := range connects {
		if err := s.SkipHealthRead(ctx, r, refresh); err != nil {
			t.Fatal(err)
		}
	}
	reads := 0
	for range 20 {
		clk.Advance(refresh / 20)
		for _, r := range claimHealth(t, s) {
			reads++
			if err := s.SkipHealthRead(ctx, r, refresh); err != nil {
				t.Fatal(err)
			}
		}
	}
	if reads != n {
		t.Fatalf("%d periodic reads in one interval, want %d (one each)", reads, n)
	}
	// off: nothing periodic is due any more
	if err := s.ScheduleHealth(ctx, 0); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * refresh)
	if got := claimHealth(t, s); len(got) != 0 {
		t.Fatalf("with the refresh off, %d reads due", len(got))
	}
}

// TestHealthFailedReadBacksOff: a failed read is tried again after HealthRetryDelay, which
// doubles with each failure in a row.
func TestHealthFailedReadBacksOff(t *testing.T) {
	t.Parallel()
	f, s, org, clk := healthStore(t)
	ctx := context.Background()
	c := connected(t, f, org, "15550005", "waba5")
	for i := 1; i <= 3; i++ {
		r, ok := claimHealth(t, s)[c.ID]
		if !ok {
			t.Fatalf("failure %d: no read due", i)
		}
		if err := s.FailHealthRead(ctx, r); err != nil {
			t.Fatal(err)
		}
		clk.Advance(store.HealthRetryDelay(i) - time.Second)
		if got := claimHealth(t, s); len(got) != 0 {
			t.Fatalf("failure %d: tried again before the back-off", i)
		}
		clk.Advance(time.Second)
	}
	if store.HealthRetryDelay(1) != time.Minute || store.HealthRetryDelay(2) != 2*time.Minute || store.HealthRetryDelay(20) != time.Hour {
		t.Fatalf("back-off %v %v %v", store.HealthRetryDelay(1), store.HealthRetryDelay(2), store.HealthRetryDelay(20))
	}
}

// TestHealthClaimsDisjoint: instances claiming at once never claim the same channel: each due
// read is claimed exactly once.
func TestHealthClaimsDisjoint(t *testing.T) {
	t.Parallel()
	f, s, org, _ := healthStore(t)
	const n = 60
	for i := range n {
		connected(t, f, org, "1777"+string(rune('a'+i/26))+string(rune('a'+i%26)), "waba-disjoint")
	}
	claimed := make(chan uuid.UUID, 4*n)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for {
				reads, err := s.ClaimHealthReads(context.Background(), 3, healthLease)
				if err != nil || len(reads) == 0 {
					errs <- err
					return
				}
				for _, r := range reads {
					claimed <- r.ChannelID
				}
			}
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	close(claimed)
	seen := map[uuid.UUID]int{}
	for id := range claimed {
		seen[id]++
	}
	if len(seen) != n {
		t.Fatalf("%d channels claimed, want %d", len(seen), n)
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("channel %s claimed %d times", id, k)
		}
	}
}
