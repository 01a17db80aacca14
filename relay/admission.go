package relay

import (
	"context"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/ratelimit"
)

// Admission decides whether a relay call may go upstream: the channel's rate limit and, for a
// send with an idempotency key, the key's claim (see package idempotency for the claim's life:
// Acquired, then Complete or Release). Package admission implements it, on Redis (limit and
// claim in one round trip) and in memory; the relay declares only what it consumes.
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
