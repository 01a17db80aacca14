package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

func TestRedis100PerMinute(t *testing.T) {
	ctx := context.Background()
	c := testenv.RedisClient(t, testenv.Redis(t))
	prefix := uniquePrefix(t, c)
	l := NewRedis(c, 100, time.Minute, prefix)

	start := time.Now()
	for i := range 100 {
		d, err := l.Allow(ctx, "chan-1")
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Limit != 100 || d.Remaining != 99-i || d.RetryAfter != 0 {
			t.Fatalf("call %d: got %+v, want allowed with remaining %d", i+1, d, 99-i)
		}
		// Reset = oldest + window - now: the oldest was accepted a moment ago.
		if d.Reset <= time.Minute-time.Since(start)-time.Second || d.Reset > time.Minute {
			t.Fatalf("call %d: Reset %v, want just under 60s", i+1, d.Reset)
		}
	}
	d, err := l.Allow(ctx, "chan-1")
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Remaining != 0 || d.Limit != 100 {
		t.Fatalf("101st call: got %+v, want rejected", d)
	}
	if d.RetryAfter <= 0 || d.RetryAfter > time.Minute || d.RetryAfter < time.Minute-time.Since(start)-time.Second {
		t.Fatalf("101st call: RetryAfter %v, want in (0,60s] and just under 60s", d.RetryAfter)
	}
	if d.Reset != d.RetryAfter {
		t.Fatalf("Reset %v != RetryAfter %v (both are oldest+window-now)", d.Reset, d.RetryAfter)
	}
	h := http.Header{}
	d.SetHeaders(h)
	checkHeaders(t, h, map[string]string{"RateLimit-Limit": "100", "RateLimit-Remaining": "0", "RateLimit-Reset": "60", "Retry-After": "60"})

	// Another key is independent.
	if d, _ := l.Allow(ctx, "chan-2"); !d.Allowed || d.Remaining != 99 {
		t.Fatalf("other key: %+v", d)
	}
	// The log holds exactly the accepted calls and expires with the window.
	if n := logEntries(t, c, prefix+"chan-1"+LogSuffix); n != 100 {
		t.Fatalf("log holds %d entries, want 100 (rejected calls must not be stored)", n)
	}
	if ttl := c.PTTL(ctx, prefix+"chan-1"+LogSuffix).Val(); ttl <= 50*time.Second || ttl > time.Minute {
		t.Fatalf("PTTL = %v, want about the window", ttl)
	}
}

// TestRedisExactAcrossInstances stands in for three relay instances (three
// independent clients and limiters) hammering one key concurrently.
func TestRedisExactAcrossInstances(t *testing.T) {
	ctx := context.Background()
	url := testenv.Redis(t)
	var limiters []*RedisLimiter
	var prefix string
	for i := range 3 {
		c := testenv.RedisClient(t, url)
		if i == 0 {
			prefix = uniquePrefix(t, c)
		}
		limiters = append(limiters, NewRedis(c, 100, time.Minute, prefix))
	}
	check := testenv.RedisClient(t, url)

	for round := range 3 {
		key := "hot-" + string(rune('a'+round))
		var (
			wg        sync.WaitGroup
			start     = make(chan struct{})
			mu        sync.Mutex
			remaining []int
			denied    atomic.Int64
		)
		for i := range 300 {
			wg.Go(func() {
				<-start
				d, err := limiters[i%3].Allow(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					remaining = append(remaining, d.Remaining)
					mu.Unlock()
				} else {
					if d.RetryAfter <= 0 || d.RetryAfter > time.Minute {
						t.Errorf("RetryAfter %v out of (0,60s]", d.RetryAfter)
					}
					denied.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(remaining) != 100 || denied.Load() != 200 {
			t.Fatalf("round %d: %d allowed, %d denied; want exactly 100/200", round, len(remaining), denied.Load())
		}
		// Every accepted call saw a distinct count: Remaining is 0..99 once each.
		sort.Ints(remaining)
		for i, r := range remaining {
			if r != i {
				t.Fatalf("round %d: Remaining values %v are not 0..99", round, remaining)
			}
		}
		if n := logEntries(t, check, prefix+key+LogSuffix); n != 100 {
			t.Fatalf("round %d: log holds %d entries, want 100", round, n)
		}
	}
}

// TestRedisRollingWindow checks, in real time against a real Redis, that a
// slot frees exactly when the oldest accepted request leaves the window and
// that rejected requests do not count.
//
// Redis decides by its own clock (TIME), read at some moment during each call.
// The test brackets every call with the local clock and checks each answer
// against those brackets: no assertion depends on how long a call or a sleep
// takes, and no offset between the two clocks is assumed (only differences of
// Redis times are compared with differences of local times). The window and
// the gap are long enough for a loaded machine to do a few calls within them.
func TestRedisRollingWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time test")
	}
	ctx := context.Background()
	c := testenv.RedisClient(t, testenv.Redis(t))
	// Margins of a second or more between the steps: the calls run on a loaded machine.
	const window, gap = 4 * time.Second, 2 * time.Second
	l := NewRedis(c, 5, window, uniquePrefix(t, c))
	const key = "k"
	// call is one decision and the local times around it.
	type call struct {
		Decision
		from, to time.Time
	}
	allow := func() call {
		t.Helper()
		from := time.Now()
		d, err := l.Allow(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return call{d, from, time.Now()}
	}
	// leaves is when the request accepted in e leaves the window: between
	// e.from+window and e.to+window.
	type span struct{ earliest, latest time.Time }
	leaves := func(e call) span { return span{e.from.Add(window), e.to.Add(window)} }
	// pointsAt checks that the rejected answer r points at a moment in s: the
	// moment is r's Redis time plus RetryAfter, so between r.from+RetryAfter
	// and r.to+RetryAfter (a millisecond more for rounding).
	pointsAt := func(what string, r call, s span) {
		t.Helper()
		if r.Allowed {
			t.Fatalf("%s: allowed (%+v), want rejected", what, r.Decision)
		}
		lo, hi := r.from.Add(r.RetryAfter-time.Millisecond), r.to.Add(r.RetryAfter+time.Millisecond)
		if hi.Before(s.earliest) || lo.After(s.latest) {
			t.Fatalf("%s: RetryAfter %v points at %v..%v, want within %v..%v", what, r.RetryAfter,
				lo.Format(time.StampMicro), hi.Format(time.StampMicro), s.earliest.Format(time.StampMicro), s.latest.Format(time.StampMicro))
		}
	}

	a := allow() // A
	if !a.Allowed || a.Remaining != 4 {
		t.Fatalf("A: %+v", a.Decision)
	}
	time.Sleep(time.Until(a.to.Add(gap)))
	var be []call
	for i := range 4 { // B..E, a gap after A
		c := allow()
		if !c.Allowed || c.Remaining != 3-i {
			t.Fatalf("B..E #%d: %+v", i, c.Decision)
		}
		be = append(be, c)
	}
	pointsAt("6th", allow(), leaves(a))

	// Call until allowed: every rejected answer points at the moment A leaves,
	// and the first one allowed (F) comes when A has left.
	aLeaves := leaves(a)
	rejected := 1
	var f call
	testenv.Eventually(t, testenv.Patience, func() bool {
		c := allow()
		if c.Allowed {
			f = c
			return true
		}
		pointsAt(fmt.Sprintf("rejected call %d", rejected), c, aLeaves)
		if !c.from.Before(aLeaves.latest) {
			t.Fatalf("rejected after A left the window: %+v", c.Decision)
		}
		rejected++
		return false
	}, "a call allowed once A left the window")
	if f.to.Before(aLeaves.earliest) {
		t.Fatalf("allowed before A left the window")
	}
	// Exactly one slot freed (A's), despite all the rejected calls.
	if f.Remaining != 0 {
		t.Fatalf("after A left: %+v, want allowed with 0 remaining", f.Decision)
	}
	t.Logf("%d rejected calls before A left", rejected)
	// The next slot frees when B leaves.
	pointsAt("second call after A left", allow(), leaves(be[0]))

	// Once E has left (by the clock), only F is in the window: 4 more are
	// allowed, then the next waits for F.
	time.Sleep(time.Until(leaves(be[3]).latest))
	for i := range 4 {
		if c := allow(); !c.Allowed || c.Remaining != 3-i {
			t.Fatalf("after B..E left, call %d: %+v", i, c.Decision)
		}
	}
	pointsAt("after refilling", allow(), leaves(f))
}

func TestRedisSetLimit(t *testing.T) {
	ctx := context.Background()
	c := testenv.RedisClient(t, testenv.Redis(t))
	l := NewRedis(c, 10, time.Minute, uniquePrefix(t, c))
	for range 10 {
		if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
	}
	l.SetLimit(5, time.Minute)
	d, err := l.Allow(ctx, "k")
	if err != nil || d.Allowed || d.Limit != 5 || d.Remaining != 0 || d.RetryAfter <= 0 {
		t.Fatalf("after lowering: %+v %v", d, err)
	}
	l.SetLimit(12, time.Minute)
	for i := range 2 {
		if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed || d.Remaining != 1-i {
			t.Fatalf("after raising, call %d: %+v %v", i, d, err)
		}
	}
	if d, _ := l.Allow(ctx, "k"); d.Allowed {
		t.Fatalf("13th call allowed with limit 12")
	}
	l.SetLimit(0, time.Minute)
	if d, err := l.Allow(ctx, "other"); err != nil || d.Allowed || d.RetryAfter != time.Minute {
		t.Fatalf("limit 0: %+v %v", d, err)
	}
}

// countHook counts the commands a client sends.
type countHook struct{ names []string }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.names = append(h.names, cmd.Name())
		return next(ctx, cmd)
	}
}

func TestRedisOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	c := testenv.RedisClient(t, testenv.Redis(t))
	l := NewRedis(c, 1000, time.Minute, uniquePrefix(t, c))
	if _, err := l.Allow(ctx, "warm"); err != nil { // loads the script if needed
		t.Fatal(err)
	}
	h := &countHook{}
	c.AddHook(h)
	for range 50 {
		if _, err := l.Allow(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	if len(h.names) != 50 || strings.Join(h.names, ",") != strings.TrimSuffix(strings.Repeat("evalsha,", 50), ",") {
		t.Fatalf("50 calls sent %d commands %v, want 50 EVALSHA", len(h.names), h.names)
	}
}

func TestRedisUnavailable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	defer func() { _ = c.Close() }()
	if _, err := NewRedis(c, 5, time.Minute, "x:").Allow(context.Background(), "k"); err == nil {
		t.Fatal("want an error when Redis is unreachable")
	}
}
