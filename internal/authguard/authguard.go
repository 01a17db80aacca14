// Package authguard bounds what a flood of bad credentials can cost: it counts authentication
// failures per client in memory, and once a client has failed too often within the window, its
// next attempts are refused before any credential lookup (the caller answers 429 with
// Retry-After).
//
// A client is an address grouped the way addresses are handed out: an IPv4 address counts
// alone, an IPv6 address by its /64 (one host usually holds a whole /64), and once
// [FoldPrefix48] /64s of one /48 are failing at the same time, by that /48 (one site usually
// holds a whole /48): its /64s fold into one entry that carries their failures, so a flood
// spread over a /48 costs one entry and gets the whole /48 refused.
//
// Only clients that failed are tracked, so a client that has not failed (and whose /48 is not
// folded) is never refused. Memory is bounded: the table holds at most maxAddrs entries, an
// entry is dropped once its last failure is a window old, and when the table is full the entry
// whose last failure (or refused attempt) is the oldest is forgotten to make room. Under a
// distributed flood the guard thus prefers forgetting an attacker — who regains a few attempts
// — to refusing an innocent client; there is no shared overflow bucket.
package authguard

import (
	"container/list"
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

// FoldPrefix48 is how many failing /64s of one /48 make the guard count the /48 as one client.
const FoldPrefix48 = 16

// Guard counts authentication failures per client. The zero value is not usable; call [New].
// Methods are safe for concurrent use.
type Guard struct {
	failures int
	window   time.Duration
	maxAddrs int
	now      func() time.Time

	mu    sync.Mutex
	addrs map[string]*list.Element // of *bucket, by key
	lru   *list.List               // of *bucket, least recently failed (or refused) first
	// folds holds, per /48 that is not folded, the entries of its /64s.
	folds map[netip.Prefix]map[*list.Element]struct{}
}

// bucket is a fixed window of failures of one client.
type bucket struct {
	key   string
	p48   netip.Prefix // of a /64: its /48; zero otherwise
	start time.Time    // the window's start
	last  time.Time    // the last failure or refused attempt
	n     int
}

// New returns a guard that refuses a client after failures authentication failures within
// window, until the window that saw them ends, keeping at most maxAddrs clients. Zero or
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
	return &Guard{failures: failures, window: window, maxAddrs: maxAddrs, now: time.Now,
		addrs: map[string]*list.Element{}, lru: list.New(), folds: map[netip.Prefix]map[*list.Element]struct{}{}}
}

// Check reports whether addr may attempt to authenticate. When it may not, retryAfter is the
// time until its window ends (at least one second).
func (g *Guard) Check(addr string) (retryAfter time.Duration, ok bool) {
	c := parse(addr)
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.expire(now)
	e := g.lookup(c)
	if e == nil {
		return 0, true
	}
	b := e.Value.(*bucket)
	end := b.start.Add(g.window)
	if !now.Before(end) || b.n < g.failures {
		return 0, true
	}
	// A refused client that keeps trying stays remembered.
	b.last = now
	g.lru.MoveToBack(e)
	return max(end.Sub(now), time.Second), false
}

// Fail records an authentication failure of addr.
func (g *Guard) Fail(addr string) {
	c := parse(addr)
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.expire(now)
	e := g.lookup(c)
	if e == nil {
		e = g.insert(c, now)
	}
	b := e.Value.(*bucket)
	if !now.Before(b.start.Add(g.window)) {
		b.start, b.n = now, 0
	}
	b.n++
	b.last = now
	g.lru.MoveToBack(e)
}

// Len returns the number of entries in the table (at most maxAddrs).
func (g *Guard) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.addrs)
}

// lookup returns the entry counting client c: its folded /48's, or its own.
func (g *Guard) lookup(c client) *list.Element {
	if c.p48.IsValid() {
		if e := g.addrs[c.p48.String()]; e != nil {
			return e
		}
	}
	return g.addrs[c.key]
}

// insert adds an entry for client c, which has none, making room when the table is full, and
// folds c's /48 when it now holds FoldPrefix48 failing /64s.
func (g *Guard) insert(c client, now time.Time) *list.Element {
	if c.p48.IsValid() && len(g.folds[c.p48])+1 >= FoldPrefix48 {
		return g.fold(c.p48, now)
	}
	for len(g.addrs) >= g.maxAddrs {
		g.remove(g.lru.Front())
	}
	e := g.lru.PushBack(&bucket{key: c.key, p48: c.p48, start: now, last: now})
	g.addrs[c.key] = e
	if c.p48.IsValid() {
		m := g.folds[c.p48]
		if m == nil {
			m = map[*list.Element]struct{}{}
			g.folds[c.p48] = m
		}
		m[e] = struct{}{}
	}
	return e
}

// fold replaces the entries of p48's /64s by one entry of the /48 carrying the failures of
// their current windows; its window starts now.
func (g *Guard) fold(p48 netip.Prefix, now time.Time) *list.Element {
	b := &bucket{key: p48.String(), start: now, last: now}
	for e := range g.folds[p48] {
		if m := e.Value.(*bucket); now.Before(m.start.Add(g.window)) {
			b.n += m.n
		}
		g.remove(e)
	}
	for len(g.addrs) >= g.maxAddrs {
		g.remove(g.lru.Front())
	}
	e := g.lru.PushBack(b)
	g.addrs[b.key] = e
	return e
}

// remove drops an entry.
func (g *Guard) remove(e *list.Element) {
	b := g.lru.Remove(e).(*bucket)
	delete(g.addrs, b.key)
	if m := g.folds[b.p48]; m != nil {
		if delete(m, e); len(m) == 0 {
			delete(g.folds, b.p48)
		}
	}
}

// expire drops the entries whose last failure is a window old (their windows have ended).
func (g *Guard) expire(now time.Time) {
	for e := g.lru.Front(); e != nil; e = g.lru.Front() {
		if now.Before(e.Value.(*bucket).last.Add(g.window)) {
			return
		}
		g.remove(e)
	}
}

// client is an address as the guard counts it: key is the address (IPv4), its /64 (IPv6) or,
// for anything else (a host name, a malformed value), the value as given; p48 is the /48 of an
// IPv6 address.
type client struct {
	key string
	p48 netip.Prefix
}

func parse(addr string) client {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		addr = ap.Addr().String()
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return client{key: addr}
	}
	ip = ip.Unmap()
	if ip.Is4() {
		return client{key: ip.String()}
	}
	p64, _ := ip.WithZone("").Prefix(64)
	p48, _ := ip.WithZone("").Prefix(48)
	return client{key: p64.String(), p48: p48}
}
