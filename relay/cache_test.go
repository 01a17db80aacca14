package relay

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// countingStore counts the channel loads that reach Postgres.
type countingStore struct {
	*store.Store
	loads atomic.Int64
}

func (s *countingStore) RelayChannelByToken(ctx context.Context, token string) (store.RelayChannel, error) {
	s.loads.Add(1)
	return s.Store.RelayChannelByToken(ctx, token)
}

// cacheEnv is a store that counts its channel loads, its pool and a pending channel.
func cacheEnv(t testing.TB) (*countingStore, *pgxpool.Pool, store.Channel) {
	t.Helper()
	f := testenv.NewStore(t)
	return &countingStore{Store: f.Store}, f.Pool, f.Channel(t, f.Org(t).ID)
}

// lockChannels holds an exclusive lock on the channels table until the test ends: every load
// blocks.
func lockChannels(t *testing.T, pool *pgxpool.Pool) func() {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), `LOCK TABLE channels IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release := func() { once.Do(func() { tx.Rollback(context.Background()) }) }
	t.Cleanup(release)
	return release
}

// TestCacheWaitersHonourTheirContext: a request waiting for a blocked load gives up when its
// own context ends, and the load itself gives up at its deadline.
func TestCacheWaitersHonourTheirContext(t *testing.T) {
	st, pool, ch := cacheEnv(t)
	c := NewCache(st, time.Minute)
	c.fetchTimeout = 500 * time.Millisecond
	release := lockChannels(t, pool)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := c.Lookup(ctx, ch.ChannelToken); done <- err }()
	testenv.Eventually(t, testenv.Patience, func() bool { return st.loads.Load() == 1 }, "the load to block") // the load is blocked
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	// a patient waiter gets the load's own deadline, not a hang
	if _, err := c.Lookup(context.Background(), ch.ChannelToken); err == nil || errors.Is(err, ErrUnknownToken) {
		t.Fatalf("blocked load: %v", err)
	}
	release()
	if got, err := c.Lookup(context.Background(), ch.ChannelToken); err != nil || got.ID != ch.ID {
		t.Fatalf("after the lock: %v %v", got, err)
	}
}

// TestCacheOneRefreshPerEntry: many requests on a stale entry are all served from memory and
// start exactly one background refresh.
func TestCacheOneRefreshPerEntry(t *testing.T) {
	st, pool, ch := cacheEnv(t)
	c := NewCache(st, time.Minute)
	clock := time.Now()
	var mu sync.Mutex
	c.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	if _, err := c.Lookup(context.Background(), ch.ChannelToken); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	clock = clock.Add(90 * time.Second) // stale, within the grace period
	mu.Unlock()
	release := lockChannels(t, pool) // the refresh blocks until released
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got, err := c.Lookup(context.Background(), ch.ChannelToken); err != nil || got.ID != ch.ID {
				t.Errorf("stale lookup: %v %v", got, err)
			}
		}()
	}
	wg.Wait() // every request answered while the refresh is blocked
	release()
	testenv.Eventually(t, testenv.Patience, func() bool {
		c.mu.RLock()
		defer c.mu.RUnlock()
		e := c.byHash[sha256.Sum256([]byte(ch.ChannelToken))]
		return e != nil && e.fetched.Equal(clock)
	}, "the refresh")
	if n := st.loads.Load(); n != 2 {
		t.Fatalf("loads = %d, want 2 (the first and one refresh)", n)
	}
}

// TestCacheNegativesBounded: unknown tokens are remembered in bounded memory, and the newest
// are still answered without a query when the table is full.
func TestCacheNegativesBounded(t *testing.T) {
	st, _, _ := cacheEnv(t)
	c := NewCache(st, time.Minute)
	c.maxNegatives = 100
	var last string
	for i := 0; i < 1000; i++ {
		b := make([]byte, 32)
		rand.Read(b)
		last = base64.RawURLEncoding.EncodeToString(b)
		if _, err := c.Lookup(context.Background(), last); !errors.Is(err, ErrUnknownToken) {
			t.Fatal(err)
		}
	}
	c.mu.RLock()
	n := len(c.neg) + len(c.negOld)
	c.mu.RUnlock()
	if n > 100 {
		t.Fatalf("%d unknown tokens held, bound 100", n)
	}
	before := st.loads.Load()
	if _, err := c.Lookup(context.Background(), last); !errors.Is(err, ErrUnknownToken) || st.loads.Load() != before {
		t.Fatalf("the newest unknown token cost a query (%v)", err)
	}
}
