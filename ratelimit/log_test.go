package ratelimit

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// window is the clocked tests' window, in microseconds (their keys' TTL is the window too).
const window = int64(60_000_000)

// clockedLog is SlidingLogLua deciding at a time the test gives (ARGV[4] seconds, ARGV[5]
// microseconds) instead of Redis TIME, so that every path of the log can be driven exactly.
type clockedLog struct {
	script *redis.Script
	c      redis.UniversalClient
}

// clockedScript returns SlidingLogLua on a test clock, run on c.
func clockedScript(t testing.TB, c redis.UniversalClient) clockedLog {
	t.Helper()
	const time = "redis.call('TIME')"
	if strings.Count(SlidingLogLua, time) != 1 {
		t.Fatalf("SlidingLogLua should call TIME once")
	}
	lua := strings.Replace(SlidingLogLua, time, "{ARGV[4], ARGV[5]}", 1)
	return clockedLog{redis.NewScript(lua + `return sliding_log(KEYS[1], ARGV[1], ARGV[2], ARGV[3])`), c}
}

// decide is one call for key at now (µs) under limit and window: its reply {allowed, count,
// retry_after_us, reset_us}.
func (l clockedLog) decide(t testing.TB, key string, limit int, now int64) [4]int64 {
	t.Helper()
	r, err := l.script.Run(context.Background(), l.c, []string{key}, limit, window, window/1000,
		now/1_000_000, now%1_000_000).Int64Slice()
	if err != nil {
		t.Fatalf("%s at %d µs, limit %d: %v", key, now, limit, err)
	}
	return [4]int64(r)
}

// slidingLog is the reference: every accepted time of one key, in microseconds.
type slidingLog struct{ times []int64 }

// allow decides like sliding_log: its reply {allowed, count, retry_after_us, reset_us}.
func (l *slidingLog) allow(now int64, limit int, window int64) [4]int64 {
	var live []int64
	for _, t := range l.times {
		if now-t < window {
			live = append(live, t)
		}
	}
	l.times = live
	if len(live) >= limit {
		return [4]int64{0, int64(len(live)), live[len(live)-limit] + window - now, live[0] + window - now}
	}
	l.times = append(l.times, now)
	return [4]int64{1, int64(len(l.times)), 0, l.times[0] + window - now}
}

// TestLogMatchesSlidingLog drives the log and the reference through the same random calls
// (bursts, gaps shorter and longer than the window, the limit raised and lowered) on a clock
// the test controls, and compares every decision: the log is read whole and by its tail, grows
// by appends, is rewritten with its live entries when it passes 2 × limit + 16, and is read
// whole again when more than the limit are inside the window after the limit was lowered.
func TestLogMatchesSlidingLog(t *testing.T) {
	ctx := context.Background()
	c := testenv.RedisClient(t, testenv.Redis(t))
	prefix := uniquePrefix(t, c)
	log := clockedScript(t, c)
	rng := rand.New(rand.NewPCG(21, 1))
	limits := []int{1, 2, 5, 17, 100, 250}
	for k := range 6 {
		key := prefix + "k" + strconv.Itoa(k) + LogSuffix
		var ref slidingLog
		now := int64(1_760_000_000_000_000) + rng.Int64N(1_000_000)
		limit := limits[k]
		accepted, rewrites, stored := 0, 0, 0
		for i := range 4000 {
			switch r := rng.IntN(1000); {
			case r < 5: // the limit changes
				limit = limits[rng.IntN(len(limits))]
			case r < 15: // a pause: part of the window, or all of it
				now += rng.Int64N(2 * window)
			}
			// Bursts of calls a few µs apart, or calls spread over the window.
			if rng.IntN(4) == 0 {
				now += rng.Int64N(window / int64(limit+1))
			} else {
				now += 1 + rng.Int64N(20)
			}
			if now-ref.newest() >= window {
				// The log would have expired by its TTL (the window): do what Redis does.
				c.Del(ctx, key)
				stored = 0
			}
			want := ref.allow(now, limit, window)
			reply := log.decide(t, key, limit, now)
			if reply != want {
				t.Fatalf("key %d call %d (limit %d, %d stored): log %v, sliding log %v", k, i, limit, len(ref.times), reply, want)
			}
			if want[0] == 1 {
				accepted++
			}
			n := logEntries(t, c, key)
			switch {
			case n < len(ref.times):
				t.Fatalf("key %d call %d: log of %d entries for %d live ones", k, i, n, len(ref.times))
			case want[0] == 1 && n > 2*limit+16:
				t.Fatalf("key %d call %d: log of %d entries after an accepted call, limit %d", k, i, n, limit)
			case want[0] == 1 && stored > 0 && n != stored+1:
				// rewritten: with the live entries only
				rewrites++
				if n != len(ref.times) {
					t.Fatalf("key %d call %d: log rewritten with %d entries for %d live ones", k, i, n, len(ref.times))
				}
			}
			stored = n
		}
		t.Logf("key %d: %d of 4000 accepted, %d rewrites", k, accepted, rewrites)
	}
}

// TestLogClockStepsBack: when Redis TIME goes back (a clock step, a failover to a server whose
// clock is behind), a new entry takes the newest entry's time, so the log stays in order and the
// limit holds; a log whose newest entry is more than a window ahead of TIME counts as empty, so
// that it cannot hold the limit shut until the clock catches up.
func TestLogClockStepsBack(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	key := uniquePrefix(t, c) + "k" + LogSuffix
	log := clockedScript(t, c)
	base := int64(1_760_000_000)
	for i, step := range []struct {
		sec  int64
		want [4]int64
	}{
		{base + 100, [4]int64{1, 1, 0, window}},
		{base + 90, [4]int64{1, 2, 0, window + 10_000_000}}, // 10 s back: stamped base+100
		{base + 95, [4]int64{1, 3, 0, window + 5_000_000}},
		{base + 96, [4]int64{0, 3, window + 4_000_000, window + 4_000_000}},
		{base + 165, [4]int64{1, 1, 0, window}}, // all three (base+100) left the window
		{base + 80, [4]int64{1, 1, 0, window}},  // 85 s back, more than a window: counts as empty
	} {
		if got := log.decide(t, key, 3, step.sec*1_000_000); got != step.want {
			t.Fatalf("step %d (t=%d): %v, want %v", i, step.sec-base, got, step.want)
		}
		logEntries(t, c, key) // in order
	}
	if n := logEntries(t, c, key); n != 1 {
		t.Fatalf("the log holds %d entries after counting as empty, want 1", n)
	}
}

// TestLogWholeReadAligned: a string longer than the tail read whose tail is more than the limit
// of entries inside the window is read whole, and its entries are taken from its end, as the
// tail's were, even when its length is not whole entries (not a log this script wrote): the
// refusal counts them exactly, no error.
func TestLogWholeReadAligned(t *testing.T) {
	ctx := context.Background()
	c := testenv.RedisClient(t, testenv.Redis(t))
	key := uniquePrefix(t, c) + "k" + LogSuffix
	at := int64(1_760_000_000) * 1_000_000
	entry := binary.BigEndian.AppendUint64(nil, uint64(at))
	if err := c.Set(ctx, key, "x"+strings.Repeat(string(entry), 5), 0).Err(); err != nil {
		t.Fatal(err)
	}
	got := clockedScript(t, c).decide(t, key, 3, at+1_000_000)
	if want := [4]int64{0, 5, window - 1_000_000, window - 1_000_000}; got != want {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// newest is the latest accepted time (0 if none).
func (l *slidingLog) newest() int64 {
	if len(l.times) == 0 {
		return 0
	}
	return l.times[len(l.times)-1]
}

// TestLogReplacesForeignKeys: a key of another type (a sorted set of an older release, say) or
// a string that is not a log counts as empty; no error reaches the caller, and the first
// accepted call replaces it with a log.
func TestLogReplacesForeignKeys(t *testing.T) {
	ctx := context.Background()
	c := testenv.RedisClient(t, testenv.Redis(t))
	prefix := uniquePrefix(t, c)
	l := NewRedis(c, 3, time.Minute, prefix)
	for name, put := range map[string]func(key string) error{
		"zset":  func(key string) error { return c.ZAdd(ctx, key, redis.Z{Score: 1, Member: "m"}).Err() },
		"list":  func(key string) error { return c.RPush(ctx, key, "x").Err() },
		"short": func(key string) error { return c.Set(ctx, key, "abc", 0).Err() },
		// whole entries, read by their tail, the newest far ahead of TIME
		"far-ahead": func(key string) error { return c.Set(ctx, key, strings.Repeat("\xff", 40), 0).Err() },
		// whole entries, read whole, without the mark
		"unmarked": func(key string) error { return c.Set(ctx, key, strings.Repeat("\x00", 24), 0).Err() },
	} {
		call, _ := l.Prepare(name)
		if err := put(call.Key); err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			d, err := l.Allow(ctx, name)
			if err != nil {
				t.Fatalf("%s, call %d: %v", name, i, err)
			}
			if d.Allowed != (i < 3) || (d.Allowed && d.Remaining != 2-i) {
				t.Fatalf("%s, call %d: %+v", name, i, d)
			}
		}
		if n := logEntries(t, c, call.Key); n != 3 {
			t.Fatalf("%s: the log holds %d entries, want 3", name, n)
		}
	}
}
