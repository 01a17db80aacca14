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
