package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// SlidingLogLua defines the whole decision as a Lua function, run atomically inside Redis:
//
//	sliding_log(key, limit, window_us, ttl_ms, member) -> {allowed (0/1), count after this call, retry_after_us, reset_us}
//
// A script that embeds it decides for a [Call] c with sliding_log(KEYS[1], ARGV[1], ARGV[2],
// ARGV[3], ARGV[4]), KEYS[1] being c.Key and ARGV[1..4] c.Args; its own keys and arguments
// follow. (The arguments may be strings, as ARGV are.)
//
// key is a sorted set of accepted requests: score = Redis TIME in microseconds, member =
// "<sec>.<usec>-<member>" (unique per call). An entry with score s is inside the window at time
// now iff now - s < window, so entries with s <= now - window are removed first. The request is
// accepted iff fewer than limit (>= 1) entries remain; the key's TTL is then ttl_ms (>= window).
//
// On reject, the slot frees when the entry at index count-limit (0-based, oldest first) leaves
// the window; normally count == limit and that is the oldest entry, but after the limit was
// lowered more entries may be present.
//
// TIME is called before any write; on Redis < 5 this needs script effects replication, which
// SlidingLogLua enables first (redis.replicate_commands; a no-op on Redis >= 7).
const SlidingLogLua = `
if redis.replicate_commands ~= nil then pcall(redis.replicate_commands) end
local function sliding_log(key, limit, window, ttl, member)
  limit, window = tonumber(limit), tonumber(window)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  if count < limit then
    redis.call('ZADD', key, now, t[1] .. '.' .. t[2] .. '-' .. member)
    redis.call('PEXPIRE', key, ttl)
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    return {1, count + 1, 0, tonumber(oldest[2]) + window - now}
  end
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local freeing = oldest
  if count > limit then
    freeing = redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')
  end
  return {0, count, tonumber(freeing[2]) + window - now, tonumber(oldest[2]) + window - now}
end
`

// script is one decision, for a Call: KEYS[1] = Call.Key, ARGV = Call.Args.
var script = redis.NewScript(SlidingLogLua + `return sliding_log(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])`)

// RedisLimiter is an exact sliding-window limiter whose state lives in Redis,
// shared by every process that uses the same Redis and prefix.
//
// Each Allow is one atomic round trip (EVALSHA of a Lua sliding-log script over
// a sorted set; EVAL once after a SCRIPT FLUSH or failover). The script uses
// the Redis server clock (TIME), never the caller's, so instances with skewed
// clocks still agree. Keys are single Redis keys, so Redis Cluster works too.
type RedisLimiter struct {
	client redis.UniversalClient
	prefix string
	cfg    atomic.Pointer[config]

	// id makes sorted-set members unique across processes; seq across calls.
	id  string
	seq atomic.Uint64
}

var _ Limiter = (*RedisLimiter)(nil)

// NewRedis returns a limiter allowing at most limit requests per key in any
// rolling window of length window, with state stored in client under the Redis
// key prefix+key. A limit of 0 (or less) rejects every request; window must be
// positive (NewRedis panics otherwise). Windows are counted in microseconds
// (rounded up), TTLs in milliseconds.
func NewRedis(client redis.UniversalClient, limit int, window time.Duration, prefix string) *RedisLimiter {
	l := &RedisLimiter{client: client, prefix: prefix, id: randomID()}
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
	reply, err := script.Run(ctx, l.client, []string{c.Key}, c.Args...).Result()
	if err != nil {
		return Decision{}, fmt.Errorf("ratelimit: redis: %w", err)
	}
	return c.Decision(reply)
}

// Call is one decision of a [RedisLimiter], prepared by [RedisLimiter.Prepare] for a script
// that embeds [SlidingLogLua] (so that a caller can decide more in the same round trip): the
// script calls sliding_log(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) with Key as KEYS[1]
// and Args as ARGV[1..4], and [Call.Decision] turns that call's reply into a Decision.
type Call struct {
	// Key is the Redis key of the limit log (the limiter's prefix + the caller's key).
	Key string
	// Args are the limit, the window in microseconds, the log's TTL in milliseconds and a member
	// suffix unique to this call. The slice has no spare capacity: appending to it copies it.
	Args []any

	cfg *config
}

// Prepare returns the call that decides for key (as passed to Allow) under the current limit
// and window, counting as one call of Allow. ok is false when the limit is 0: nothing is asked
// of Redis then, and [Call.Deny] is the decision.
func (l *RedisLimiter) Prepare(key string) (c Call, ok bool) {
	cfg := l.cfg.Load()
	c = Call{Key: l.prefix + key, cfg: cfg}
	if cfg.limit <= 0 {
		return c, false
	}
	windowUS := int64((cfg.window + time.Microsecond - 1) / time.Microsecond)
	ttlMS := int64((cfg.window + time.Millisecond - 1) / time.Millisecond)
	c.Args = []any{cfg.limit, windowUS, ttlMS, l.id + strconv.FormatUint(l.seq.Add(1), 36)}
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

// randomID returns 16 random hex digits and a separator. (crypto/rand.Read
// never returns an error since Go 1.24.)
func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:]) + ":"
}
