package idempotency

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// scripts counts the script calls a client sends to Redis and the round trips they took
// (a single call, or a pipeline); gate, if set, is called with the size of the first one and
// holds it until gate returns.
type scripts struct {
	calls, trips *atomic.Int64
	gate         *func(size int)
	once         *sync.Once
}

func (h scripts) sent(size int) {
	h.calls.Add(int64(size))
	h.trips.Add(1)
	if g := *h.gate; g != nil {
		h.once.Do(func() { g(size) })
	}
}

func (h scripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h scripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			h.sent(1)
		}
		return next(ctx, cmd)
	}
}
func (h scripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, c := range cmds {
			if c.Name() == "evalsha" {
				n++
			}
		}
		if n > 0 { // not the connection set-up (HELLO, CLIENT SETINFO)
			h.sent(n)
		}
		return next(ctx, cmds)
	}
}

// testCompleteBatched: 200 concurrent completions and an impostor (a token that does not own
// its key): each owner's answer is stored under its own key (replayed byte for byte), the
// impostor gets ErrNotOwner and changes nothing, and completions that queued while a batch was
// on its way went to Redis together: the first round trip is held until every other completion
// has queued, after which they take a few pipelines, not one round trip each.
func testCompleteBatched(t *testing.T, client redis.UniversalClient, counted scripts) {
	ctx := context.Background()
	s := NewRedis(client, Options{Prefix: testPrefix()}, nil)
	defer func() { _ = s.Close() }()
	const n = 200
	var queued atomic.Bool
	*counted.gate = func(first int) {
		// On the flusher's goroutine: no t.Fatal here.
		queued.Store(testenv.Within(patience, func() bool {
			return s.calls.Queued() == n+1-first
		}))
	}
	tokens := make([]string, n)
	for i := range n {
		res, err := s.Begin(ctx, "{c}:"+itoa(i), "fp")
		if err != nil || res.Outcome != Acquired {
			t.Fatalf("begin %d: %+v %v", i, res, err)
		}
		tokens[i] = res.Token
	}
	counted.calls.Store(0)
	counted.trips.Store(0)
	var wg sync.WaitGroup
	errs := make([]error, n+1)
	start := make(chan struct{})
	for i := range n + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if i == n { // the impostor, on key 0
				// In a token's form (owner, separator, fingerprint), so that it goes to Redis.
				errs[i] = s.Complete(ctx, "{c}:"+itoa(0), "not-the-owner"+tokenSep+"fp", sampleResponse("impostor"))
				return
			}
			errs[i] = s.Complete(ctx, "{c}:"+itoa(i), tokens[i], sampleResponse(itoa(i)))
		}()
	}
	close(start)
	wg.Wait()
	*counted.gate = nil
	for i, err := range errs[:n] {
		if err != nil {
			t.Fatalf("complete %d: %v", i, err)
		}
	}
	if !errors.Is(errs[n], ErrNotOwner) {
		t.Fatalf("impostor: %v, want ErrNotOwner", errs[n])
	}
	for i := range n {
		res, err := s.Begin(ctx, "{c}:"+itoa(i), "fp")
		if err != nil || res.Outcome != Replay {
			t.Fatalf("replay %d: %+v %v", i, res, err)
		}
		sameResponse(t, res.Response, sampleResponse(itoa(i)))
	}
	// 200 queued behind the held one: two pipelines of at most 128 (more on a Cluster, one per
	// node and batch).
	if !queued.Load() {
		t.Fatalf("the other completions did not queue behind the first round trip within %v", patience)
	}
	// 201 completions: the held first round trip, then at most two pipelines (128 each) per
	// node, each sent once more if a server had not cached the script yet; one round trip
	// each would be 201.
	if calls, trips := counted.calls.Load(), counted.trips.Load(); calls < n+1 || trips > 12 {
		t.Fatalf("%d completions took %d script calls in %d round trips", n+1, calls, trips)
	}
}

func TestCompleteBatched(t *testing.T) {
	counted := newScripts()
	client := testenv.RedisClient(t, testenv.Redis(t), testenv.ShortTimeouts)
	client.AddHook(counted)
	testCompleteBatched(t, client, counted)
}

func TestCompleteBatchedCluster(t *testing.T) {
	counted := newScripts()
	client := testenv.StartRedisCluster(t, 3).Client(t)
	client.AddHook(counted)
	testCompleteBatched(t, client, counted)
}

func newScripts() scripts {
	return scripts{calls: new(atomic.Int64), trips: new(atomic.Int64), gate: new(func(int)), once: new(sync.Once)}
}

func itoa(i int) string {
	return string(rune('a'+i/26/26%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i%26))
}
