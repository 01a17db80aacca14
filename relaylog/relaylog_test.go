package relaylog

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/admission"
	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/relay"
	"github.com/wabarelay/wabarelay/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// counts is an Observer.
type counts struct{ written, dropped atomic.Int64 }

func (c *counts) Written(n int) { c.written.Add(int64(n)) }
func (c *counts) Dropped(n int) { c.dropped.Add(int64(n)) }

func call(ch uuid.UUID, wamid string) relay.Call {
	return relay.Call{At: time.Now(), OrgID: uuid.New(), ChannelID: ch, Status: 200, Outcome: relay.OutcomeOK,
		Latency: time.Millisecond, Recipient: "1555", WAMID: wamid}
}

// TestWriterSettlesMessages: a message whose first status came before its send's log row (its
// row waiting, relay_pending, at the status's arrival) gets the send's time from the writer: in
// the batch's settle, and, for a status stored after that, in the settle one interval later.
func TestWriterSettlesMessages(t *testing.T) {
	f := testenv.NewStore(t)
	org := f.Org(t).ID
	ch := f.Channel(t, org, &testenv.ChannelOpts{Connection: f.Connection()})
	waiting := func(wamid string) {
		f.Exec(t, `INSERT INTO messages (wamid, org_id, channel_id, created_at, status, status_rank, relay_pending)
			VALUES ($1, $2, $3, now(), 'sent', 1, true)`, wamid, org, ch.ID)
	}
	settled := func(wamid string, at time.Time) func() bool {
		return func() bool {
			var created time.Time
			var pending *bool
			err := f.Pool.QueryRow(context.Background(), `SELECT created_at, relay_pending FROM messages WHERE wamid = $1`, wamid).
				Scan(&created, &pending)
			return err == nil && pending == nil && created.Equal(at)
		}
	}
	w := New(f.Store, Config{Interval: 20 * time.Millisecond}, nil, nil)
	w.Start()
	defer w.Stop()
	first := call(ch.ID, "wamid.SETTLE-1")
	first.OrgID, first.At = org, time.Now().Add(-time.Second).Truncate(time.Microsecond)
	waiting(first.WAMID)
	w.Record(first)
	testenv.Eventually(t, testenv.Patience, settled(first.WAMID, first.At), "the row given its send's time by the batch's settle")

	w.Stop()

	// A status that did not see its call's log row, stored once the settle after that batch had
	// run (it committed while they ran): the settle one interval later takes it, though no batch
	// follows.
	late := call(ch.ID, "wamid.SETTLE-2")
	late.OrgID, late.At = org, time.Now().Add(-time.Second).Truncate(time.Microsecond)
	sink := &settleHook{Store: f.Store, settled: make(chan struct{}), release: make(chan struct{})}
	w2 := New(sink, Config{Interval: 20 * time.Millisecond}, nil, nil)
	w2.Start()
	defer w2.Stop()
	w2.Record(late)
	<-sink.settled // the batch is written and settled
	waiting(late.WAMID)
	close(sink.release)
	testenv.Eventually(t, testenv.Patience, settled(late.WAMID, late.At), "the row given its send's time by the settle an interval later")
}

// settleHook is a store whose first SettleMessages, once it has run, reports it on settled and
// returns when release is closed.
type settleHook struct {
	*store.Store
	settled, release chan struct{}
	once             sync.Once
}

func (s *settleHook) SettleMessages(ctx context.Context) error {
	err := s.Store.SettleMessages(ctx)
	s.once.Do(func() {
		close(s.settled)
		<-s.release
	})
	return err
}

// TestWriterBatches: full batches are written at once, a partial one after the interval, and
// Stop writes what is buffered; every call is a row.
func TestWriterBatches(t *testing.T) {
	f := testenv.NewStore(t)
	obs := &counts{}
	w := New(f.Store, Config{Batch: 3, Interval: time.Hour}, obs, nil)
	w.Start()
	ch := uuid.New()
	for i := range 7 {
		w.Record(call(ch, "wamid.b"+string(rune('a'+i))))
	}
	testenv.Eventually(t, testenv.Patience, func() bool { return w.Written() == 6 }, "two full batches written")
	if n := f.Count(t, "relay_log"); n != 6 {
		t.Fatalf("%d rows after two batches", n)
	}
	w.Stop()
	if w.Written() != 7 || w.Dropped() != 0 || obs.written.Load() != 7 || f.Count(t, "relay_log") != 7 {
		t.Fatalf("after Stop: written %d dropped %d (observed %d), %d rows",
			w.Written(), w.Dropped(), obs.written.Load(), f.Count(t, "relay_log"))
	}
	w.Record(call(ch, "wamid.late"))
	if w.Dropped() != 1 || obs.dropped.Load() != 1 {
		t.Fatalf("a call after Stop: dropped %d", w.Dropped())
	}

	// A partial batch goes out after the interval.
	w2 := New(f.Store, Config{Interval: 20 * time.Millisecond}, nil, nil)
	w2.Start()
	defer w2.Stop()
	w2.Record(call(ch, "wamid.tick"))
	testenv.Eventually(t, testenv.Patience, func() bool { return w2.Written() == 1 }, "the interval's batch written")
}

// blockingSink holds its first write until release is closed; later writes fail when fail is
// set.
type blockingSink struct {
	store   *store.Store
	entered chan struct{}
	release chan struct{}
	first   atomic.Bool
	fail    atomic.Bool
}

func (s *blockingSink) WriteRelayLog(ctx context.Context, calls []store.RelayCall) error {
	if s.first.CompareAndSwap(false, true) {
		close(s.entered)
		<-s.release
	}
	if s.fail.Load() {
		return errors.New("database down")
	}
	return s.store.WriteRelayLog(ctx, calls)
}

func (s *blockingSink) SettleMessages(ctx context.Context) error { return s.store.SettleMessages(ctx) }

// TestWriterDropsWithoutWaiting: while the writer's database write is held, the relay answers
// every send at once; the calls beyond the buffer are dropped and counted, the buffered ones
// written once the database is back; a failing batch is dropped and counted.
func TestWriterDropsWithoutWaiting(t *testing.T) {
	f := testenv.NewStore(t)
	ch := f.Channel(t, f.Org(t).ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "1001",
		WabaID: "2001", DisplayPhoneNumber: "+1 555 0100", UpstreamToken: "EAAGwriterTestUpstreamToken0123"}})
	fake := fakegraph.New(fakegraph.WithPlainJSON())
	fake.AddNumber("1001", "2001", "+1 555 0100", "Acme")
	fake.AddToken("EAAGwriterTestUpstreamToken0123", []string{"1001"}, []string{"2001"})
	sink := &blockingSink{store: f.Store, entered: make(chan struct{}), release: make(chan struct{})}
	obs := &counts{}
	const buffer = 4
	w := New(sink, Config{Buffer: buffer, Batch: 1, Interval: time.Hour}, obs, nil)
	w.Start()
	defer w.Stop()
	lim := ratelimit.NewMemory(1000, time.Minute)
	defer lim.Close()
	mem := idempotency.NewMemory(idempotency.Options{})
	defer func() { _ = mem.Close() }()
	rl := &relay.Relay{Channels: relay.NewCache(f.Store, relay.DefaultTTL), Objects: f.Store,
		Admission: admission.NewMemory(lim, mem), UpstreamBase: "/" + fake.Version(), CallLog: w}
	send := func() {
		t.Helper()
		r := httptest.NewRequest("POST", "http://relay.example.com/1001/messages",
			strings.NewReader(`{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"hi"}}`))
		r.Header.Set("Authorization", "Bearer "+ch.ChannelToken)
		rec := httptest.NewRecorder()
		rl.Serve(rec, r, func(w http.ResponseWriter, r *http.Request) error { fake.ServeHTTP(w, r); return nil })
		if rec.Code != 200 {
			t.Fatalf("send: %d %s", rec.Code, rec.Body)
		}
	}

	send()
	<-sink.entered // the writer's first batch is held in the database
	const more = 20
	for range more {
		send() // answered: the relay does not wait for its log
	}
	if d := w.Dropped(); d != more-buffer || obs.dropped.Load() != d {
		t.Fatalf("dropped %d (observed %d), want %d: the first call held, %d buffered", d, obs.dropped.Load(), more-buffer, buffer)
	}
	close(sink.release)
	testenv.Eventually(t, testenv.Patience, func() bool { return w.Written() == 1+buffer }, "the held and buffered calls written")
	if n := f.Count(t, "relay_log"); n != 1+buffer {
		t.Fatalf("%d relay_log rows, want %d", n, 1+buffer)
	}

	// A batch the database refuses is dropped and counted.
	sink.fail.Store(true)
	send()
	testenv.Eventually(t, testenv.Patience, func() bool { return w.Dropped() == more-buffer+1 }, "the failed batch counted")
	if w.Written() != 1+buffer || f.Count(t, "relay_log") != 1+buffer {
		t.Fatalf("a failed batch written: %d", w.Written())
	}
}

// TestWriterBoundsAChannel: a flood of refusals from one channel takes no place in the
// buffer and is written as counts — one relay_counts row per second, outcome and status —, and
// a channel's calls beyond PerChannel rows in one second are counted too (with their outcome);
// every call is written (counted as written), and the chart's minutes count them all.
func TestWriterBoundsAChannel(t *testing.T) {
	f := testenv.NewStore(t)
	org := f.Org(t).ID
	ch := f.Channel(t, org, &testenv.ChannelOpts{Connection: f.Connection()}).ID
	obs := &counts{}
	const perChannel, buffer = 20, 64
	w := New(f.Store, Config{Buffer: buffer, PerChannel: perChannel, Interval: 20 * time.Millisecond}, obs, nil)
	w.Start()
	defer w.Stop()

	start := time.Now()
	const refusals, sends = 20000, 300
	for i := range refusals {
		c := relay.Call{At: time.Now(), OrgID: org, ChannelID: ch, Status: 429, Outcome: relay.OutcomeRateLimited,
			IdempotencyKey: strings.Repeat("k", 255), Recipient: strings.Repeat("9", 256)}
		if i%2 == 1 {
			c.Status, c.Outcome = 422, relay.OutcomeIdempotencyConflict
		}
		w.Record(c)
	}
	for i := range sends {
		c := call(ch, fmt.Sprintf("wamid.bound%d", i))
		c.OrgID = org
		w.Record(c)
	}
	seconds := int(time.Since(start)/time.Second) + 1 // the seconds the calls were recorded in
	testenv.Eventually(t, testenv.Patience, func() bool { return w.Written() == refusals+sends }, "every call written")
	if w.Dropped() != 0 {
		t.Fatalf("%d calls dropped (buffer %d): the refusals took its place", w.Dropped(), buffer)
	}
	rows := f.CountWhere(t, "relay_log", "channel_id", ch)
	if rows < perChannel || rows > perChannel*seconds {
		t.Fatalf("%d relay_log rows for %d sends in %d s, want %d a second", rows, sends, seconds, perChannel)
	}
	var countRows, refused, folded int
	if err := f.Pool.QueryRow(context.Background(), `
		SELECT count(*), coalesce(sum(calls) FILTER (WHERE outcome <> 'ok'), 0), coalesce(sum(calls) FILTER (WHERE outcome = 'ok'), 0)
		FROM relay_counts WHERE channel_id = $1 AND org_id = $2`, ch, org).Scan(&countRows, &refused, &folded); err != nil {
		t.Fatal(err)
	}
	if refused != refusals || rows+folded != sends {
		t.Fatalf("relay_counts: %d refusals, %d sends counted beside %d rows; want %d and %d", refused, folded, rows, refusals, sends)
	}
	// One row per second and outcome (two refusal outcomes, and the folded sends), however many
	// batches the seconds' calls were written in.
	if countRows > 3*(seconds+1) {
		t.Fatalf("%d relay_counts rows for %d seconds of calls", countRows, seconds)
	}
	minutes, err := f.Store.SendsPerMinute(context.Background(), org, ch, start.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var ok, limited, other int
	for _, m := range minutes {
		ok, limited, other = ok+m.OK, limited+m.RateLimited, other+m.Refused
	}
	if ok != sends || limited != refusals/2 || other != refusals/2 {
		t.Fatalf("per minute: %d ok, %d rate limited, %d refused; want %d, %d, %d", ok, limited, other, sends, refusals/2, refusals/2)
	}
	t.Logf("%d refusals and %d sends in %d s: %d relay_log rows, %d relay_counts rows", refusals, sends, seconds, rows, countRows)
}
