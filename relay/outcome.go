package relay

import "time"

// SendDeadline bounds a send through the relay once it has started. A send runs to its end
// even when the caller hangs up (so that its real answer can be stored and replayed to the
// caller's retry); this deadline, shorter than the idempotency claim's lease (2 min), makes
// sure no send outlives its claim.
const SendDeadline = 90 * time.Second

// ReleaseKey reports whether the idempotency claim of a send is given back (the key may be
// used again) rather than the answer stored: only when the upstream provably did not send —
// it was never reached or rejected the access token (notSent), or it answered a 4xx itself
// (upstreamAnswered). A relay-made 4xx, a 5xx, a timeout or an unknown outcome is stored.
func ReleaseKey(status int, upstreamAnswered, notSent bool) bool {
	return notSent || upstreamAnswered && status >= 400 && status < 500
}

// ValidStatus reports whether status can be written as an HTTP status code.
func ValidStatus(status int) bool { return status >= 100 && status <= 999 }

// Outcome is what came of one relay call, as [Metrics.Answered] counts it: the outcome label of
// caddy_wabarelay_relay_requests_total.
type Outcome string

// The relay's outcomes.
const (
	// OutcomeOK: the upstream's answer, below 400, was passed on.
	OutcomeOK Outcome = "ok"
	// OutcomeUpstream4xx: the upstream's own 4xx answer was passed on.
	OutcomeUpstream4xx Outcome = "upstream_4xx"
	// OutcomeUpstream5xx: the upstream's own 5xx answer was passed on.
	OutcomeUpstream5xx Outcome = "upstream_5xx"
	// OutcomeUpstreamError: the upstream could not be reached, did not answer in time, cut its
	// answer short or answered in an encoding the relay cannot read (502/504).
	OutcomeUpstreamError Outcome = "upstream_error"
	// OutcomeUnauthorized: no or an unknown channel token (401).
	OutcomeUnauthorized Outcome = "unauthorized"
	// OutcomeAuthThrottled: the client address presented too many bad tokens (429).
	OutcomeAuthThrottled Outcome = "auth_throttled"
	// OutcomeInactive: the channel is not active (403).
	OutcomeInactive Outcome = "inactive"
	// OutcomeForbidden: the path is outside the channel's scope (403).
	OutcomeForbidden Outcome = "forbidden"
	// OutcomeDisconnected: the channel's upstream token is dead (503 CHANNEL_DISCONNECTED).
	OutcomeDisconnected Outcome = "disconnected"
	// OutcomeRateLimited: the channel's rate limit refused the call (429).
	OutcomeRateLimited Outcome = "rate_limited"
	// OutcomeReplayed: a send's stored answer was replayed for its idempotency key.
	OutcomeReplayed Outcome = "replayed"
	// OutcomeIdempotencyUnavailable: the idempotency store could not answer; a send with a key
	// was refused (503).
	OutcomeIdempotencyUnavailable Outcome = "idempotency_unavailable"
	// OutcomeUnavailable: the channel could not be looked up (503).
	OutcomeUnavailable Outcome = "unavailable"
	// OutcomeInvalidRequest: the relay refused the request itself for its query or body (400
	// unparsable, 413 too large, 422 a bad idempotency_key).
	OutcomeInvalidRequest Outcome = "invalid_request"
	// OutcomeIdempotencyConflict: a send's idempotency_key is in progress (409) or was used
	// with a different request (422).
	OutcomeIdempotencyConflict Outcome = "idempotency_conflict"
)

// Outcomes returns every outcome, for a metrics collector to create its labels up front.
func Outcomes() []Outcome {
	return []Outcome{OutcomeOK, OutcomeUpstream4xx, OutcomeUpstream5xx, OutcomeUpstreamError,
		OutcomeUnauthorized, OutcomeAuthThrottled, OutcomeInactive, OutcomeForbidden,
		OutcomeDisconnected, OutcomeRateLimited, OutcomeReplayed, OutcomeIdempotencyUnavailable,
		OutcomeUnavailable, OutcomeInvalidRequest, OutcomeIdempotencyConflict, OutcomeWindowClosed}
}
