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
// key is a ring of the latest accepted requests in one Redis string (see the ring layout below):
// their Redis TIME in microseconds, oldest first from the head slot. An entry t is inside the
// window at time now iff now - t < window. The request is accepted iff fewer than limit (>= 1)
// entries are inside; it then takes the slot of the oldest entry if that one has left the window,
// or a new slot, and the key's TTL becomes ttl_ms (>= window), so a key idle for a window is gone.
// A rejected request writes nothing.
//
// Ring layout: a 16-byte header — head slot (uint32), slot count (uint32), newest entry (uint64) —
// then the slots, 8 bytes each (uint64 microseconds), all big-endian. Starting at the head slot
// and wrapping, the entries ascend: the leading ones may have left the window, the rest are inside.
// A call reads the header and the first slots in one GETRANGE (a second GETRANGE when the head
// lies further on, more only when many entries left the window at once) and writes only what
// changes (SETRANGE of a slot and of the header, PEXPIRE): its cost does not grow with the limit.
// Entries that left the window are not cleared; when at least half of a ring larger than the
// first read has left it, the ring is rewritten with the live entries only, so a channel that
// slowed down does not keep a large ring. The ring grows by one slot when every entry is inside
// the window and the limit allows more (after a restart of the head, by rewriting it).
//
// On reject, the slot frees when the entry at index count-limit of the live ones (oldest first)
// leaves the window; normally count == limit and that is the oldest entry, but after the limit
// was lowered more entries may be inside.
//
// A new entry is stamped with Redis TIME, or with the newest entry if TIME went back (a clock step,
// a failover), so the ring stays in order. A key that is not a string (a type error) or not a
// ring counts as empty and is replaced by the next accepted request; no error reaches the caller.
//
// TIME is called before any write; on Redis < 5 this needs script effects replication, which
// SlidingLogLua enables first (redis.replicate_commands; a no-op on Redis >= 7).
const SlidingLogLua = `
if redis.replicate_commands ~= nil then pcall(redis.replicate_commands) end
local function sliding_log(key, limit, window, ttl)
  limit, window = tonumber(limit), tonumber(window)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local cut = now - window
  local head = redis.pcall('GETRANGE', key, 0, 143)
  local h, cap, newest = 0, 0, 0
  if type(head) == 'string' and #head >= 24 then
    h, cap, newest = struct.unpack('>I4I4I8', head)
    if cap < 1 or h >= cap or cap > 67108864 or #head < math.min(16 + 8 * cap, 144) then cap = 0 end
  end
  if cap == 0 then
    redis.call('SET', key, struct.pack('>I4I4I8I8', 0, 1, now, now), 'PX', ttl)
    return {1, 1, 0, window}
  end
  local extra, from = '', 0
  local function slot(s)
    local off = 16 + 8 * s
    if off + 8 <= #head then return (struct.unpack('>I8', head, off + 1)) end
    if off >= from and off + 8 <= from + #extra then return (struct.unpack('>I8', extra, off - from + 1)) end
    local b = redis.call('GETRANGE', key, off, off + 7)
    if #b < 8 then return 0 end
    return (struct.unpack('>I8', b))
  end
  local function cached(i)
    local off = 16 + 8 * ((h + i) % cap)
    return off + 8 <= #head or (off >= from and off + 8 <= from + #extra)
  end
  local function at(i) return slot((h + i) % cap) end
  if 16 + 8 * (h + math.min(8, cap - h)) > #head then
    from = 16 + 8 * h
    extra = redis.call('GETRANGE', key, from, from + 8 * math.min(16, cap - h) - 1)
  end
  local f = 0
  if newest <= cut then
    f = cap
  elseif at(0) <= cut then
    f = 1
    while f < cap - 1 and cached(f) and at(f) <= cut do f = f + 1 end
    if f < cap - 1 and not cached(f) then
      local hi = cap - 1
      while f < hi do
        local mid = math.floor((f + hi) / 2)
        if at(mid) <= cut then f = mid + 1 else hi = mid end
      end
    end
  end
  local count = cap - f
  if count >= limit then
    return {0, count, at(cap - limit) + window - now, at(f) + window - now}
  end
  local stamp = math.max(now, newest)
  local oldest = stamp
  if count > 0 then oldest = at(f) end
  local whole = 16 + 8 * cap <= #head
  if not whole and f > 0 and 2 * f < cap then
    redis.call('SETRANGE', key, 16 + 8 * h, struct.pack('>I8', stamp))
    redis.call('SETRANGE', key, 0, struct.pack('>I4I4I8', (h + 1) % cap, cap, stamp))
    redis.call('PEXPIRE', key, ttl)
  elseif not whole and f == 0 and h == 0 then
    redis.call('SETRANGE', key, 16 + 8 * cap, struct.pack('>I8', stamp))
    redis.call('SETRANGE', key, 0, struct.pack('>I4I4I8', 0, cap + 1, stamp))
    redis.call('PEXPIRE', key, ttl)
  else
    local v = head
    if not whole then v = redis.call('GET', key) end
    local a, b = 17 + 8 * ((h + f) % cap), 16 + 8 * h
    local live
    if count == 0 then live = ''
    elseif a <= b then live = string.sub(v, a, b)
    else live = string.sub(v, a, 16 + 8 * cap) .. string.sub(v, 17, b) end
    redis.call('SET', key, struct.pack('>I4I4I8', 0, count + 1, stamp) .. live .. struct.pack('>I8', stamp), 'PX', ttl)
  end
  return {1, count + 1, 0, oldest + window - now}
end
`

// script is one decision, for a Call: KEYS[1] = Call.Key, ARGV = Call.Args.
var script = redis.NewScript(SlidingLogLua + `return sliding_log(KEYS[1], ARGV[1], ARGV[2], ARGV[3])`)

// RedisLimiter is an exact sliding-window limiter whose state lives in Redis,
// shared by every process that uses the same Redis and prefix.
//
// Each Allow is one atomic script call (EVALSHA of a Lua script over a ring of the
// latest accepted times, [SlidingLogLua]; EVAL once after a SCRIPT FLUSH or
// failover). Calls of concurrent Allows are sent to Redis together, one pipeline
// per round trip (package internal/autopipe): a lone call goes at once. The script uses the Redis server clock (TIME), never the caller's,
// so instances with skewed clocks still agree. Each key is one Redis key,
// prefix + key + [RingSuffix], so Redis Cluster works too (a hash tag in key
// stays the key's).
type RedisLimiter struct {
	calls  *autopipe.Pipeliner
	prefix string
	cfg    atomic.Pointer[config]
}

// RingSuffix ends the Redis key of every ring (prefix + key + RingSuffix). Releases before
// the ring kept a sorted set under prefix + key: a new name, so that during a rolling upgrade
// old and new instances never read each other's keys as the wrong type (each version then
// counts on its own for at most a window, and the old sorted sets expire within a window).
const RingSuffix = ":ring"

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
	// Key is the Redis key of the ring (the limiter's prefix + the caller's key + RingSuffix).
	Key string
	// Args are the limit, the window in microseconds and the ring's TTL in milliseconds. The
	// slice has no spare capacity: appending to it copies it.
	Args []any

	cfg *config
}

// Prepare returns the call that decides for key (as passed to Allow) under the current limit
// and window, counting as one call of Allow. ok is false when the limit is 0: nothing is asked
// of Redis then, and [Call.Deny] is the decision.
func (l *RedisLimiter) Prepare(key string) (c Call, ok bool) {
	cfg := l.cfg.Load()
	c = Call{Key: l.prefix + key + RingSuffix, cfg: cfg}
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
