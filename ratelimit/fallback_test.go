package ratelimit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestFallbackRedisOutage kills a real Redis under a Fallback limiter and
// brings it back.
func TestFallbackRedisOutage(t *testing.T) {
	srv := testenv.StartRedis(t)
	client := testenv.RedisClient(t, srv.URL(), func(o *redis.Options) { o.MaxRetries, o.DialTimeout = -1, time.Second })

	core, logs := observer.New(zapcore.InfoLevel)
	mem := NewMemory(3, time.Minute)
	defer mem.Close()
	l := NewFallback(NewRedis(client, 3, time.Minute, "rl:"), mem, zap.New(core))
	// The probe schedule runs on a fake clock: the test moves it past each probe time.
	clk := newFakeClock()
	l.(*fallbackLimiter).now = clk.Now

	// stored is the number of calls Redis holds for key (the entries of its log).
	stored := func(key string) int {
		t.Helper()
		return logEntries(t, testenv.RedisClient(t, srv.URL()), "rl:"+key+LogSuffix)
	}

	if d := mustAllow(t, l, "a"); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("before outage: %+v", d)
	}
	if n := stored("a"); n != 1 {
		t.Fatalf("before outage: Redis holds %d calls, want 1 (Redis answers)", n)
	}

	srv.Kill(t)
	// Decisions keep coming, limited in memory: never fail open.
	for i := range 10 {
		d := mustAllow(t, l, "b")
		if d.Allowed != (i < 3) {
			t.Fatalf("during outage, call %d: %+v", i, d)
		}
	}
	// Several probes fail: each call made once the clock has passed the next probe time tries
	// Redis, and its failure moves the probe time on.
	f := l.(*fallbackLimiter)
	for range 3 {
		f.mu.Lock()
		next := f.nextProbe
		f.mu.Unlock()
		clk.Advance(next.Sub(clk.Now()) + time.Millisecond)
		if d := mustAllow(t, l, "b"); d.Allowed {
			t.Fatalf("during outage: allowed beyond the memory limit")
		}
		f.mu.Lock()
		moved := f.nextProbe.After(next)
		f.mu.Unlock()
		if !moved {
			t.Fatal("a call past the probe time did not probe")
		}
	}
	for range 10 {
		if d := mustAllow(t, l, "b"); d.Allowed {
			t.Fatalf("during outage: allowed beyond the memory limit")
		}
	}
	if warns := logs.FilterLevelExact(zapcore.WarnLevel).Len(); warns != 1 {
		t.Fatalf("%d warnings logged during the outage, want exactly 1: %v", warns, logs.All())
	}

	srv.Restart(t)
	testenv.Eventually(t, testenv.Patience, func() bool {
		clk.Advance(defaultProbeEvery) // every call may probe
		mustAllow(t, l, "c")
		return stored("c") > 0
	}, "the Redis limiter to be used again after the restart")
	// Back on Redis: a fresh key gets exactly the limit, recorded in Redis.
	for i := range 5 {
		if d := mustAllow(t, l, "d"); d.Allowed != (i < 3) {
			t.Fatalf("after recovery, call %d: %+v", i, d)
		}
	}
	if n := stored("d"); n != 3 {
		t.Fatalf("after recovery: Redis holds %d calls, want 3", n)
	}
	if warns := logs.FilterLevelExact(zapcore.WarnLevel).Len(); warns != 1 {
		t.Fatalf("%d warnings, want 1", warns)
	}
	if infos := logs.FilterLevelExact(zapcore.InfoLevel).FilterMessageSnippet("available again").Len(); infos != 1 {
		t.Fatalf("%d recovery messages, want 1: %v", infos, logs.All())
	}
}

// stubLimiter answers with a fixed decision or error and counts its calls.
type stubLimiter struct {
	calls atomic.Int64
	err   atomic.Pointer[error]
	block chan struct{} // if non-nil, Allow waits on it
}

func (s *stubLimiter) Allow(ctx context.Context, key string) (Decision, error) {
	s.calls.Add(1)
	if s.block != nil {
		<-s.block
	}
	if e := s.err.Load(); e != nil {
		return Decision{}, *e
	}
	return Decision{Allowed: true, Limit: 7, Remaining: 6}, nil
}

func (s *stubLimiter) fail(err error) { s.err.Store(&err) }
func (s *stubLimiter) heal()          { s.err.Store(nil) }

func TestFallbackProbesSparingly(t *testing.T) {
	primary := &stubLimiter{}
	clk := newFakeClock()
	mem := newMemory(1000, time.Minute, clk.Now, 0)
	core, logs := observer.New(zapcore.InfoLevel)
	l := NewFallback(primary, mem, zap.New(core)).(*fallbackLimiter)
	l.now = clk.Now

	if d := mustAllow(t, l, "k"); d.Limit != 7 {
		t.Fatalf("primary not used: %+v", d)
	}
	primary.fail(errors.New("connection refused"))
	for range 100 {
		if d := mustAllow(t, l, "k"); d.Limit != 1000 {
			t.Fatalf("fallback not used: %+v", d)
		}
	}
	if n := primary.calls.Load(); n != 2 {
		t.Fatalf("primary called %d times, want 2 (no probe before probeEvery)", n)
	}
	clk.Advance(time.Second)
	for range 100 {
		mustAllow(t, l, "k")
	}
	if n := primary.calls.Load(); n != 3 {
		t.Fatalf("primary called %d times, want 3 (one probe per second)", n)
	}
	if warns := logs.FilterLevelExact(zapcore.WarnLevel).Len(); warns != 1 {
		t.Fatalf("%d warnings, want 1", warns)
	}
	primary.heal()
	clk.Advance(time.Second)
	if d := mustAllow(t, l, "k"); d.Limit != 7 {
		t.Fatalf("probe after healing did not use primary: %+v", d)
	}
	if d := mustAllow(t, l, "k"); d.Limit != 7 {
		t.Fatalf("primary not used after recovery: %+v", d)
	}
	if logs.FilterLevelExact(zapcore.InfoLevel).Len() != 1 {
		t.Fatalf("want one recovery message: %v", logs.All())
	}
}

// TestFallbackOneProbeAtATime runs in a synctest bubble, which tells when the probe is stuck.
func TestFallbackOneProbeAtATime(t *testing.T) {
	synctest.Test(t, testFallbackOneProbeAtATime)
}

func testFallbackOneProbeAtATime(t *testing.T) {
	primary := &stubLimiter{}
	primary.fail(errors.New("timeout"))
	mem := newMemory(1000, time.Minute, time.Now, 0)
	l := NewFallback(primary, mem, nil).(*fallbackLimiter)
	l.probeEvery = 0
	mustAllow(t, l, "k") // marks the primary down

	primary.block = make(chan struct{})
	done := make(chan struct{})
	go func() { mustAllow(t, l, "k"); close(done) }() // the probe, stuck
	synctest.Wait()
	if n := primary.calls.Load(); n != 2 {
		t.Fatalf("primary called %d times, want 2 (the probe, blocked)", n)
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if d := mustAllow(t, l, "k"); d.Limit != 1000 {
				t.Errorf("want a fallback decision while probing: %+v", d)
			}
		})
	}
	wg.Wait()
	if n := primary.calls.Load(); n != 2 {
		t.Fatalf("primary called %d times while a probe was in flight, want 2", n)
	}
	close(primary.block)
	<-done
}

func TestFallbackCallerCancelIsNotAnOutage(t *testing.T) {
	primary := &stubLimiter{}
	core, logs := observer.New(zapcore.InfoLevel)
	l := NewFallback(primary, newMemory(1000, time.Minute, time.Now, 0), zap.New(core))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	primary.fail(context.Canceled)
	d, err := l.Allow(ctx, "k")
	if err != nil || d.Limit != 1000 {
		t.Fatalf("%+v %v", d, err)
	}
	primary.heal()
	if d := mustAllow(t, l, "k"); d.Limit != 7 {
		t.Fatalf("primary skipped after a caller cancel: %+v", d)
	}
	if logs.Len() != 0 {
		t.Fatalf("logged %v", logs.All())
	}
}

func TestFallbackBothFail(t *testing.T) {
	p, f := &stubLimiter{}, &stubLimiter{}
	p.fail(errors.New("p"))
	f.fail(errors.New("f"))
	if _, err := NewFallback(p, f, nil).Allow(context.Background(), "k"); err == nil {
		t.Fatal("want an error when both fail")
	}
}
