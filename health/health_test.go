package health_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/graph"
	"github.com/wabarelay/wabarelay/health"
	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const refresh = 6 * time.Hour

// world is a store on a stub clock, a fake upstream with one number, and a channel connected
// to it.
type world struct {
	t       *testing.T
	f       *testenv.Fixture
	clk     *clock.Stub
	fake    *fakegraph.Server
	org     store.Org
	ch      store.Channel
	pn, tok string
	w       *health.Worker
}

func newWorld(t *testing.T, cfg health.Config) *world {
	t.Helper()
	f := testenv.NewStore(t)
	// a known moment of the refresh interval (6h multiples are aligned with the Unix epoch):
	// with the channel's phase set to the middle, its periodic read is 2h after the start
	clk := clock.NewStub(time.Now().Truncate(refresh).Add(time.Hour))
	f.Store.SetClock(clk)
	fake := fakegraph.New()
	base := fake.Start()
	t.Cleanup(fake.Close)
	w := &world{t: t, f: f, clk: clk, fake: fake, org: f.Org(t), pn: "106540352242922", tok: "EAAtoken-" + uuid.NewString()}
	fake.AddNumber(w.pn, "waba-1", "+1 555-010-4477", "Sales")
	fake.AddToken(w.tok, nil, []string{"waba-1"})
	w.ch = f.Channel(t, w.org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: w.pn, WabaID: "waba-1", UpstreamToken: w.tok}})
	f.Exec(t, `UPDATE channel_health SET refresh_offset = 0.5`)
	if cfg.Refresh == 0 && !cfg.NoRefresh {
		cfg.Refresh = refresh
	}
	w.w = health.New(f.Store, graph.New(base+"/"+fake.Version(), nil), cfg, nil)
	return w
}

// runOnce makes the due reads and checks how many.
func (w *world) runOnce(want int) {
	w.t.Helper()
	n, err := w.w.RunOnce(context.Background())
	if err != nil || n != want {
		w.t.Fatalf("RunOnce: %d reads, %v; want %d", n, err, want)
	}
}

// health is the channel's health as the API reads it.
func (w *world) health() store.ChannelHealth {
	w.t.Helper()
	c, err := w.f.Store.GetChannel(context.Background(), w.org.ID, w.ch.ID)
	if err != nil {
		w.t.Fatal(err)
	}
	return c.Health
}

// event is a stored channel_health or channel_status event's data.
type event struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

func (w *world) events(typ string) []json.RawMessage {
	w.t.Helper()
	rows, err := w.f.Pool.Query(context.Background(), `SELECT payload FROM events WHERE channel_id = $1 AND type = $2 ORDER BY id`, w.ch.ID, typ)
	if err != nil {
		w.t.Fatal(err)
	}
	defer rows.Close()
	var out []json.RawMessage
	for rows.Next() {
		var p []byte
		var e event
		if err := rows.Scan(&p); err != nil {
			w.t.Fatal(err)
		}
		if err := json.Unmarshal(p, &e); err != nil {
			w.t.Fatal(err)
		}
		out = append(out, e.Data)
	}
	return out
}

type healthData struct {
	Health   map[string]*string `json:"health"`
	Previous map[string]*string `json:"previous"`
	Changed  []string           `json:"changed"`
	Upstream json.RawMessage    `json:"upstream"`
}

func (w *world) healthEvents() []healthData {
	w.t.Helper()
	var out []healthData
	for _, raw := range w.events(store.EventChannelHealth) {
		var d healthData
		if err := json.Unmarshal(raw, &d); err != nil {
			w.t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

func val(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// TestWorkerConnectWebhookPeriodic: the read at connect fills the health and announces nothing;
// two quality webhooks within the window are one read after it, and one channel_health event
// (to the webhook subscribed to the kind) naming the latest webhook; the periodic read comes at
// the channel's moment of the interval and its event has no upstream.
func TestWorkerConnectWebhookPeriodic(t *testing.T) {
	t.Parallel()
	w := newWorld(t, health.Config{})
	ctx := context.Background()
	sub, _ := w.f.Webhook(t, w.org.ID, "https://a.example.com", &testenv.WebhookOpts{Events: []string{"channel_health"}})
	w.f.Webhook(t, w.org.ID, "https://b.example.com", &testenv.WebhookOpts{Events: []string{"channel_status"}})

	// connect fill
	w.runOnce(1)
	if n := w.fake.HealthReads(w.pn); n != 1 {
		t.Fatalf("upstream reads at connect: %d", n)
	}
	h := w.health()
	if val(h.QualityRating) != "GREEN" || val(h.MessagingLimit) != "TIER_2K" || val(h.Throughput) != "STANDARD" ||
		val(h.NameStatus) != "APPROVED" || h.CheckedAt == nil {
		t.Fatalf("health after connect %+v", h)
	}
	if evs := w.healthEvents(); len(evs) != 0 {
		t.Fatalf("the first fill emitted %v", evs)
	}

	// two quality webhooks: one read within the window, one event
	w.fake.SetNumberHealth(w.pn, fakegraph.NumberHealth{QualityRating: "YELLOW"})
	for _, v := range []string{`{"event":"FLAGGED","current_limit":"TIER_2K"}`, `{"event":"FLAGGED", "current_limit":"TIER_2K","x":1}`} {
		if _, err := w.f.Store.PromptHealth(ctx, "waba-1", "phone_number_quality_update", json.RawMessage(v)); err != nil {
			t.Fatal(err)
		}
		w.runOnce(0)
		w.clk.Advance(store.HealthPromptDelay / 2)
	}
	// the read is due the delay after the first webhook, the second one joined it
	w.runOnce(1)
	w.clk.Advance(time.Minute)
	w.runOnce(0)
	if n := w.fake.HealthReads(w.pn); n != 2 {
		t.Fatalf("upstream reads after two webhooks: %d, want one more than at connect", n)
	}
	evs := w.healthEvents()
	if len(evs) != 1 {
		t.Fatalf("channel_health events %v", evs)
	}
	e := evs[0]
	wantUp := `{"field":"phone_number_quality_update","value":{"event":"FLAGGED", "current_limit":"TIER_2K","x":1}}`
	if val(e.Health["quality_rating"]) != "YELLOW" || val(e.Previous["quality_rating"]) != "GREEN" ||
		!slices.Equal(e.Changed, []string{"quality_rating"}) || string(e.Upstream) != wantUp ||
		val(e.Health["messaging_limit"]) != "TIER_2K" || e.Health["checked_at"] == nil {
		t.Fatalf("event data %+v (upstream %s)", e, e.Upstream)
	}
	if n := testenv.QueryValue[int](t, w.f, `SELECT count(*) FROM deliveries WHERE webhook_id = $1`, sub.ID); n != 1 {
		t.Fatalf("deliveries to the subscribed webhook: %d", n)
	}
	if n := w.f.Count(t, "deliveries"); n != 1 {
		t.Fatalf("deliveries: %d, want only the subscribed webhook's", n)
	}

	// the periodic read, at the channel's moment of the interval
	w.fake.SetNumberHealth(w.pn, fakegraph.NumberHealth{QualityRating: "RED", MessagingLimit: "TIER_250"})
	reads := w.fake.HealthReads(w.pn)
	for range 12 {
		w.clk.Advance(refresh / 12)
		if _, err := w.w.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := w.fake.HealthReads(w.pn) - reads; n != 1 {
		t.Fatalf("periodic reads in one interval: %d", n)
	}
	evs = w.healthEvents()
	if len(evs) != 2 || evs[1].Upstream != nil && string(evs[1].Upstream) != "null" ||
		!slices.Equal(evs[1].Changed, []string{"quality_rating", "messaging_limit"}) || val(evs[1].Health["quality_rating"]) != "RED" {
		t.Fatalf("periodic event %+v", evs)
	}
}

// TestWorkerMessagingLimitFallback: without whatsapp_business_manager_messaging_limit the
// limit is messaging_limit_tier.
func TestWorkerMessagingLimitFallback(t *testing.T) {
	t.Parallel()
	w := newWorld(t, health.Config{})
	w.fake.SetNumberHealth(w.pn, fakegraph.NumberHealth{NoManagerLimit: true, MessagingLimitTier: "TIER_10K", Throughput: "HIGH", NameStatus: "PENDING_REVIEW"})
	w.runOnce(1)
	if h := w.health(); val(h.MessagingLimit) != "TIER_10K" || val(h.Throughput) != "HIGH" || val(h.NameStatus) != "PENDING_REVIEW" {
		t.Fatalf("health %+v", h)
	}
}

// TestWorkerDeadToken: a read that meets code 190 is the relay's transition — one
// channel_status upstream_disconnected — and the channel is not read again until reconnected.
func TestWorkerDeadToken(t *testing.T) {
	t.Parallel()
	w := newWorld(t, health.Config{})
	ctx := context.Background()
	w.runOnce(1)
	w.fake.RevokeToken(w.tok)
	for range 3 {
		if _, err := w.f.Store.PromptHealth(ctx, "waba-1", "account_update", json.RawMessage(`{"event":"ACCOUNT_VIOLATION"}`)); err != nil {
			t.Fatal(err)
		}
		w.clk.Advance(store.HealthPromptDelay)
		w.runOnce(1)
	}
	if n := w.fake.HealthReads(w.pn); n != 1 {
		t.Fatalf("health reads answered: %d, want only the first (the others met the dead token or were skipped)", n)
	}
	var statuses []store.ChannelStatusData
	for _, raw := range w.events(store.EventChannelStatus) {
		var d store.ChannelStatusData
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, d)
	}
	want := []store.ChannelStatusData{{Status: "active", PreviousStatus: "pending", Reason: "connected"},
		{Status: "upstream_disconnected", PreviousStatus: "active", Reason: "upstream_token_invalid"}}
	if !slices.Equal(statuses, want) {
		t.Fatalf("channel_status events %+v, want %+v", statuses, want)
	}
	// the token is asked for once: the later reads are skipped, the channel being disconnected
	if n := len(w.fake.RequestsTo("GET", "/"+w.pn)); n != 2 {
		t.Fatalf("GET /%s: %d requests, want 2 (the fill and the one that met 190)", w.pn, n)
	}
}

// TestWorkerFailedReadRetried: an upstream failure is tried again after the back-off.
func TestWorkerFailedReadRetried(t *testing.T) {
	t.Parallel()
	w := newWorld(t, health.Config{})
	w.fake.FailNext("GET /"+w.pn, 1, 500, map[string]any{"error": map[string]any{"message": "An unknown error occurred", "type": "OAuthException", "code": 1}})
	w.runOnce(1)
	if w.health().CheckedAt != nil {
		t.Fatal("a failed read recorded health")
	}
	w.runOnce(0)
	w.clk.Advance(store.HealthRetryDelay(1))
	w.runOnce(1)
	if h := w.health(); val(h.QualityRating) != "GREEN" {
		t.Fatalf("health after the retry %+v", h)
	}
}

// counts records ChannelsByQuality.
type counts struct {
	mu  sync.Mutex
	got map[string]int
}

func (c *counts) ChannelsByQuality(m map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = m
}

func (c *counts) get() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.got
}

// TestWorkerRun: Run makes the read at connect on its own, reports the counts by quality, and
// returns when its context ends.
func TestWorkerRun(t *testing.T) {
	t.Parallel()
	obs := &counts{}
	w := newWorld(t, health.Config{Observer: obs, Poll: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.w.Run(ctx) }()
	testenv.Eventually(t, testenv.Patience, func() bool { return w.health().CheckedAt != nil }, "the read at connect")
	// the counts were taken at the first round, maybe before the read: a clock jump wakes the
	// worker, but counts are refreshed once a minute; the store's count is checked directly
	if m, err := w.f.Store.ChannelsByQuality(ctx); err != nil || m["GREEN"] != 1 || len(m) != 1 {
		t.Fatalf("channels by quality %v %v", m, err)
	}
	testenv.Eventually(t, testenv.Patience, func() bool { return obs.get() != nil }, "the counts reported")
	cancel()
	select {
	case <-done:
	case <-time.After(testenv.Patience):
		t.Fatal("Run did not return")
	}
}
