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

// slidingLogScript is the whole decision, run atomically inside Redis.
//
// KEYS[1] sorted set of accepted requests: score = Redis TIME in microseconds,
//
//	member = "<sec>.<usec>-<ARGV[4]>" (unique per call)
//
// ARGV[1] limit (>= 1)
// ARGV[2] window in microseconds
// ARGV[3] key TTL in milliseconds (>= window)
// ARGV[4] unique member suffix (limiter instance id + sequence number)
//
// An entry with score s is inside the window at time now iff now - s < window,
// so entries with s <= now - window are removed first. The request is accepted
// iff fewer than limit entries remain. Returns
// {allowed (0/1), count after this call, retry_after_us, reset_us}.
//
// On reject, the slot frees when the entry at index count-limit (0-based,
// oldest first) leaves the window; normally count == limit and that is the
// oldest entry, but after the limit was lowered more entries may be present.
//
// TIME is called before any write; on Redis < 5 this needs script effects
// replication, which redis.replicate_commands enables (a no-op on Redis >= 7).
const slidingLogScript = `
if redis.replicate_commands ~= nil then pcall(redis.replicate_commands) end
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local count = redis.call('ZCARD', key)
if count < limit then
  redis.call('ZADD', key, now, t[1] .. '.' .. t[2] .. '-' .. ARGV[4])
  redis.call('PEXPIRE', key, ARGV[3])
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return {1, count + 1, 0, tonumber(oldest[2]) + window - now}
end
local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
local freeing = oldest
if count > limit then
  freeing = redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')
end
return {0, count, tonumber(freeing[2]) + window - now, tonumber(oldest[2]) + window - now}
`

var script = redis.NewScript(slidingLogScript)

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
	cfg := l.cfg.Load()
	if cfg.limit <= 0 {
		return cfg.denyAll(), nil
	}
	windowUS := int64((cfg.window + time.Microsecond - 1) / time.Microsecond)
	ttlMS := int64((cfg.window + time.Millisecond - 1) / time.Millisecond)
	member := l.id + strconv.FormatUint(l.seq.Add(1), 36)

	res, err := script.Run(ctx, l.client, []string{l.prefix + key}, cfg.limit, windowUS, ttlMS, member).Int64Slice()
	if err != nil {
		return Decision{}, fmt.Errorf("ratelimit: redis: %w", err)
	}
	if len(res) != 4 {
		return Decision{}, fmt.Errorf("ratelimit: redis: unexpected script reply %v", res)
	}
	allowed, count := res[0] == 1, int(res[1])
	d := Decision{
		Allowed:   allowed,
		Limit:     cfg.limit,
		Remaining: max(cfg.limit-count, 0),
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
