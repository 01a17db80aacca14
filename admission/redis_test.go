package admission

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap/zaptest"

	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/ratelimit"
)

// pair is two instances on separate clients of the same Redis (single or Cluster): each with
// its idempotency store, limit log (limit per minute) and combined admission.
type pair struct {
	prefix string
	stores [2]*idempotency.Redis
	lims   [2]*ratelimit.RedisLimiter
	adms   [2]*combined
}

func newPair(t *testing.T, clients [2]redis.UniversalClient, limit int) pair {
	t.Helper()
	p := pair{prefix: "wabarelay:admission:test:" + rand.Text() + ":"}
	for i, c := range clients {
		p.stores[i] = idempotency.NewRedis(c, idempotency.Options{Prefix: p.prefix}, zaptest.NewLogger(t))
		t.Cleanup(func() { _ = p.stores[i].Close() })
		p.lims[i] = ratelimit.NewRedis(c, limit, time.Minute, p.prefix+"rl:")
		p.adms[i] = NewRedis(c, p.lims[i], p.stores[i], nil, nil).combined
	}
	return p
}

// testClaimRedis: exactly limit of many concurrent calls from two instances are admitted;
// a refused call claims nothing; one call per key acquires it, the others replay its answer
// once completed; the waiting path does not count again.
func testClaimRedis(t *testing.T, clients [2]redis.UniversalClient) {
	ctx := context.Background()
	p := newPair(t, clients, 100)

	// 150 concurrent calls for one channel, distinct keys: exactly 100 admitted and claimed.
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 150 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, res, err := p.adms[i%2].claim(ctx, "{ch-a}", "{ch-a}:k"+strconv.Itoa(i), "fp")
			switch {
			case err != nil:
				t.Error(err)
			case d.Allowed && res.Outcome == idempotency.Acquired && res.Token != "":
				admitted.Add(1)
			case !d.Allowed && res == (idempotency.Result{}) && d.RetryAfter > 0:
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
	check := idempotency.NewRedis(clients[0], idempotency.Options{Prefix: p.prefix, Wait: -1}, nil)
	defer func() { _ = check.Close() }()
	free := 0
	for i := range 150 {
		res, err := check.Begin(ctx, "{ch-a}:k"+strconv.Itoa(i), "fp")
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome == idempotency.Acquired {
			free++
		}
	}
	if free != 50 {
		t.Fatalf("%d keys free after the run, want the 50 refused ones", free)
	}

	// One key, 50 concurrent calls on two instances: one owner; the rest wait and replay.
	var owners atomic.Int64
	ownerDone := make(chan struct{})
	results := make([]idempotency.Result, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, res, err := p.adms[i%2].claim(ctx, "{ch-b}", "{ch-b}:once", "fp")
			if err != nil || !d.Allowed {
				t.Errorf("call %d: %+v %v", i, d, err)
				return
			}
			if res.Outcome == idempotency.Acquired {
				owners.Add(1)
				if !testenv.Within(testenv.Patience, func() bool { return parkedClaims() >= 49 }) {
					t.Errorf("the other 49 claims are not waiting for the owner")
				}
				if err := p.stores[i%2].Complete(ctx, "{ch-b}:once", res.Token, sampleResponse); err != nil {
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
		if res.Outcome == idempotency.Acquired {
			continue
		}
		if res.Outcome != idempotency.Replay {
			t.Fatalf("call %d: %v, want a replay", i, res.Outcome)
		}
		if r := res.Response; r == nil || r.Status != 200 || !bytes.Equal(r.Body, sampleResponse.Body) {
			t.Fatalf("call %d replayed %+v, want %+v", i, r, sampleResponse)
		}
	}
	// The 50 calls counted once each, waits included: 50 of 100 used.
	d, err := p.lims[0].Allow(ctx, "{ch-b}")
	if err != nil || d.Remaining != 49 {
		t.Fatalf("after 50 calls and one more: %+v %v, want 49 remaining", d, err)
	}
}

// limitRedisKey is the Redis key of lim's log for key.
func limitRedisKey(lim *ratelimit.RedisLimiter, key string) string {
	c, _ := lim.Prepare(key)
	return c.Key
}

// TestClaimRedis runs testClaimRedis on one Redis.
func TestClaimRedis(t *testing.T) {
	url := testenv.Redis(t)
	testClaimRedis(t, twoClients(t, url))
}

// TestClaimRedisCluster runs testClaimRedis on a 3-master Redis Cluster, each instance on its
// own cluster client; keys without a common hash tag are refused with ErrUnavailable.
func TestClaimRedisCluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, 3)
	testClaimRedis(t, [2]redis.UniversalClient{c.Client(t), c.Client(t)})

	p := newPair(t, [2]redis.UniversalClient{c.Client(t), c.Client(t)}, 10)
	for i := 0; ; i++ { // two keys in different slots
		limitKey, key := "{x}", "{y"+strconv.Itoa(i)+"}:k"
		if c.MasterOf(t, limitRedisKey(p.lims[0], limitKey)) == c.MasterOf(t, p.prefix+key) {
			continue
		}
		_, _, err := p.adms[0].claim(context.Background(), limitKey, key, "fp")
		if !errors.Is(err, idempotency.ErrUnavailable) {
			t.Fatalf("keys in two slots: %v, want ErrUnavailable", err)
		}
		break
	}
}

// TestClaimRedisDown: with Redis gone, a combined claim fails with ErrUnavailable.
func TestClaimRedisDown(t *testing.T) {
	srv := testenv.StartRedis(t)
	p := newPair(t, twoClients(t, srv.URL()), 10)
	srv.Kill(t)
	if _, _, err := p.adms[0].claim(context.Background(), "{c}", "{c}:k", "fp"); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Redis down: %v, want ErrUnavailable", err)
	}
}

// twoClients returns two clients of the Redis at url (two instances), with short timeouts so
// that a dead Redis shows promptly.
func twoClients(t *testing.T, url string) [2]redis.UniversalClient {
	return [2]redis.UniversalClient{testenv.RedisClient(t, url, testenv.ShortTimeouts), testenv.RedisClient(t, url, testenv.ShortTimeouts)}
}

// sampleResponse is a send's answer as the relay stores it.
var sampleResponse = idempotency.Response{Status: 200, Header: http.Header{"Content-Type": {"application/json"}},
	Body: []byte(`{"messages":[{"id":"wamid.once"}]}`)}

// parkedClaims counts the claims waiting for their key's owner, parked in
// idempotency.(*Redis).begin (testenv.Parked): how a test knows that they wait, instead of
// sleeping "long enough".
func parkedClaims() int {
	return testenv.Parked(func(fn string) bool { return fn == "github.com/wabarelay/wabarelay/idempotency.(*Redis).begin" })
}

// BenchmarkClaimRedis measures one keyed send's admission on Redis (limit + claim in one round
// trip), each with a new key under a limit it never reaches.
func BenchmarkClaimRedis(b *testing.B) {
	client := testenv.RedisClient(b, testenv.Redis(b), testenv.ShortTimeouts)
	prefix := "wabarelay:admission:bench:" + rand.Text() + ":"
	idem := idempotency.NewRedis(client, idempotency.Options{Prefix: prefix}, nil)
	b.Cleanup(func() { _ = idem.Close() })
	adm := NewRedis(client, ratelimit.NewRedis(client, 1<<30, time.Minute, prefix+"rl:"), idem, nil, nil)
	channel, ctx := uuid.New(), context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, res, err := adm.Claim(ctx, channel, strconv.Itoa(i), "fp"); err != nil || res.Outcome != idempotency.Acquired {
			b.Fatal(res, err)
		}
	}
}
