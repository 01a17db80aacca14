package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeClock is a manually advanced clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newTestMemory(t testing.TB, limit int, window time.Duration) (*MemoryLimiter, *fakeClock) {
	clk := newFakeClock()
	m := newMemory(limit, window, clk.Now, 0)
	t.Cleanup(m.Close)
	return m, clk
}

func mustAllow(t testing.TB, l Limiter, key string) Decision {
	t.Helper()
	d, err := l.Allow(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestMemory100PerMinute(t *testing.T) {
	m, clk := newTestMemory(t, 100, time.Minute)
	for i := range 100 {
		d := mustAllow(t, m, "k")
		if !d.Allowed || d.Limit != 100 || d.Remaining != 99-i || d.RetryAfter != 0 {
			t.Fatalf("call %d: %+v", i+1, d)
		}
		if want := time.Minute - time.Duration(i)*100*time.Millisecond; d.Reset != want {
			t.Fatalf("call %d: Reset %v, want %v", i+1, d.Reset, want)
		}
		clk.Advance(100 * time.Millisecond)
	}
	// Now 10 s after the first call.
	d := mustAllow(t, m, "k")
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != 50*time.Second || d.Reset != 50*time.Second {
		t.Fatalf("101st: %+v, want rejected with RetryAfter 50s", d)
	}
	h := http.Header{}
	d.SetHeaders(h)
	checkHeaders(t, h, map[string]string{"RateLimit-Limit": "100", "RateLimit-Remaining": "0", "RateLimit-Reset": "50", "Retry-After": "50"})

	clk.Advance(50*time.Second - time.Nanosecond)
	if d := mustAllow(t, m, "k"); d.Allowed || d.RetryAfter != time.Nanosecond {
		t.Fatalf("1ns before the oldest leaves: %+v", d)
	}
	clk.Advance(time.Nanosecond)
	if d := mustAllow(t, m, "k"); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("when the oldest leaves: %+v", d)
	}
	if d := mustAllow(t, m, "k"); d.Allowed || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("next: %+v, want RetryAfter 100ms (second oldest)", d)
	}
}

func TestMemoryRejectedDoNotCount(t *testing.T) {
	m, clk := newTestMemory(t, 5, time.Second)
	for range 5 {
		mustAllow(t, m, "k")
	}
	for range 1000 {
		clk.Advance(time.Millisecond / 2)
		if d := mustAllow(t, m, "k"); d.Allowed {
			t.Fatal("allowed while full")
		}
	}
	clk.Advance(500 * time.Millisecond) // exactly 1 s after the first five
	for range 5 {
		if d := mustAllow(t, m, "k"); !d.Allowed {
			t.Fatalf("rejected calls counted: %+v", d)
		}
	}
}

// TestMemoryNoMoreThanLimitInAnyWindow feeds random arrival patterns (bursts,
// ties, gaps) and checks every decision against a brute-force model and every
// window of accepted timestamps against the limit.
func TestMemoryNoMoreThanLimitInAnyWindow(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 42))
		limit := 1 + rng.IntN(10)
		window := time.Duration(1+rng.IntN(1000)) * time.Millisecond
		changeLimits := seed%4 == 3 // some runs also change the limit on the fly
		t.Run(fmt.Sprintf("seed%d_limit%d_window%v", seed, limit, window), func(t *testing.T) {
			m, clk := newTestMemory(t, limit, window)
			start := clk.Now()
			var accepted []time.Duration // offsets from start
			curLimit := limit
			for i := range 2000 {
				switch r := rng.IntN(10); {
				case r < 3: // same instant
				case r < 8:
					clk.Advance(time.Duration(rng.Int64N(int64(window) / int64(limit))))
				case r < 9:
					clk.Advance(time.Duration(rng.Int64N(int64(window) * 2)))
				default:
					clk.Advance(time.Duration(rng.IntN(3)) * window) // exact multiples
				}
				if changeLimits && rng.IntN(100) == 0 {
					curLimit = rng.IntN(12)
					m.SetLimit(curLimit, window)
				}
				now := clk.Now().Sub(start)
				key := []string{"a", "b"}[i%2] // two keys interleaved; model uses "a" only
				d := mustAllow(t, m, key)
				if key != "a" {
					continue
				}
				// Model: accepted requests still inside (now-window, now].
				var in []time.Duration
				for _, a := range accepted {
					if now-a < window {
						in = append(in, a)
					}
				}
				wantAllowed := len(in) < curLimit
				if d.Allowed != wantAllowed {
					t.Fatalf("call %d at %v: allowed=%v, model says %v (in window %d, limit %d)", i, now, d.Allowed, wantAllowed, len(in), curLimit)
				}
				if d.Limit != curLimit {
					t.Fatalf("Limit %d, want %d", d.Limit, curLimit)
				}
				if curLimit == 0 {
					continue
				}
				if wantAllowed {
					accepted = append(accepted, now)
					in = append(in, now)
					if d.Remaining != curLimit-len(in) || d.RetryAfter != 0 {
						t.Fatalf("call %d: %+v, want remaining %d", i, d, curLimit-len(in))
					}
				} else {
					want := in[len(in)-curLimit] + window - now
					if d.Remaining != 0 || d.RetryAfter != want || d.RetryAfter <= 0 || d.RetryAfter > window {
						t.Fatalf("call %d: %+v, want RetryAfter %v", i, d, want)
					}
				}
				if want := in[0] + window - now; d.Reset != want {
					t.Fatalf("call %d: Reset %v, want %v", i, d.Reset, want)
				}
			}
			if changeLimits {
				return // the invariant below is for a fixed limit
			}
			// No window of length `window` holds more than limit accepted
			// requests: the (i+limit)-th acceptance is at least a window later.
			sort.Slice(accepted, func(i, j int) bool { return accepted[i] < accepted[j] })
			for i := 0; i+limit < len(accepted); i++ {
				if accepted[i+limit]-accepted[i] < window {
					t.Fatalf("%d accepted within %v: %v", limit+1, accepted[i+limit]-accepted[i], accepted[i:i+limit+1])
				}
			}
			if len(accepted) < limit {
				t.Fatalf("only %d accepted", len(accepted))
			}
		})
	}
}

func TestMemoryConcurrentExact(t *testing.T) {
	m := NewMemory(100, time.Minute)
	defer m.Close()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		allowed = map[int]bool{}
		start   = make(chan struct{})
	)
	for range 300 {
		wg.Go(func() {
			<-start
			d := mustAllow(t, m, "hot")
			if d.Allowed {
				mu.Lock()
				allowed[d.Remaining] = true
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	if len(allowed) != 100 {
		t.Fatalf("%d distinct allowed, want exactly 100", len(allowed))
	}
}

func TestMemoryForgetsIdleKeys(t *testing.T) {
	m, clk := newTestMemory(t, 3, time.Minute)
	for i := range 1000 {
		mustAllow(t, m, fmt.Sprint("key-", i))
	}
	clk.Advance(30 * time.Second)
	mustAllow(t, m, "recent")
	if n := m.keys(); n != 1001 {
		t.Fatalf("%d keys tracked, want 1001", n)
	}
	clk.Advance(30*time.Second - time.Nanosecond)
	m.sweep()
	if n := m.keys(); n != 1001 {
		t.Fatalf("after sweep within the window: %d keys, want 1001", n)
	}
	clk.Advance(time.Nanosecond)
	m.sweep()
	if n := m.keys(); n != 1 {
		t.Fatalf("after sweep: %d keys, want only the recent one", n)
	}
	clk.Advance(30 * time.Second)
	m.sweep()
	if n := m.keys(); n != 0 {
		t.Fatalf("after sweep: %d keys, want 0", n)
	}
	// A forgotten key starts afresh.
	if d := mustAllow(t, m, "key-1"); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("forgotten key: %+v", d)
	}
}

// TestMemoryJanitorRuns runs in a synctest bubble: the limiter's clock and its janitor's
// ticker are the bubble's, so a minute passes at once.
func TestMemoryJanitorRuns(t *testing.T) {
	synctest.Test(t, testMemoryJanitorRuns)
}

func testMemoryJanitorRuns(t *testing.T) {
	m := newMemory(3, time.Minute, time.Now, time.Millisecond)
	defer m.Close()
	for i := range 100 {
		mustAllow(t, m, fmt.Sprint("key-", i))
	}
	time.Sleep(time.Minute + time.Millisecond) // the keys leave the window; the janitor sweeps
	synctest.Wait()
	if n := m.keys(); n != 0 {
		t.Fatalf("janitor did not forget idle keys: %d left", n)
	}
	m.Close()
	m.Close() // idempotent
	if d := mustAllow(t, m, "after-close"); !d.Allowed {
		t.Fatal("limiter must keep working after Close")
	}
}

func TestMemoryZeroLimit(t *testing.T) {
	m, _ := newTestMemory(t, 0, time.Minute)
	if d := mustAllow(t, m, "k"); d.Allowed || d.RetryAfter != time.Minute || d.RetryAfterSeconds() != 60 {
		t.Fatalf("%+v", d)
	}
}

func TestNewMemoryPanicsOnBadWindow(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("want a panic for window 0")
		}
	}()
	NewMemory(1, 0)
}
