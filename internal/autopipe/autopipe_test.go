package autopipe

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// patience bounds what a test waits for on a loaded machine (a deadline, not a timing).
const patience = 30 * time.Second

// echo returns its key and argument, or fails when the argument is "fail".
var echo = redis.NewScript(`
if ARGV[1] == 'fail' then return redis.error_reply('ERR asked to fail') end
redis.call('SET', KEYS[1], ARGV[1])
return {KEYS[1], ARGV[1]}
`)

// trips counts the round trips that carry scripts (a single call, or a pipeline) and the
// script calls in them; hold, if set, is called with each round trip's number (from 1) and size
// before it is sent and holds it until hold returns.
type trips struct {
	calls, trips atomic.Int64
	hold         func(trip int64, size int)
}

func (h *trips) sent(cmds []redis.Cmder) {
	n := 0
	for _, c := range cmds {
		if c.Name() == "evalsha" || c.Name() == "eval" {
			n++
		}
	}
	if n == 0 {
		return // the connection's set-up
	}
	h.calls.Add(int64(n))
	trip := h.trips.Add(1)
	if h.hold != nil {
		h.hold(trip, n)
	}
}

func (h *trips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *trips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.sent([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (h *trips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.sent(cmds)
		return next(ctx, cmds)
	}
}

// testBatches: 300 concurrent calls, one of which fails in Redis, while the first round trip is
// held: the others queue and go in a few pipelines, each call gets its own reply or error, and
// a script Redis does not have (SCRIPT FLUSH before) is loaded on the way.
func testBatches(t *testing.T, client redis.UniversalClient, h *trips) {
	ctx := context.Background()
	p := New(client)
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 300
	queued := make(chan bool, 1)
	h.hold = func(trip int64, first int) { // on the goroutine sending the round trip: no t.Fatal
		if trip == 1 {
			queued <- testenv.Within(patience, func() bool { return p.Queued() == n-first })
		}
	}
	replies := make([]*redis.Cmd, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			arg := strconv.Itoa(i)
			if i == 7 {
				arg = "fail"
			}
			replies[i] = p.Run(ctx, echo, []string{"{k" + strconv.Itoa(i%5) + "}:" + strconv.Itoa(i)}, arg)
		}()
	}
	wg.Wait()
	if !<-queued {
		t.Fatalf("the other calls did not queue behind the first round trip within %v", patience)
	}
	for i, cmd := range replies {
		got, err := cmd.Slice()
		switch {
		case i == 7:
			if err == nil || err.Error() != "ERR asked to fail" {
				t.Fatalf("call 7: %v %v, want its script's error", got, err)
			}
		case err != nil:
			t.Fatalf("call %d: %v", i, err)
		case len(got) != 2 || got[0] != "{k"+strconv.Itoa(i%5)+"}:"+strconv.Itoa(i) || got[1] != strconv.Itoa(i):
			t.Fatalf("call %d: reply %v", i, got)
		}
	}
	// The held call, then 299 in pipelines of at most MaxBatch (per node on a Cluster), each
	// sent once more with EVAL where the server had not loaded the script: not 300 round trips.
	if trips := h.trips.Load(); trips > 24 {
		t.Fatalf("%d calls took %d round trips", n, trips)
	}
	// A lone call afterwards goes at once.
	if v, err := p.Run(ctx, echo, []string{"{k0}:lone"}, "x").Slice(); err != nil || v[1] != "x" {
		t.Fatalf("lone call: %v %v", v, err)
	}
	if p.Queued() != 0 {
		t.Fatalf("%d calls left queued", p.Queued())
	}
}

func TestBatches(t *testing.T) {
	h := new(trips)
	client := testenv.RedisClient(t, testenv.Redis(t), testenv.ShortTimeouts)
	client.AddHook(h)
	testBatches(t, client, h)
}

func TestBatchesCluster(t *testing.T) {
	h := new(trips)
	client := testenv.StartRedisCluster(t, 3).Client(t)
	client.AddHook(h)
	testBatches(t, client, h)
}

// TestCancelWhileQueued: a call whose context ends while it waits for a round trip returns the
// context's error at once and is not sent; the calls around it are answered.
func TestCancelWhileQueued(t *testing.T) {
	h := new(trips)
	client := testenv.RedisClient(t, testenv.Redis(t), testenv.ShortTimeouts)
	client.AddHook(h)
	p := New(client)
	ctx := context.Background()
	if err := echo.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	h.hold = func(trip int64, _ int) {
		if trip == 1 {
			<-release
		}
	}
	first := make(chan *redis.Cmd, 1)
	go func() { first <- p.Run(ctx, echo, []string{"held"}, "1") }()
	if !testenv.Within(patience, func() bool { return h.trips.Load() == 1 }) {
		t.Fatal("the first call was not sent")
	}
	cctx, cancel := context.WithCancel(ctx)
	gone := make(chan *redis.Cmd, 1)
	go func() { gone <- p.Run(cctx, echo, []string{"cancelled"}, "2") }()
	testenv.Eventually(t, patience, func() bool { return p.Queued() == 1 }, "the second call to queue")
	cancel()
	if err := (<-gone).Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v, want context.Canceled", err)
	}
	after := make(chan *redis.Cmd, 1)
	go func() { after <- p.Run(ctx, echo, []string{"after"}, "3") }()
	// The cancelled call left the queue.
	testenv.Eventually(t, patience, func() bool { return p.Queued() == 1 }, "the third call to queue, alone")
	close(release)
	if err := (<-first).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := (<-after).Slice(); err != nil || v[1] != "3" {
		t.Fatalf("call after the cancelled one: %v %v", v, err)
	}
	if n, err := client.Exists(ctx, "cancelled").Result(); err != nil || n != 0 {
		t.Fatalf("the cancelled call ran (%d, %v)", n, err)
	}
	if calls := h.calls.Load(); calls != 2 {
		t.Fatalf("%d script calls sent, want 2 (the cancelled one not)", calls)
	}
}

// TestCancelWhileSent: a call whose context ends once it is on its way (in a pipeline) waits
// for its answer and returns it, as go-redis does: a script that ran is never reported as not
// run.
func TestCancelWhileSent(t *testing.T) {
	h := new(trips)
	client := testenv.RedisClient(t, testenv.Redis(t), testenv.ShortTimeouts)
	client.AddHook(h)
	p := New(client)
	ctx := context.Background()
	if err := echo.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	release := [3]chan struct{}{nil, make(chan struct{}), make(chan struct{})}
	h.hold = func(trip int64, _ int) {
		if trip <= 2 {
			<-release[trip]
		}
	}
	first := make(chan *redis.Cmd, 1)
	go func() { first <- p.Run(ctx, echo, []string{"first"}, "1") }()
	testenv.Eventually(t, patience, func() bool { return h.trips.Load() == 1 }, "the first call to be sent")
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sent, other := make(chan *redis.Cmd, 1), make(chan *redis.Cmd, 1)
	go func() { sent <- p.Run(cctx, echo, []string{"sent"}, "2") }()
	go func() { other <- p.Run(ctx, echo, []string{"other"}, "3") }()
	testenv.Eventually(t, patience, func() bool { return p.Queued() == 2 }, "two calls to queue")
	close(release[1])
	testenv.Eventually(t, patience, func() bool { return h.trips.Load() == 2 }, "the pipeline of the two to be sent")
	cancel()
	close(release[2])
	if v, err := (<-sent).Slice(); err != nil || v[1] != "2" {
		t.Fatalf("call cancelled on its way: %v %v, want its script's reply", v, err)
	}
	for _, c := range []chan *redis.Cmd{first, other} {
		if err := (<-c).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRedisDown: with the server gone, a lone call and a batch fail with the client's error.
func TestRedisDown(t *testing.T) {
	srv := testenv.StartRedis(t)
	client := testenv.RedisClient(t, srv.URL(), testenv.ShortTimeouts)
	p := New(client)
	ctx := context.Background()
	if err := p.Run(ctx, echo, []string{"k"}, "1").Err(); err != nil {
		t.Fatal(err)
	}
	srv.Kill(t)
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.Run(ctx, echo, []string{"k"}, "1").Err()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err == nil || errors.Is(err, redis.Nil) {
			t.Fatalf("call %d with Redis down: %v, want an error", i, err)
		}
	}
	if p.Queued() != 0 {
		t.Fatalf("%d calls left queued", p.Queued())
	}
}
