package ratelimit

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wabarelay/wabarelay/internal/autopipe"
)

// SlidingLogLua defines the whole decision as a Lua function, run atomically inside Redis:
//
//	sliding_log(key, limit, window_us, ttl_ms) -> {allowed (0/1), count after this call, retry_after_us, reset_us}
//
// A script that embeds it decides for a [Call] c with sliding_log(KEYS[1], ARGV[1], ARGV[2],
// ARGV[3]), KEYS[1] being c.Key and ARGV[1..3] c.Args; its own keys and arguments follow. (The
// arguments may be strings, as ARGV are.)
//
// key is a log of the accepted requests in one Redis string (see the layout below): their Redis
// TIME in microseconds, in ascending order. An entry t is inside the window at time now iff
// now - t < window. The request is accepted iff fewer than limit (>= 1) entries are inside; it is
// then appended, and the key's TTL becomes ttl_ms (>= window), so a key idle for a window is
// gone. A rejected request writes nothing.
//
// Layout: an 8-byte mark (logMark, which read as an entry is a time long past), then 8 bytes
// per entry (uint64 microseconds), all big-endian. A call reads the last limit + 1 entries in one
// GETRANGE with a negative start (the whole string when it is shorter, mark included), so it
// needs no header: the limit-th newest entry decides, and the newest gives the order. It writes
// with one APPEND and a PEXPIRE. Entries that left the window are not cleared on each call; when
// the log holds more than 2 × limit + 16 entries, the accepting call rewrites it with the live
// entries only (one SET), so the string stays small and a call's cost does not grow with the
// limit. Only after the limit was lowered can more than limit + 1 entries be inside the window;
// a rejected call then reads the whole log once more (its entries counted from its end, as the
// tail's were), so that its count and reset are exact.
//
// On reject, the slot frees when the entry at index count-limit of the live ones (oldest first)
// leaves the window; normally count == limit and that is the oldest entry, but after the limit
// was lowered more entries may be inside.
//
// A new entry is stamped with Redis TIME, or with the newest entry if TIME went back (a clock step,
// a failover), so the log stays in order. A key that is not a string (a type error), a string
// that is not whole entries, one read whole that does not start with the mark, or one whose newest
// entry is more than a window ahead of TIME (not a log, or a clock stepped back that far: its
// entries would hold the limit shut until TIME caught up) counts as empty and is replaced by the
// next accepted request; no error reaches the caller.
//
// TIME is called before any write; on Redis < 5 this needs script effects replication, which
// SlidingLogLua enables first (redis.replicate_commands; a no-op on Redis >= 7).
const SlidingLogLua = `
if redis.replicate_commands ~= nil then pcall(redis.replicate_commands) end
local LOG_MARK = '\0\0\0\0wlog'
local function sliding_log(key, limit, window, ttl)
  limit, window = tonumber(limit), tonumber(window)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local cut = now - window
  local want = 8 * (limit + 1)
  local s = redis.pcall('GETRANGE', key, -want, -1)
  local fresh = type(s) ~= 'string' or #s == 0 or #s % 8 ~= 0 or (#s < want and string.sub(s, 1, 8) ~= LOG_MARK)
  if fresh then s = '' end
  local function at(i) return (struct.unpack('>I8', s, 8 * i - 7)) end
  local m = #s / 8
  if m > 0 and at(m) > now + window then fresh, s, m = true, '', 0 end
  -- f: the first entry inside the window (m + 1 if none); entries ascend
  local function first()
    local lo, hi = 1, m + 1
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if at(mid) <= cut then lo = mid + 1 else hi = mid end
    end
    return lo
  end
  local f = 1
  if m > 0 then f = first() end
  if m == limit + 1 and f == 1 then
    -- more than the limit inside (it was lowered): the whole log, for the exact count and reset
    s = redis.call('GET', key)
    s = string.sub(s, #s % 8 + 1) -- (whole entries, aligned from the end as the tail read was)
    m = #s / 8
    f = first()
  end
  local count = m - f + 1
  if count >= limit then
    return {0, count, at(m - limit + 1) + window - now, at(f) + window - now}
  end
  local stamp = now
  if m > 0 then stamp = math.max(now, at(m)) end
  local e = struct.pack('>I8', stamp)
  local n = 0
  if not fresh then n = redis.pcall('APPEND', key, e) end
  if type(n) ~= 'number' or n == 0 or n > 8 * (2 * limit + 17) then
    redis.call('SET', key, LOG_MARK .. string.sub(s, 8 * f - 7) .. e, 'PX', ttl)
  else
    redis.call('PEXPIRE', key, ttl)
  end
  local oldest = stamp
  if count > 0 then oldest = at(f) end
  return {1, count + 1, 0, oldest + window - now}
end
`

// logMark starts every log (LOG_MARK in SlidingLogLua): 8 bytes that, read as an entry, are a
// time of 1970 (0x776C6F67 µs), so that reading it with the entries changes no decision.
const logMark = "\x00\x00\x00\x00wlog"

// script is one decision, for a Call: KEYS[1] = Call.Key, ARGV = Call.Args.
var script = redis.NewScript(SlidingLogLua + `return sliding_log(KEYS[1], ARGV[1], ARGV[2], ARGV[3])`)

// RedisLimiter is an exact sliding-window limiter whose state lives in Redis,
// shared by every process that uses the same Redis and prefix.
//
// Each Allow is one atomic script call (EVALSHA of a Lua script over a log of the
// latest accepted times, [SlidingLogLua]; EVAL once after a SCRIPT FLUSH or
// failover). Calls of concurrent Allows are sent to Redis together, one pipeline
// per round trip (package internal/autopipe): a lone call goes at once. The script uses the Redis server clock (TIME), never the caller's,
// so instances with skewed clocks still agree. Each key is one Redis key,
// prefix + key + [LogSuffix], so Redis Cluster works too (a hash tag in key
// stays the key's).
type RedisLimiter struct {
	calls  *autopipe.Pipeliner
	prefix string
	cfg    atomic.Pointer[config]
}

// LogSuffix ends the Redis key of every log (prefix + key + LogSuffix). Each change of the
// stored form came with a new name — a sorted set under prefix + key, then a ring with a header
// under prefix + key + ":ring", now the log — so that during a rolling upgrade old and new
// instances never read each other's keys in the wrong form (each version then counts on its own
// for at most a window, and the old keys expire within a window).
const LogSuffix = ":log"

var _ Limiter = (*RedisLimiter)(nil)

// NewRedis returns a limiter allowing at most limit requests per key in any
// rolling window of length window, with state stored in client under the Redis
// key prefix+key. A limit of 0 (or less) rejects every request; window must be
// positive (NewRedis panics otherwise). Windows are counted in microseconds
// (rounded up), TTLs in milliseconds.
func NewRedis(client redis.UniversalClient, limit int, window time.Duration, prefix string) *RedisLimiter {
	l := &RedisLimiter{calls: autopipe.New(client), prefix: prefix}
	l.cfg.Store(newConfig(limit, window))
	return l
}

// SetLimit changes the limit and window for subsequent calls (for example on a
// configuration reload). The log already stored stays valid: lowering the
// limit rejects until enough entries have left the window, raising it frees
// slots at once. It panics if window is not positive.
func (l *RedisLimiter) SetLimit(limit int, window time.Duration) {
	l.cfg.Store(newConfig(limit, window))
}

// Allow records and accepts one request for key if fewer than limit requests
// were accepted for it in the last window, and reports the decision. The error
// is non-nil only when Redis could not be asked (the decision is then zero).
func (l *RedisLimiter) Allow(ctx context.Context, key string) (Decision, error) {
	c, ok := l.Prepare(key)
	if !ok {
		return c.Deny(), nil
	}
	reply, err := l.calls.Run(ctx, script, []string{c.Key}, c.Args...).Result()
	if err != nil {
		return Decision{}, fmt.Errorf("ratelimit: redis: %w", err)
	}
	return c.Decision(reply)
}

// Call is one decision of a [RedisLimiter], prepared by [RedisLimiter.Prepare] for a script
// that embeds [SlidingLogLua] (so that a caller can decide more in the same round trip): the
// script calls sliding_log(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) with Key as KEYS[1] and Args as
// ARGV[1..3], and [Call.Decision] turns that call's reply into a Decision.
type Call struct {
	// Key is the Redis key of the log (the limiter's prefix + the caller's key + LogSuffix).
	Key string
	// Args are the limit, the window in microseconds and the log's TTL in milliseconds. The
	// slice has no spare capacity: appending to it copies it.
	Args []any

	cfg *config
}

// Prepare returns the call that decides for key (as passed to Allow) under the current limit
// and window, counting as one call of Allow. ok is false when the limit is 0: nothing is asked
// of Redis then, and [Call.Deny] is the decision.
func (l *RedisLimiter) Prepare(key string) (c Call, ok bool) {
	cfg := l.cfg.Load()
	c = Call{Key: l.prefix + key + LogSuffix, cfg: cfg}
	if cfg.limit <= 0 {
		return c, false
	}
	windowUS := int64((cfg.window + time.Microsecond - 1) / time.Microsecond)
	ttlMS := int64((cfg.window + time.Millisecond - 1) / time.Millisecond)
	c.Args = []any{cfg.limit, windowUS, ttlMS}
	return c, true
}

// Deny is the decision under a limit of 0: refused, with the window as Retry-After.
func (c Call) Deny() Decision { return c.cfg.denyAll() }

// Decision turns the reply of sliding_log, as go-redis returns it (a slice of four integers),
// into the Decision, exactly as Allow reports it. Any other reply is an error.
func (c Call) Decision(reply any) (Decision, error) {
	vals, _ := reply.([]any)
	var res [4]int64
	ok := len(vals) == len(res)
	for i := 0; ok && i < len(res); i++ {
		res[i], ok = vals[i].(int64)
	}
	if !ok {
		return Decision{}, fmt.Errorf("ratelimit: redis: unexpected script reply %v", reply)
	}
	allowed, count := res[0] == 1, int(res[1])
	d := Decision{
		Allowed:   allowed,
		Limit:     c.cfg.limit,
		Remaining: max(c.cfg.limit-count, 0),
		Reset:     time.Duration(res[3]) * time.Microsecond,
	}
	if !allowed {
		d.RetryAfter = max(time.Duration(res[2])*time.Microsecond, time.Microsecond)
	}
	return d, nil
}
