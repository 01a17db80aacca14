package idempotency

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// pipelines counts the pipelines of scripts a client sends and the scripts in them; gate, if set, runs
// in the first single EVALSHA (the first completion), holding it until gate returns.
type pipelines struct {
	n, cmds *atomic.Int64
	gate    *func()
	once    *sync.Once
}

func (h pipelines) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h pipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" && *h.gate != nil {
			h.once.Do(*h.gate)
		}
		return next(ctx, cmd)
	}
}
func (h pipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		scripts := 0
		for _, c := range cmds {
			if c.Name() == "evalsha" {
				scripts++
			}
		}
		if scripts > 0 { // not the connection set-up (HELLO, CLIENT SETINFO)
			h.n.Add(1)
			h.cmds.Add(int64(scripts))
		}
		return next(ctx, cmds)
	}
}

// testCompleteBatched: 200 concurrent completions, one of them with a token that does not own
// its key: each owner's answer is stored under its own key (replayed byte for byte), the
// impostor gets ErrNotOwner and changes nothing, and completions that queued while a batch was
// on its way went to Redis together (the first completion is held until all others queued).
func testCompleteBatched(t *testing.T, client redis.UniversalClient, counted pipelines) {
	ctx := context.Background()
	s := NewRedis(client, Options{Prefix: testPrefix()}, nil)
	defer s.Close()
	const n = 200
	*counted.gate = func() {
		waitFor(t, func() bool {
			s.completions.mu.Lock()
			defer s.completions.mu.Unlock()
			return len(s.completions.queue) == n // all but the held one, impostor included
		})
	}
	tokens := make([]string, n)
	for i := range n {
		res, err := s.Begin(ctx, "{c}:"+itoa(i), "fp")
		if err != nil || res.Outcome != Acquired {
			t.Fatalf("begin %d: %+v %v", i, res, err)
		}
		tokens[i] = res.Token
	}
	var wg sync.WaitGroup
	errs := make([]error, n+1)
	start := make(chan struct{})
	for i := range n + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if i == n { // the impostor, on key 0
				errs[i] = s.Complete(ctx, "{c}:"+itoa(0), "not-the-owner", sampleResponse("impostor"))
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
	if p, c := counted.n.Load(), counted.cmds.Load(); c != n || p < 2 || p > 6 {
		t.Fatalf("%d queued completions went in %d pipelines of %d commands in all", n, p, c)
	}
}

func TestCompleteBatched(t *testing.T) {
	counted := newPipelines()
	client := newTestClient(t, testenv.Redis(t))
	client.AddHook(counted)
	testCompleteBatched(t, client, counted)
}

func TestCompleteBatchedCluster(t *testing.T) {
	counted := newPipelines()
	client := testenv.StartRedisCluster(t, 3).Client(t)
	client.AddHook(counted)
	testCompleteBatched(t, client, counted)
}

func newPipelines() pipelines {
	return pipelines{n: new(atomic.Int64), cmds: new(atomic.Int64), gate: new(func()), once: new(sync.Once)}
}

// waitFor polls cond until it holds, failing the test after patience.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(patience); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", patience)
		}
	}
}
