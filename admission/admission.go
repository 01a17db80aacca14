// Package admission decides whether a relay call may go upstream: the channel's rate limit
// (package ratelimit) and, for a send carrying an idempotency key, the key's claim (package
// idempotency: Acquired, then Complete or Release).
//
// Two constructions exist. [NewMemory] asks the limiter and then the idempotency store, one
// after the other (in process memory: one instance). [NewRedis] counts a keyed send and claims
// its key in ONE round trip: a Lua script of this package that composes the limiter's sliding
// log ([ratelimit.SlidingLogLua]) with the store's claim ([idempotency.ClaimLua]), so that a
// send refused by the limit never claims its key, and a send admitted by the limit is counted
// exactly once.
//
// Every Redis key of one channel carries the channel's hash tag ([ClaimKey], the limit log's
// key), so that under Redis Cluster the limit log and the channel's idempotency records live in
// one slot and one script can touch both.
//
// The relay consumes an Admission through its own interface (relay.Admission); [*Admission]
// implements it. This package does not import the relay.
package admission

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/internal/autopipe"
	"github.com/wabarelay/wabarelay/ratelimit"
)

// Admission is the rate limit and idempotency claim of a relay's calls, per channel. It is safe
// for concurrent use.
type Admission struct {
	// limiter counts calls without a key (and keyed sends without the combined script).
	limiter ratelimit.Limiter
	idem    idempotency.Store
	// combined is set when the limit log and the idempotency records are on one Redis.
	combined *combined
}

// combined is the one-round-trip admission of a keyed send on Redis.
type combined struct {
	calls *autopipe.Pipeliner // the claims of concurrent sends go to Redis together
	log   *ratelimit.RedisLimiter
	idem  *idempotency.Redis
}

// NewMemory returns the Admission of limiter and idem, asked one after the other: for the
// in-memory limiter and store of a single instance (or any pair without the combined script).
func NewMemory(limiter ratelimit.Limiter, idem idempotency.Store) *Admission {
	return &Admission{limiter: limiter, idem: idem}
}

// NewRedis returns the Admission of a relay whose limit log (log) and idempotency records
// (idem) are both on client: a send with a key is counted and claimed in one script call (the
// calls of concurrent sends go to Redis together, one pipeline per round trip: package
// internal/autopipe).
// Calls without a key are counted by log and, while Redis is down, by fallback (see
// [ratelimit.NewFallback]; logger, which may be nil, gets the outage), so that a Redis outage
// never lifts the limit. A nil fallback leaves them to log alone. A keyed send whose Redis is
// down is refused (the store's error): it could otherwise be sent twice.
func NewRedis(client redis.UniversalClient, log *ratelimit.RedisLimiter, idem *idempotency.Redis, fallback ratelimit.Limiter, logger *zap.Logger) *Admission {
	var limiter ratelimit.Limiter = log
	if fallback != nil {
		limiter = ratelimit.NewFallback(log, fallback, logger)
	}
	return &Admission{limiter: limiter, idem: idem, combined: &combined{calls: autopipe.New(client), log: log, idem: idem}}
}

// hashTag is the part of every Redis key of one channel that Redis Cluster hashes: the limit
// log and the idempotency records of a channel live in one slot, so one script can touch both.
// It is also the limiter's key of the channel.
func hashTag(channel uuid.UUID) string { return "{" + channel.String() + "}" }

// ClaimKey is the idempotency store key of a channel's idempotency key: in the channel's hash
// tag, so that it shares the Redis Cluster slot of the channel's limit log.
func ClaimKey(channel uuid.UUID, key string) string { return hashTag(channel) + ":" + key }

// Allow counts a call without an idempotency key against the channel's limit. An error means
// no decision could be made; the relay then lets the call through (a limiter with a memory
// fallback only fails when that fails too).
func (a *Admission) Allow(ctx context.Context, channel uuid.UUID) (ratelimit.Decision, error) {
	return a.limiter.Allow(ctx, hashTag(channel))
}

// Claim counts a send carrying key against the channel's limit and, when the limit lets it
// through, claims key for the request fingerprint fp (see [idempotency.Store.Begin]). When the
// limit refuses, nothing is claimed and the Result is zero. An error means the idempotency
// store could not answer: the send must not go out.
func (a *Admission) Claim(ctx context.Context, channel uuid.UUID, key, fp string) (ratelimit.Decision, idempotency.Result, error) {
	if a.combined != nil {
		return a.combined.claim(ctx, hashTag(channel), ClaimKey(channel, key), fp)
	}
	d, err := a.limiter.Allow(ctx, hashTag(channel))
	if err != nil {
		return d, idempotency.Result{}, err
	}
	if !d.Allowed {
		return d, idempotency.Result{}, nil
	}
	res, err := a.idem.Begin(ctx, ClaimKey(channel, key), fp)
	return d, res, err
}

// Complete stores the answer of a claimed send, for replays.
func (a *Admission) Complete(ctx context.Context, channel uuid.UUID, key, token string, resp idempotency.Response) error {
	return a.idem.Complete(ctx, ClaimKey(channel, key), token, resp)
}

// Release gives a claimed key back: the upstream provably did not send.
func (a *Admission) Release(ctx context.Context, channel uuid.UUID, key, token string) error {
	return a.idem.Release(ctx, ClaimKey(channel, key), token)
}

// limitedClaimScript counts a request against a rate limit and, if the limit lets it through,
// claims the key, in one round trip: KEYS[1] the limit's log, KEYS[2] the claim; ARGV[1..3] the
// limiter's arguments (ratelimit.Call.Args), ARGV[4] the in-flight record, ARGV[5] the lease in
// milliseconds (idempotency.Claim). It returns {limit decision, previous record or nil};
// nothing is claimed when the decision refuses.
var limitedClaimScript = redis.NewScript(ratelimit.SlidingLogLua + idempotency.ClaimLua + `
local d = sliding_log(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
if d[1] == 0 then return {d, false} end
return {d, claim(KEYS[2], ARGV[4], ARGV[5])}
`)

// claim is Claim in one round trip: the limit log of limitKey counts the request exactly as
// log.Allow(ctx, limitKey) would and, when it accepts, the claim of key proceeds like
// idem.Begin (a wait for an in-flight owner re-reads with plain claims, which do not count
// again). Under Redis Cluster both keys must hash to one slot. Errors are Begin's.
func (c *combined) claim(ctx context.Context, limitKey, key, fp string) (ratelimit.Decision, idempotency.Result, error) {
	call, ok := c.log.Prepare(limitKey)
	if !ok {
		return call.Deny(), idempotency.Result{}, nil
	}
	cl, err := c.idem.PrepareClaim(key, fp)
	if err != nil {
		return ratelimit.Decision{}, idempotency.Result{}, err
	}
	reply, err := c.calls.Run(ctx, limitedClaimScript, []string{call.Key, cl.Key},
		append(call.Args, cl.Record, cl.Lease)...).Slice()
	if err == nil && len(reply) != 2 {
		err = fmt.Errorf("unexpected script reply %v", reply)
	}
	var d ratelimit.Decision
	if err == nil {
		d, err = call.Decision(reply[0])
	}
	if err != nil {
		return ratelimit.Decision{}, idempotency.Result{}, unavailable(ctx, key, err)
	}
	if !d.Allowed {
		return d, idempotency.Result{}, nil
	}
	res, err := c.idem.ContinueClaim(ctx, cl, reply[1])
	return d, res, err
}

// unavailable is the error of a combined claim that Redis did not answer, as the store's Begin
// reports it: ctx's error if ctx ended, else one wrapping idempotency.ErrUnavailable.
func unavailable(ctx context.Context, key string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("admission: claiming key %q: %w", key, ctx.Err())
	}
	return fmt.Errorf("%w: admission: claiming key %q: %w", idempotency.ErrUnavailable, key, err)
}
