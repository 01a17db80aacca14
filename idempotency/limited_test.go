package idempotency

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap/zaptest"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/ratelimit"
)

// limitedPair returns two stores and two limiters (limit per minute) on separate clients of
// the same Redis (single or Cluster): two instances.
func limitedPair(t *testing.T, clients [2]redis.UniversalClient, limit int) ([2]*Redis, [2]*ratelimit.RedisLimiter) {
	t.Helper()
	prefix := testPrefix()
	var stores [2]*Redis
	var lims [2]*ratelimit.RedisLimiter
	for i, c := range clients {
		stores[i] = NewRedis(c, Options{Prefix: prefix}, zaptest.NewLogger(t))
		t.Cleanup(func() { stores[i].Close() })
		lims[i] = ratelimit.NewRedis(c, limit, time.Minute, prefix+"rl:")
	}
	return stores, lims
}

// testBeginLimited: exactly limit of many concurrent calls from two instances are admitted;
// a refused call claims nothing; one call per key acquires it, the others replay its answer
// once completed; the waiting path does not count again.
func testBeginLimited(t *testing.T, clients [2]redis.UniversalClient) {
	ctx := context.Background()
	stores, lims := limitedPair(t, clients, 100)

	// 150 concurrent calls for one channel, distinct keys: exactly 100 admitted and claimed.
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 150 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, res, err := stores[i%2].BeginLimited(ctx, lims[i%2], "{ch-a}", "{ch-a}:k"+itoa(i), "fp")
			switch {
			case err != nil:
				t.Error(err)
			case d.Allowed && res.Outcome == Acquired && res.Token != "":
				admitted.Add(1)
			case !d.Allowed && res == (Result{}) && d.RetryAfter > 0:
				refused.Add(1)
			default:
				t.Errorf("call %d: %+v %+v", i, d, res)
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 100 || refused.Load() != 50 {
		t.Fatalf("admitted %d, refused %d; want 100 and 50", admitted.Load(), refused.Load())
	}
	// Every refused key is free: nothing was claimed for it (a store that does not wait says
	// in progress for the others).
	check := NewRedis(clients[0], Options{Prefix: stores[0].opt.Prefix, Wait: -1}, nil)
	defer check.Close()
	free := 0
	for i := range 150 {
		res, err := check.Begin(ctx, "{ch-a}:k"+itoa(i), "fp")
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome == Acquired {
			free++
		}
	}
	if free != 50 {
		t.Fatalf("%d keys free after the run, want the 50 refused ones", free)
	}

	// One key, 50 concurrent calls on two instances: one owner; the rest wait and replay.
	var owners atomic.Int64
	ownerDone := make(chan struct{})
	results := make([]Result, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, res, err := stores[i%2].BeginLimited(ctx, lims[i%2], "{ch-b}", "{ch-b}:once", "fp")
			if err != nil || !d.Allowed {
				t.Errorf("call %d: %+v %v", i, d, err)
				return
			}
			if res.Outcome == Acquired {
				owners.Add(1)
				waitWaiting(t, 49)
				if err := stores[i%2].Complete(ctx, "{ch-b}:once", res.Token, sampleResponse("once")); err != nil {
					t.Error(err)
				}
				close(ownerDone)
				return
			}
			results[i] = res
		}()
	}
	wg.Wait()
	if owners.Load() != 1 {
		t.Fatalf("%d owners of one key, want 1", owners.Load())
	}
	for i, res := range results {
		if res.Outcome == Acquired {
			continue
		}
		if res.Outcome != Replay {
			t.Fatalf("call %d: %v, want a replay", i, res.Outcome)
		}
		sameResponse(t, res.Response, sampleResponse("once"))
	}
	// The 50 calls counted once each, waits included: 50 of 100 used.
	d, err := lims[0].Allow(ctx, "{ch-b}")
	if err != nil || d.Remaining != 49 {
		t.Fatalf("after 50 calls and one more: %+v %v, want 49 remaining", d, err)
	}
}

// limitRedisKey is the Redis key of lim's log for key.
func limitRedisKey(lim *ratelimit.RedisLimiter, key string) string {
	c, _ := lim.Prepare(key)
	return c.Key
}

func itoa(i int) string {
	return string(rune('a'+i/26/26%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i%26))
}

// TestBeginLimited runs testBeginLimited on one Redis.
func TestBeginLimited(t *testing.T) {
	url := testenv.Redis(t)
	testBeginLimited(t, [2]redis.UniversalClient{newTestClient(t, url), newTestClient(t, url)})
}

// TestBeginLimitedCluster runs testBeginLimited on a 3-master Redis Cluster, each instance on
// its own cluster client; keys without a common hash tag are refused with ErrUnavailable.
func TestBeginLimitedCluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, 3)
	testBeginLimited(t, [2]redis.UniversalClient{c.Client(t), c.Client(t)})

	stores, lims := limitedPair(t, [2]redis.UniversalClient{c.Client(t), c.Client(t)}, 10)
	for i := 0; ; i++ { // two keys in different slots
		limitKey, key := "{x}", "{y"+itoa(i)+"}:k"
		if c.MasterOf(t, limitRedisKey(lims[0], limitKey)) == c.MasterOf(t, stores[0].opt.Prefix+key) {
			continue
		}
		_, _, err := stores[0].BeginLimited(context.Background(), lims[0], limitKey, key, "fp")
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("keys in two slots: %v, want ErrUnavailable", err)
		}
		break
	}
}

// TestBeginLimitedRedisDown: with Redis gone, BeginLimited fails with ErrUnavailable.
func TestBeginLimitedRedisDown(t *testing.T) {
	srv := testenv.StartRedis(t)
	stores, lims := limitedPair(t, [2]redis.UniversalClient{newTestClient(t, srv.URL()), newTestClient(t, srv.URL())}, 10)
	srv.Kill(t)
	if _, _, err := stores[0].BeginLimited(context.Background(), lims[0], "{c}", "{c}:k", "fp"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Redis down: %v, want ErrUnavailable", err)
	}
}
