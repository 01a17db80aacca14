package broadcast

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/relay"
	"github.com/wabarelay/wabarelay/store"
)

// These tests run the Worker on a real store (testenv) with a Sender double: the relay's path
// itself is tested in package relay (broadcast_test.go there).

func TestMain(m *testing.M) { testenv.Main(m) }

// fakeSender is a Sender that records each send and answers from a script per recipient: the
// next result scripted for the body's "to", else accepted with a wamid of its own.
type fakeSender struct {
	mu      sync.Mutex
	sent    []string                      // the "to" of each send, in order
	script  map[string][]relay.SendResult // per recipient, used in order
	hold    chan struct{}                 // if set, each send waits for it to close
	started chan struct{}                 // if set, receives one value per send started
	at      map[string][]time.Time        // when each recipient was sent
	errs    map[uuid.UUID]error           // a lookup error per channel
	bodies  map[string]map[string]any     // the last body per recipient
}

func newFakeSender() *fakeSender {
	return &fakeSender{script: map[string][]relay.SendResult{}, at: map[string][]time.Time{},
		errs: map[uuid.UUID]error{}, bodies: map[string]map[string]any{}}
}

func (s *fakeSender) SendFor(ctx context.Context, channelID uuid.UUID, body []byte) (relay.SendResult, error) {
	var b map[string]any
	if err := json.Unmarshal(body, &b); err != nil {
		panic(fmt.Sprintf("send body is not JSON: %s", body))
	}
	to, _ := b["to"].(string)
	if s.started != nil {
		s.started <- struct{}{}
	}
	if s.hold != nil {
		<-s.hold
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.errs[channelID]; err != nil {
		return relay.SendResult{}, err
	}
	s.sent = append(s.sent, to)
	s.at[to] = append(s.at[to], time.Now())
	s.bodies[to] = b
	if q := s.script[to]; len(q) > 0 {
		s.script[to] = q[1:]
		return q[0], nil
	}
	return relay.SendResult{Status: 200, Outcome: relay.OutcomeOK, Answered: true, WAMID: "wamid." + to}, nil
}

func (s *fakeSender) sends(to string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at[to])
}

func (s *fakeSender) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sent)
}

type workerEnv struct {
	f      *testenv.Fixture
	st     *store.Store
	org    uuid.UUID
	ch     uuid.UUID
	sender *fakeSender
}

func newWorkerEnv(t *testing.T) *workerEnv {
	t.Helper()
	f := testenv.NewStore(t)
	org := f.Org(t)
	ch := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: f.Connection()})
	return &workerEnv{f: f, st: f.Store, org: org.ID, ch: ch.ID, sender: newFakeSender()}
}

// create creates a broadcast of the recipients at rate per minute, starting now.
func (e *workerEnv) create(t *testing.T, rate int, to ...string) store.Broadcast {
	t.Helper()
	nb := store.NewBroadcast{Name: "b", RatePerMinute: rate, StartAt: time.Now(),
		Template: json.RawMessage(`{"name":"hello_world","language":{"code":"en_US"}}`)}
	for _, n := range to {
		nb.Recipients = append(nb.Recipients, store.NewRecipient{To: n})
	}
	b, err := e.st.CreateBroadcast(context.Background(), e.org, e.ch, nb)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// run runs a worker until the test ends (or stop is called) and returns stop, which cancels it
// and waits for Run to return.
func (e *workerEnv) run(t *testing.T, cfg Config) (stop func()) {
	t.Helper()
	w := New(e.st, e.sender, cfg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// waitFor polls the broadcast until cond holds (10 s at most).
func (e *workerEnv) waitFor(t *testing.T, id uuid.UUID, what string, cond func(store.Broadcast) bool) store.Broadcast {
	t.Helper()
	var b store.Broadcast
	testenv.Eventually(t, 10*time.Second, func() bool {
		var err error
		if b, err = e.st.GetBroadcast(context.Background(), e.org, id); err != nil {
			t.Fatal(err)
		}
		return cond(b)
	}, "%s: not reached; broadcast %+v", what, &b)
	return b
}

func (e *workerEnv) recipients(t *testing.T, id uuid.UUID) map[string]store.BroadcastRecipient {
	t.Helper()
	rs, err := e.st.BroadcastRecipients(context.Background(), e.org, id, "", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]store.BroadcastRecipient{}
	for _, r := range rs {
		out[r.To] = r
	}
	return out
}

// TestBroadcastWorkerSendsEachOnce: every recipient is sent once, with the template and its
// number, the broadcast completes with every send accepted under its wamid, and the sends keep
// the pace (one every 60 s / rate).
func TestBroadcastWorkerSendsEachOnce(t *testing.T) {
	e := newWorkerEnv(t)
	to := []string{"15550001", "15550002", "15550003", "15550004", "15550005", "15550006"}
	b := e.create(t, 120, to...) // one every 500 ms
	e.run(t, Config{Workers: 4})
	got := e.waitFor(t, b.ID, "completed", func(b store.Broadcast) bool { return b.Status == store.BroadcastCompleted })
	if got.Counts.Accepted != len(to) || got.Counts.Total != len(to) || got.Counts.Queued != 0 {
		t.Fatalf("counts %+v", got.Counts)
	}
	var first, last time.Time
	for _, n := range to {
		if c := e.sender.sends(n); c != 1 {
			t.Errorf("%s sent %d times", n, c)
		}
		at := e.sender.at[n][0]
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
		body := e.sender.bodies[n]
		if tpl, _ := body["template"].(map[string]any); body["type"] != "template" || tpl["name"] != "hello_world" {
			t.Errorf("%s: body %v", n, body)
		}
	}
	// 6 sends at 500 ms: the gate puts the last claim 2,500 ms after the first's due time. The
	// first claim may be late by up to an interval and keep the schedule (the gate forgives it),
	// and on a loaded machine a send can follow its claim late: 1,500 ms leaves both an
	// interval. Unpaced, the six would go out within milliseconds. (At 100 ms apart a bound of
	// 450 ms failed once beside the whole suite: 424 ms.)
	if span := last.Sub(first); span < 1500*time.Millisecond {
		t.Errorf("6 sends at 120/min took %v, want about 2.5s", span)
	}
	for n, r := range e.recipients(t, b.ID) {
		if r.WAMID != "wamid."+n || r.Attempts != 1 {
			t.Errorf("%s: %+v", n, r)
		}
	}
}

// TestBroadcastWorkerOutcomes: a throughput error is retried later, a pair-rate error too, an
// upstream failure other than those fails the recipient with its code and title, a timeout
// becomes unknown and is never sent again, and a local 429 requeues without counting an attempt.
func TestBroadcastWorkerOutcomes(t *testing.T) {
	e := newWorkerEnv(t)
	e.sender.script["15550001"] = []relay.SendResult{{Status: 400, Answered: true, ErrorCode: 130429, ErrorTitle: "Rate limit hit"}}
	e.sender.script["15550002"] = []relay.SendResult{{Status: 400, Answered: true, ErrorCode: 131047, ErrorTitle: "Re-engagement message"}}
	e.sender.script["15550003"] = []relay.SendResult{{Status: 504, Outcome: relay.OutcomeUpstreamError, TimedOut: true}}
	e.sender.script["15550004"] = []relay.SendResult{{Status: 429, Outcome: relay.OutcomeRateLimited, RateLimited: true, NotSent: true, RetryAfter: 300 * time.Millisecond}}
	b := e.create(t, 6000, "15550001", "15550002", "15550003", "15550004", "15550005")
	e.run(t, Config{Workers: 2})
	// The retried one waits 4 s (4^1); everything else settles first.
	e.waitFor(t, b.ID, "all but the retry settled", func(b store.Broadcast) bool {
		return b.Counts.Accepted == 2 && b.Counts.Failed == 1 && b.Counts.Unknown == 1
	})
	rs := e.recipients(t, b.ID)
	if r := rs["15550002"]; r.Status != "failed" || r.ErrorCode != 131047 || r.ErrorTitle != "Re-engagement message" {
		t.Errorf("failed recipient: %+v", r)
	}
	if r := rs["15550003"]; r.Status != "unknown" {
		t.Errorf("timed out recipient: %+v", r)
	}
	if r := rs["15550004"]; r.Status != "accepted" || r.Attempts != 1 || e.sender.sends("15550004") != 2 {
		t.Errorf("locally limited recipient: %+v, %d sends (want accepted, 1 attempt counted, 2 sends)", r, e.sender.sends("15550004"))
	}
	if r := rs["15550001"]; r.Status != "queued" || r.Attempts != 1 {
		t.Errorf("throughput-limited recipient before its retry: %+v", r)
	}
	got := e.waitFor(t, b.ID, "completed", func(b store.Broadcast) bool { return b.Status == store.BroadcastCompleted })
	if got.Counts.Accepted != 3 || got.Counts.Failed != 1 || got.Counts.Unknown != 1 {
		t.Fatalf("counts %+v", got.Counts)
	}
	if r := e.recipients(t, b.ID)["15550001"]; r.Attempts != 2 || r.WAMID != "wamid.15550001" {
		t.Errorf("retried recipient: %+v", r)
	}
	if at := e.sender.at["15550001"]; len(at) != 2 || at[1].Sub(at[0]) < 4*time.Second-100*time.Millisecond {
		t.Errorf("retry after %v, want 4 s", at)
	}
	if n := e.sender.sends("15550003"); n != 1 {
		t.Errorf("the unknown recipient was sent %d times", n)
	}
}

// TestBroadcastWorkerDisconnectedAndInactive: a dead token pauses the broadcast
// (upstream_disconnected) with the recipient back in the queue, its attempt not counted; an
// inactive channel cancels it.
func TestBroadcastWorkerDisconnectedAndInactive(t *testing.T) {
	e := newWorkerEnv(t)
	e.sender.script["15550001"] = []relay.SendResult{{Status: 503, Outcome: relay.OutcomeDisconnected, NotSent: true, ErrorCode: 190}}
	b := e.create(t, 6000, "15550001", "15550002")
	e.run(t, Config{Workers: 1})
	got := e.waitFor(t, b.ID, "paused", func(b store.Broadcast) bool { return b.Status == store.BroadcastPaused })
	if got.PausedReason != store.PausedUpstreamDisconnected || got.Counts.Queued != 2 {
		t.Fatalf("broadcast %+v", got)
	}
	if r := e.recipients(t, b.ID)["15550001"]; r.Status != "queued" || r.Attempts != 0 {
		t.Fatalf("recipient %+v", r)
	}
	time.Sleep(300 * time.Millisecond) // (an absence: a paused broadcast sends nothing meanwhile)
	if n := e.sender.total(); n != 1 {
		t.Fatalf("%d sends of a paused broadcast", n)
	}

	e.sender.script["15550009"] = []relay.SendResult{{Status: 403, Outcome: relay.OutcomeInactive, NotSent: true}}
	c := e.create(t, 6000, "15550009", "15550010")
	got = e.waitFor(t, c.ID, "cancelled", func(b store.Broadcast) bool { return b.Status == store.BroadcastCancelled })
	if got.Counts.Queued != 0 || got.Counts.Total != 2 {
		t.Fatalf("cancelled broadcast counts %+v", got.Counts)
	}
	if n := e.sender.sends("15550010"); n != 0 {
		t.Fatalf("a cancelled broadcast's recipient was sent")
	}
}

// TestBroadcastWorkerStopWaitsForSends: cancelling the worker's context waits for the send in
// flight and writes its outcome.
func TestBroadcastWorkerStopWaitsForSends(t *testing.T) {
	e := newWorkerEnv(t)
	e.sender.hold, e.sender.started = make(chan struct{}), make(chan struct{}, 10)
	b := e.create(t, 60, "15550001", "15550002")
	stop := e.run(t, Config{Workers: 1})
	<-e.sender.started
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Run returned with a send in flight")
	case <-time.After(200 * time.Millisecond):
	}
	close(e.sender.hold)
	<-stopped
	got, err := e.st.GetBroadcast(context.Background(), e.org, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Counts.Accepted != 1 || got.Counts.Queued != 1 || e.sender.total() != 1 {
		t.Fatalf("after stop: counts %+v, %d sends", got.Counts, e.sender.total())
	}
}

// TestBroadcastWorkerDeletedChannel: a channel the sender cannot find any more cancels the
// broadcast.
func TestBroadcastWorkerDeletedChannel(t *testing.T) {
	e := newWorkerEnv(t)
	e.sender.errs[e.ch] = store.ErrChannelNotFound
	b := e.create(t, 6000, "15550001", "15550002")
	e.run(t, Config{Workers: 1})
	e.waitFor(t, b.ID, "cancelled", func(b store.Broadcast) bool { return b.Status == store.BroadcastCancelled })
	if n := e.sender.total(); n != 0 {
		t.Fatalf("%d sends", n)
	}
}

// TestBroadcastWorkerLeaseSweep: a send that outlives its lease is made unknown by the sweep
// (every Lease/4), and is not sent again; its outcome, arriving later, still lands.
func TestBroadcastWorkerLeaseSweep(t *testing.T) {
	e := newWorkerEnv(t)
	e.sender.hold, e.sender.started = make(chan struct{}), make(chan struct{}, 10)
	b := e.create(t, 6000, "15550001")
	e.run(t, Config{Workers: 2, Lease: 400 * time.Millisecond})
	<-e.sender.started
	e.waitFor(t, b.ID, "unknown", func(b store.Broadcast) bool { return b.Counts.Unknown == 1 })
	time.Sleep(300 * time.Millisecond) // the other worker claims meanwhile: nothing
	close(e.sender.hold)
	e.waitFor(t, b.ID, "the late outcome", func(b store.Broadcast) bool { return b.Counts.Accepted == 1 })
	if n := e.sender.total(); n != 1 {
		t.Fatalf("%d sends, want 1", n)
	}
}
