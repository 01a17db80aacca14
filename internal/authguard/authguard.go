// Package authguard bounds what a flood of bad credentials can cost: it counts authentication
// failures per client address in memory, and once an address has failed too often within the
// window, its next attempts are refused before any credential lookup (the caller answers 429
// with Retry-After). Memory is bounded: when the table is full, new addresses share one
// overflow bucket, so a distributed flood is still limited as a whole.
//
// Addresses are grouped: an IPv4 address counts alone, an IPv6 address by its /64 (one host
// usually holds a whole /64).
package authguard

import (
	"net/netip"
	"sync"
	"time"
)

// Defaults of [New].
const (
	DefaultFailures = 20
	DefaultWindow   = time.Minute
	DefaultMaxAddrs = 65536
)

// overflowKey is the shared bucket of addresses that found the table full.
const overflowKey = "*"

// Guard counts authentication failures per client address. The zero value is not usable; call
// [New]. Methods are safe for concurrent use.
type Guard struct {
	failures int
	window   time.Duration
	maxAddrs int
	now      func() time.Time

	mu    sync.Mutex
	addrs map[string]*bucket
}

// bucket is a fixed window of failures of one address.
type bucket struct {
	start time.Time
	n     int
}

// New returns a guard that refuses an address after failures authentication failures within
// window, until the window that saw them ends, keeping at most maxAddrs addresses. Zero or
// negative values take the defaults.
func New(failures int, window time.Duration, maxAddrs int) *Guard {
	if failures <= 0 {
		failures = DefaultFailures
	}
	if window <= 0 {
		window = DefaultWindow
	}
	if maxAddrs <= 0 {
		maxAddrs = DefaultMaxAddrs
	}
	return &Guard{failures: failures, window: window, maxAddrs: maxAddrs, now: time.Now, addrs: map[string]*bucket{}}
}

// Check reports whether addr may attempt to authenticate. When it may not, retryAfter is the
// time until its window ends (at least one second).
func (g *Guard) Check(addr string) (retryAfter time.Duration, ok bool) {
	k := key(addr)
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.addrs[k]
	if b == nil {
		if len(g.addrs) < g.maxAddrs {
			return 0, true
		}
		if b = g.addrs[overflowKey]; b == nil {
			return 0, true
		}
	}
	end := b.start.Add(g.window)
	if !now.Before(end) || b.n < g.failures {
		return 0, true
	}
	return max(end.Sub(now), time.Second), false
}

// Fail records an authentication failure of addr.
func (g *Guard) Fail(addr string) {
	k := key(addr)
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.addrs[k]
	if b == nil {
		if len(g.addrs) >= g.maxAddrs {
			g.sweep(now)
		}
		if len(g.addrs) >= g.maxAddrs {
			k = overflowKey
			b = g.addrs[k]
		}
		if b == nil {
			b = &bucket{start: now}
			g.addrs[k] = b
		}
	}
	if !now.Before(b.start.Add(g.window)) {
		b.start, b.n = now, 0
	}
	b.n++
}

// sweep drops the buckets whose window has ended. The overflow bucket is kept while it counts.
func (g *Guard) sweep(now time.Time) {
	for k, b := range g.addrs {
		if !now.Before(b.start.Add(g.window)) {
			delete(g.addrs, k)
		}
	}
}

// key groups an address: IPv4 alone, IPv6 by /64. Anything else (a host name, a malformed
// value) is used as given.
func key(addr string) string {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		addr = ap.Addr().String()
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	ip = ip.Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, _ := ip.Prefix(64)
	return p.String()
}
