package ratelimit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// defaultProbeEvery is how often a Fallback retries its primary while it is
// down.
const defaultProbeEvery = time.Second

// fallbackLimiter is the Limiter returned by NewFallback.
type fallbackLimiter struct {
	primary, fallback Limiter
	logger            *zap.Logger
	probeEvery        time.Duration
	now               func() time.Time

	down atomic.Bool // fast path; written under mu

	mu        sync.Mutex
	probing   bool      // a request is currently trying the primary while down
	nextProbe time.Time // earliest time for the next probe while down
	downSince time.Time
}

// NewFallback returns a Limiter that asks primary and, when primary returns an
// error (Redis down), answers from fallback instead, so a broken primary never
// turns into unlimited traffic and never fails the request. It logs one
// warning through logger when an outage starts (not per request) and one info
// message when primary answers again.
//
// While primary is down, at most one request per second tries it again; every
// other request goes straight to fallback, so an unreachable Redis does not add
// its timeouts to each request. A primary error caused by the caller's own
// context ending is not treated as an outage.
//
// Requests accepted by fallback during an outage are not known to primary
// afterwards (and each instance limits on its own while Redis is down).
// An error is returned only if fallback fails too. A nil logger logs nothing.
func NewFallback(primary, fallback Limiter, logger *zap.Logger) Limiter {
	if logger == nil {
		logger = zap.NewNop()
	}
	return &fallbackLimiter{
		primary:    primary,
		fallback:   fallback,
		logger:     logger,
		probeEvery: defaultProbeEvery,
		now:        time.Now,
	}
}

// Allow implements Limiter.
func (f *fallbackLimiter) Allow(ctx context.Context, key string) (Decision, error) {
	if f.down.Load() && !f.startProbe() {
		return f.fallback.Allow(ctx, key)
	}
	d, err := f.primary.Allow(ctx, key)
	if err == nil {
		f.markUp()
		return d, nil
	}
	f.markDown(ctx, err)
	fd, ferr := f.fallback.Allow(ctx, key)
	if ferr != nil {
		return Decision{}, errors.Join(err, ferr)
	}
	return fd, nil
}

// startProbe reports whether this request may try the primary while it is down.
func (f *fallbackLimiter) startProbe() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.down.Load() {
		return true // recovered meanwhile
	}
	if f.probing || f.now().Before(f.nextProbe) {
		return false
	}
	f.probing = true
	return true
}

func (f *fallbackLimiter) markUp() {
	if !f.down.Load() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probing = false
	if !f.down.Load() {
		return
	}
	f.down.Store(false)
	f.logger.Info("rate limit store available again; limiting across instances",
		zap.Duration("outage", f.now().Sub(f.downSince)))
}

func (f *fallbackLimiter) markDown(ctx context.Context, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probing = false
	if ctx.Err() != nil {
		return // the caller gave up; says nothing about the primary
	}
	now := f.now()
	f.nextProbe = now.Add(f.probeEvery)
	if f.down.Load() {
		return
	}
	f.down.Store(true)
	f.downSince = now
	f.logger.Warn("rate limit store unavailable; limiting in memory per instance until it recovers",
		zap.Error(err))
}
