// Package ratelimit implements an exact sliding-window rate limiter.
//
// The contract is strict: for every key, never more than limit requests are
// accepted in ANY rolling window of length window (for example 100 per 60 s),
// rejected requests do not count, and a rejected caller is told how long to
// wait until a slot frees (the moment the oldest accepted request that keeps
// the window full leaves it).
//
// Two implementations share the algorithm, a sliding log of accepted
// timestamps:
//
//   - [RedisLimiter] keeps the log in one Redis string (appended to, rewritten
//     with its live times now and then) and decides in one atomic Lua script
//     (one EVALSHA; concurrent calls share round trips, one pipeline each),
//     using the Redis server clock, so the limit is exact across any number of
//     processes sharing one Redis.
//   - [MemoryLimiter] keeps a per-key ring buffer in process memory; it is exact
//     for one process.
//
// [NewFallback] combines them: it answers from Redis and, while Redis is
// unavailable, from memory (each instance then limits on its own), so a Redis
// outage never turns into unlimited traffic.
//
// A GCRA/leaky bucket with burst N (as in redis_rate) is deliberately not used:
// it admits about 2N requests in the first window.
//
// Keys should identify the limited principal without being a secret (for
// example a channel id or a hash of an API key), because they are stored in
// Redis and may show up in its monitoring tools.
package ratelimit

import (
	"context"
	"net/http"
	"strconv"
	"time"
)

// Decision is the outcome of one Allow call.
type Decision struct {
	// Allowed reports whether the request was accepted (and counted).
	Allowed bool
	// Limit is the configured limit.
	Limit int
	// Remaining is the number of slots left in the current window after this
	// call (>= 0).
	Remaining int
	// RetryAfter is, when !Allowed, the time until a slot frees (> 0); it is 0
	// when the request was allowed.
	RetryAfter time.Duration
	// Reset is the time until the oldest accepted request in the window leaves
	// it (oldest entry + window - now), i.e. until the window gains room again.
	// It is meant for the RateLimit-Reset header.
	Reset time.Duration
}

// RetryAfterSeconds returns RetryAfter rounded UP to whole seconds, at least 1
// (for the Retry-After header).
func (d Decision) RetryAfterSeconds() int {
	s := ceilSeconds(d.RetryAfter)
	if s < 1 {
		s = 1
	}
	return s
}

// ResetSeconds returns Reset rounded up to whole seconds (0 allowed).
func (d Decision) ResetSeconds() int {
	return ceilSeconds(d.Reset)
}

// SetHeaders writes RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset
// (the IETF draft names, draft-ietf-httpapi-ratelimit-headers) and, when the
// request was not allowed, Retry-After in whole seconds.
func (d Decision) SetHeaders(h http.Header) {
	remaining := d.Remaining
	if remaining < 0 {
		remaining = 0
	}
	h.Set("RateLimit-Limit", strconv.Itoa(d.Limit))
	h.Set("RateLimit-Remaining", strconv.Itoa(remaining))
	h.Set("RateLimit-Reset", strconv.Itoa(d.ResetSeconds()))
	if !d.Allowed {
		h.Set("Retry-After", strconv.Itoa(d.RetryAfterSeconds()))
	}
}

// ceilSeconds rounds d up to whole seconds; negative durations give 0.
func ceilSeconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}

// Limiter decides whether one request for key may proceed.
//
// Implementations are safe for concurrent use. An error means no decision
// could be made (for example Redis is unreachable); callers that must not fail
// open should wrap the limiter with [NewFallback].
type Limiter interface {
	Allow(ctx context.Context, key string) (Decision, error)
}

// config is an immutable (limit, window) pair, swapped atomically by SetLimit.
type config struct {
	limit  int
	window time.Duration
}

func newConfig(limit int, window time.Duration) *config {
	if window <= 0 {
		panic("ratelimit: window must be positive, got " + window.String())
	}
	if limit < 0 {
		limit = 0
	}
	return &config{limit: limit, window: window}
}

// denyAll is the decision for a limit of 0: nothing is ever accepted.
func (c *config) denyAll() Decision {
	return Decision{Allowed: false, Limit: 0, Remaining: 0, RetryAfter: c.window, Reset: c.window}
}
