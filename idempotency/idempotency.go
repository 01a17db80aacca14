// Package idempotency makes sure that at most one upstream send happens per (channel,
// idempotency key), across every instance of the relay, and that repeats of a send get the first
// send's stored response.
//
// A request carrying a key calls [Store.Begin]. Exactly one caller per key gets [Acquired] and
// an owner token; it sends upstream and then either stores the upstream response with
// [Store.Complete] (the response is replayed to every repeat for [Options.TTL]) or, when the
// upstream provably did not send, gives the key back with [Store.Release]. A repeat that arrives
// while the first request is in flight waits for it (up to [Options.Wait]) and then replays its
// response; a repeat with a different request fingerprint gets [Mismatch].
//
// Two implementations exist: [Redis], shared by every instance that uses the same Redis, and
// [Memory], correct for a single process only. Neither hashes, caps or validates keys: the
// caller passes key = channel id + ":" + idempotency_key and a fingerprint of the request.
//
// The owner of a key holds it for [Options.Lease]. If the owner crashes, the key is free again
// when the lease ends and a retry sends again: deduplication is exactly-once while the owner
// lives and at-least-once across owner crashes. Complete and Release are fenced by the owner
// token: an owner whose lease ended and whose key was taken over changes nothing.
package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// Response is what is stored and replayed: the upstream status, the headers worth replaying
// (Content-Type, the upstream's x-fb-trace-id and so on; the caller decides which) and the body.
type Response struct {
	// Status is the HTTP status code.
	Status int
	// Header holds the headers to replay. In a replayed Response it is never nil.
	Header http.Header
	// Body is the response body, byte for byte.
	Body []byte
}

// Clone returns a deep copy of r. The copy's Header is never nil.
func (r Response) Clone() Response {
	h := r.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	var body []byte
	if r.Body != nil {
		body = append(make([]byte, 0, len(r.Body)), r.Body...)
	}
	return Response{Status: r.Status, Header: h, Body: body}
}

// Outcome tells the caller of [Store.Begin] what to do.
type Outcome int

const (
	// Acquired means the caller owns the key. It sends upstream and then calls Complete (the
	// send was attempted) or Release (the upstream provably did not send).
	Acquired Outcome = iota
	// Replay means a response is stored for this key and fingerprint; the caller replays
	// Result.Response without calling upstream.
	Replay
	// InProgress means another request with this key was still in flight after waiting up to
	// Options.Wait; the caller answers 409.
	InProgress
	// Mismatch means the key was used with a different fingerprint; the caller answers 422.
	Mismatch
)

// String returns the outcome's name, for logs.
func (o Outcome) String() string {
	switch o {
	case Acquired:
		return "acquired"
	case Replay:
		return "replay"
	case InProgress:
		return "in_progress"
	case Mismatch:
		return "mismatch"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Result is the answer of [Store.Begin].
type Result struct {
	// Outcome says what the caller does next.
	Outcome Outcome
	// Response is the stored response when Outcome is Replay, else nil. It belongs to the
	// caller (a fresh copy for every call).
	Response *Response
	// Token is the owner token when Outcome is Acquired, else empty. Pass it to Complete or
	// Release.
	Token string
}

// Store de-duplicates sends by key. It is implemented by [Redis] (shared across instances) and
// [Memory] (one process). Methods are safe for concurrent use.
type Store interface {
	// Begin claims key for a request with fingerprint fp (see [Fingerprint]).
	//
	// If nobody holds the key, the caller becomes its owner: Outcome Acquired with a Token. If a
	// response is stored for the key, Begin answers Replay with it, or Mismatch if fp differs
	// from the fingerprint the key was first used with. If the key is in flight elsewhere and
	// fp matches, Begin waits (up to Options.Wait, honouring ctx) for that request to finish:
	// completed → Replay; released (or its lease ended) → Begin tries to claim again, and
	// exactly one waiter becomes the new owner; still in flight at the deadline → InProgress.
	// A fingerprint mismatch is reported at once, without waiting.
	//
	// An error means the store could not answer (for Redis it wraps [ErrUnavailable]; if ctx
	// ended, it wraps ctx.Err()): the caller must not guess and answers 503.
	Begin(ctx context.Context, key, fp string) (Result, error)

	// Complete stores resp for key, kept for Options.TTL, if token still owns the key, and
	// wakes the requests waiting for it. If token no longer owns the key (its lease ended and
	// the key expired or was claimed by another request, or it was already completed or
	// released), Complete changes nothing and returns [ErrNotOwner]. Other errors mean the
	// store could not be reached; the claim then ends with its lease.
	Complete(ctx context.Context, key, token string, resp Response) error

	// Release deletes the claim if token still owns it (the upstream provably did not send), so
	// that the next request (or one of the waiters) can claim it, and wakes the waiters. If token
	// no longer owns the key, Release changes nothing and returns [ErrNotOwner].
	Release(ctx context.Context, key, token string) error
}

// ErrNotOwner is returned by Complete and Release when the token does not own the key (any
// more); nothing was changed. Callers usually log it and carry on: the response they hold is
// still the right answer for their own client.
var ErrNotOwner = errors.New("idempotency: token does not own the key (lease expired or key taken over)")

// ErrUnavailable is wrapped by every error of the Redis store caused by Redis itself (down,
// timeout, unexpected reply). The caller answers 503 "Idempotency store unavailable".
var ErrUnavailable = errors.New("idempotency store unavailable")

// Defaults of [Options].
const (
	DefaultTTL    = 24 * time.Hour
	DefaultLease  = 2 * time.Minute
	DefaultWait   = 35 * time.Second
	DefaultPrefix = "wabarelay:idem:"
)

// Options configures a Store. Zero fields take the defaults.
type Options struct {
	// TTL is how long completed responses are kept. Default 24h.
	TTL time.Duration
	// Lease is how long an in-flight claim lives without Complete or Release (the owner
	// crashed). It must exceed the longest upstream send. Default 2m.
	Lease time.Duration
	// Wait is how long a duplicate waits for the in-flight request before InProgress. Default
	// 35s (at least the upstream timeout of 30s). A negative Wait means do not wait at all.
	Wait time.Duration
	// Prefix is prepended to every Redis key (and starts the pub/sub channel names). Default
	// "wabarelay:idem:". Unused by Memory.
	Prefix string
}

// withDefaults returns o with zero fields set to their defaults.
func (o Options) withDefaults() Options {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.Wait == 0 {
		o.Wait = DefaultWait
	}
	if o.Wait < 0 {
		o.Wait = 0
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	return o
}

// Fingerprint returns the hex SHA-256 of method, path, body (the body without the idempotency
// key) and query (the raw query string as forwarded), each length-prefixed so that different
// splits never collide. An empty query adds nothing: the fingerprint of a call without a query
// is the one earlier versions computed, so records stored before the query counted still
// replay. Callers may use any other stable fingerprint instead.
func Fingerprint(method, path, query string, body []byte) string {
	h := sha256.New()
	var n [8]byte
	parts := [][]byte{[]byte(method), []byte(path), body, []byte(query)}
	if query == "" {
		parts = parts[:3]
	}
	for _, part := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil))
}
