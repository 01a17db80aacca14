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
//
// A refusal is for credentials the guard does not know. A client address may be shared (NAT, a
// serverless platform's egress, a /64): one tenant's garbage must not lock another tenant out.
// So a credential known valid is never refused, whatever its address has done: the callers ask
// [Guard.Admit] with the credential, which the guard knows valid once [Guard.Valid] recorded
// it (as its SHA-256, in a bounded table, from memory: no query), or the caller asks
// [Guard.Check] and lets a credential through that its own in-memory cache knows (the relay's
// channel cache). A known credential that then fails is forgotten ([Guard.Forget]) and counted
// as a failure like any other.
package authguard

import (
	"container/list"
	"crypto/sha256"
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

// Known credentials: the guard remembers at most MaxKnown credentials that authenticated, each
// for KnownTTL after its last success; past the bound the least recently successful one is
// forgotten (it is then refused from a refused address until it succeeds from another one).
const (
	MaxKnown = 65536
	KnownTTL = 24 * time.Hour
)

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

	// The credentials known valid (their own lock: every successful authentication records one).
	kmu      sync.Mutex
	maxKnown int
	known    map[[sha256.Size]byte]*list.Element // of *knownCred, by the credential's SHA-256
	knownLRU *list.List                          // of *knownCred, least recently successful first
}

// knownCred is a credential that authenticated, by its SHA-256.
type knownCred struct {
	hash [sha256.Size]byte
	last time.Time // its last success
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
		addrs: map[string]*list.Element{}, lru: list.New(), folds: map[netip.Prefix]map[*list.Element]struct{}{},
		maxKnown: MaxKnown, known: map[[sha256.Size]byte]*list.Element{}, knownLRU: list.New()}
}

// Admit reports whether addr may attempt to authenticate with credential: always when the
// credential is known valid ([Guard.Valid]), else as [Guard.Check] says.
func (g *Guard) Admit(addr, credential string) (retryAfter time.Duration, ok bool) {
	if retryAfter, ok = g.Check(addr); ok || g.Known(credential) {
		return 0, true
	}
	return retryAfter, false
}

// Valid records that credential authenticated: it is known valid for KnownTTL from now, or
// until [Guard.Forget]. Only its SHA-256 is kept.
func (g *Guard) Valid(credential string) {
	if credential == "" {
		return
	}
	h := sha256.Sum256([]byte(credential))
	now := g.now()
	g.kmu.Lock()
	defer g.kmu.Unlock()
	g.expireKnown(now)
	if e := g.known[h]; e != nil {
		e.Value.(*knownCred).last = now
		g.knownLRU.MoveToBack(e)
		return
	}
	for len(g.known) >= g.maxKnown {
		delete(g.known, g.knownLRU.Remove(g.knownLRU.Front()).(*knownCred).hash)
	}
	g.known[h] = g.knownLRU.PushBack(&knownCred{hash: h, last: now})
}

// Known reports whether credential is known valid: it authenticated within KnownTTL and has
// not been forgotten since.
func (g *Guard) Known(credential string) bool {
	if credential == "" {
		return false
	}
	h := sha256.Sum256([]byte(credential))
	now := g.now()
	g.kmu.Lock()
	defer g.kmu.Unlock()
	g.expireKnown(now)
	return g.known[h] != nil
}

// Forget drops credential from the known valid ones (it failed, or its session ended).
func (g *Guard) Forget(credential string) {
	h := sha256.Sum256([]byte(credential))
	g.kmu.Lock()
	defer g.kmu.Unlock()
	if e := g.known[h]; e != nil {
		g.knownLRU.Remove(e)
		delete(g.known, h)
	}
}

// KnownLen returns the number of credentials known valid (at most MaxKnown).
func (g *Guard) KnownLen() int {
	g.kmu.Lock()
	defer g.kmu.Unlock()
	return len(g.known)
}

// expireKnown drops the known credentials whose last success is KnownTTL old. Called with
// g.kmu held.
func (g *Guard) expireKnown(now time.Time) {
	for e := g.knownLRU.Front(); e != nil; e = g.knownLRU.Front() {
		k := e.Value.(*knownCred)
		if now.Sub(k.last) < KnownTTL {
			return
		}
		g.knownLRU.Remove(e)
		delete(g.known, k.hash)
	}
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
