package relay

import (
	"context"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/ratelimit"
)

// Admission decides whether a relay call may go upstream: the channel's rate limit and, for a
// send with an idempotency key, the key's claim (see package idempotency for the claim's life:
// Acquired, then Complete or Release).
type Admission interface {
	// Allow counts a call without an idempotency key against the channel's limit. An error
	// means no decision could be made; the call is then let through (a limiter with a memory
	// fallback only fails when that fails too).
	Allow(ctx context.Context, channel uuid.UUID) (ratelimit.Decision, error)
	// Claim counts a send carrying key against the channel's limit and, when the limit lets it
	// through, claims key for the request fingerprint fp. When the limit refuses, nothing is
	// claimed and the Result is zero. An error means the idempotency store could not answer:
	// the send must not go out.
	Claim(ctx context.Context, channel uuid.UUID, key, fp string) (ratelimit.Decision, idempotency.Result, error)
	// Complete stores the answer of a claimed send, for replays.
	Complete(ctx context.Context, channel uuid.UUID, key, token string, resp idempotency.Response) error
	// Release gives a claimed key back: the upstream provably did not send.
	Release(ctx context.Context, channel uuid.UUID, key, token string) error
}

// hashTag is the part of every Redis key of one channel that Redis Cluster hashes: the limit
// log and the idempotency records of a channel live in one slot, so one script can touch both.
func hashTag(channel uuid.UUID) string { return "{" + channel.String() + "}" }

// ClaimKey is the idempotency store key of a channel's idempotency key: in the channel's
// hash tag, so that it shares the Redis Cluster slot of the channel's limit log.
func ClaimKey(channel uuid.UUID, key string) string { return hashTag(channel) + ":" + key }

// NewAdmission returns the Admission of limiter and idem, asked one after the other (in
// process memory, or on a Redis without the combined script).
func NewAdmission(limiter ratelimit.Limiter, idem idempotency.Store) Admission {
	return &admission{limiter: limiter, idem: idem}
}

// NewRedisAdmission returns the Admission of a relay whose limit log and idempotency records
// are both on Redis: a send with a key is counted and claimed in one round trip (rl and ri on
// the same Redis). limiter answers calls without a key; it is rl wrapped with a memory
// fallback, so that a Redis outage never lifts the limit.
func NewRedisAdmission(limiter ratelimit.Limiter, rl *ratelimit.RedisLimiter, ri *idempotency.Redis) Admission {
	return &admission{limiter: limiter, idem: ri, rl: rl, ri: ri}
}

type admission struct {
	limiter ratelimit.Limiter
	idem    idempotency.Store
	// Set together for the combined script.
	rl *ratelimit.RedisLimiter
	ri *idempotency.Redis
}

func (a *admission) Allow(ctx context.Context, channel uuid.UUID) (ratelimit.Decision, error) {
	return a.limiter.Allow(ctx, hashTag(channel))
}

func (a *admission) Claim(ctx context.Context, channel uuid.UUID, key, fp string) (ratelimit.Decision, idempotency.Result, error) {
	if a.ri != nil {
		return a.ri.BeginLimited(ctx, a.rl, hashTag(channel), ClaimKey(channel, key), fp)
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

func (a *admission) Complete(ctx context.Context, channel uuid.UUID, key, token string, resp idempotency.Response) error {
	return a.idem.Complete(ctx, ClaimKey(channel, key), token, resp)
}

func (a *admission) Release(ctx context.Context, channel uuid.UUID, key, token string) error {
	return a.idem.Release(ctx, ClaimKey(channel, key), token)
}
