package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Memory is a [Store] for one process: a map of keys with per-key wake-up channels, and a
// janitor goroutine that drops expired entries. It has the same semantics as [Redis] but
// de-duplicates only within the process. Options.Prefix is unused. Call Close when done.
//
// It holds every completed key for Options.TTL (a day by default): at a steady rate of keyed
// sends, hundreds of thousands of entries or more. So a completed entry is kept in a form that
// costs the garbage collector and the janitor little: its fingerprint and response encoded in
// one byte slice (no header map, no strings of its own to scan), its deadline a duration on the
// store's own monotonic clock, and its key in a queue of deadlines in the order they pass (every
// completed entry lives TTL, every in-flight one Lease: each queue is in deadline order by
// construction), which the janitor pops until it reaches one still to come, instead of walking
// the whole map under the lock.
type Memory struct {
	opt  Options
	base time.Time // the origin of the store's clock (see now)

	mu       sync.Mutex
	inFlight map[string]*memFlight
	done     map[string]memDone
	leases   deadlines // of inFlight's entries, in order
	ttls     deadlines // of done's entries, in order
	closed   bool      // Close was called: no janitor pops the queues, so nothing is queued

	stop     chan struct{}
	stopOnce sync.Once
	exited   chan struct{}
}

var _ Store = (*Memory)(nil)

// memFlight is a key in flight. It is replaced, never mutated.
type memFlight struct {
	fp      string
	owner   string
	expires time.Duration // on the store's clock
	wake    chan struct{} // closed when completed, released or expired
}

// memDone is a completed key: its fingerprint and response as appendRecord encodes them.
type memDone struct {
	expires time.Duration // on the store's clock
	rec     []byte
}

// NewMemory returns an in-process Store and starts its janitor.
func NewMemory(opt Options) *Memory {
	opt = opt.withDefaults()
	s := &Memory{
		opt:      opt,
		base:     time.Now(),
		inFlight: make(map[string]*memFlight),
		done:     make(map[string]memDone),
		stop:     make(chan struct{}),
		exited:   make(chan struct{}),
	}
	go s.janitor(min(max(min(opt.TTL, opt.Lease)/2, time.Second), time.Minute))
	return s
}

// now is the time on the store's clock: monotonic, and a plain number (no pointer for the
// garbage collector in each deadline).
func (s *Memory) now() time.Duration { return time.Since(s.base) }

// later is the deadline d after now on the store's clock, the clock's end if that is further
// (a Lease or TTL meant as "forever" must not wrap around into the past).
func later(now, d time.Duration) time.Duration {
	if d > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + d
}

// Close stops the janitor and waits for it. The store still answers afterwards, but expired
// entries are then only dropped when their key is used again (and no deadlines are queued:
// nothing would pop them).
func (s *Memory) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.exited
	s.mu.Lock()
	s.closed = true
	s.leases, s.ttls = deadlines{}, deadlines{}
	s.mu.Unlock()
	return nil
}

// Begin implements [Store.Begin].
func (s *Memory) Begin(ctx context.Context, key, fp string) (Result, error) {
	deadline := time.Now().Add(s.opt.Wait)
	var (
		timer *time.Timer // fires at the deadline
		final bool        // the deadline passed: this is the last look
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return Result{}, fmt.Errorf("idempotency: waiting for key %q: %w", key, err)
		}
		s.mu.Lock()
		now := s.now()
		if d, ok := s.done[key]; ok && d.expires > now {
			s.mu.Unlock()
			recFP, resp, err := parseRecord(d.rec) // (a record is never changed once stored)
			switch {
			case err != nil:
				return Result{}, fmt.Errorf("%w: key %q: %w", ErrUnavailable, key, err)
			case recFP != fp:
				return Result{Outcome: Mismatch}, nil
			}
			return Result{Outcome: Replay, Response: &resp}, nil
		} else if ok {
			delete(s.done, key)
		}
		e := s.inFlight[key]
		if e != nil && e.expires <= now {
			s.expireLocked(key, e)
			e = nil
		}
		if e == nil {
			token := rand.Text() + tokenSep + fp // (as Redis' tokens: Complete encodes before locking)
			expires := later(now, s.opt.Lease)
			s.inFlight[key] = &memFlight{fp: fp, owner: token, expires: expires, wake: make(chan struct{})}
			if !s.closed {
				s.leases.push(key, expires)
			}
			s.mu.Unlock()
			return Result{Outcome: Acquired, Token: token}, nil
		}
		switch {
		case e.fp != fp:
			s.mu.Unlock()
			return Result{Outcome: Mismatch}, nil
		case final || s.opt.Wait <= 0:
			s.mu.Unlock()
			return Result{Outcome: InProgress}, nil
		}
		wake, left := e.wake, e.expires-now
		s.mu.Unlock()

		// Wake-ups are reliable in-process: wake is closed on Complete, Release and expiry (by
		// whoever notices first; the lease timer makes sure someone does).
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		lease := time.NewTimer(left)
		select {
		case <-wake:
		case <-lease.C:
		case <-timer.C:
			final = true
		case <-ctx.Done():
		}
		lease.Stop()
	}
}

// Complete implements [Store.Complete].
func (s *Memory) Complete(ctx context.Context, key, token string, resp Response) error {
	_, fp, ok := strings.Cut(token, tokenSep)
	if !ok {
		return ErrNotOwner // not a token of Begin
	}
	rec := appendRecord(make([]byte, 0, recordLen(fp, resp)), fp, resp) // outside the lock
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.ownedLocked(key, token) // the owner's token, so fp is its entry's
	if err != nil {
		return err
	}
	delete(s.inFlight, key)
	expires := later(s.now(), s.opt.TTL)
	s.done[key] = memDone{expires: expires, rec: rec}
	if !s.closed {
		s.ttls.push(key, expires)
	}
	close(e.wake)
	return nil
}

// Release implements [Store.Release].
func (s *Memory) Release(ctx context.Context, key, token string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.ownedLocked(key, token)
	if err != nil {
		return err
	}
	delete(s.inFlight, key)
	close(e.wake)
	return nil
}

// ownedLocked returns the in-flight entry of key if token owns it, else ErrNotOwner. s.mu must
// be held.
func (s *Memory) ownedLocked(key, token string) (*memFlight, error) {
	e := s.inFlight[key]
	if e == nil || e.owner != token {
		return nil, ErrNotOwner
	}
	if e.expires <= s.now() {
		s.expireLocked(key, e)
		return nil, ErrNotOwner
	}
	return e, nil
}

// expireLocked drops the expired in-flight entry e of key and wakes its waiters. s.mu must be
// held.
func (s *Memory) expireLocked(key string, e *memFlight) {
	delete(s.inFlight, key)
	close(e.wake)
}

// janitor drops expired entries every interval until Close: those at the head of each queue
// of deadlines, up to the first still to come. A key whose entry was replaced since its
// deadline was queued (completed, released, claimed again) is dropped only if its present
// entry has expired too.
func (s *Memory) janitor(interval time.Duration) {
	defer close(s.exited)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.mu.Lock()
			now := s.now()
			s.leases.popUntil(now, func(key string) {
				if e := s.inFlight[key]; e != nil && e.expires <= now {
					s.expireLocked(key, e)
				}
			})
			s.ttls.popUntil(now, func(key string) {
				if d, ok := s.done[key]; ok && d.expires <= now {
					delete(s.done, key)
				}
			})
			s.mu.Unlock()
		}
	}
}

// deadlines is a queue of keys by deadline. Pushed in deadline order, it pops in that order.
type deadlines struct {
	items []deadline
	head  int // items[:head] are popped
}

type deadline struct {
	key string
	at  time.Duration
}

func (q *deadlines) push(key string, at time.Duration) {
	q.items = append(q.items, deadline{key, at})
}

// popUntil pops every deadline at or before now, calling f with its key, and reuses the popped
// half of its slice once half of it is popped (so a steady queue does not grow).
func (q *deadlines) popUntil(now time.Duration, f func(key string)) {
	for q.head < len(q.items) && q.items[q.head].at <= now {
		f(q.items[q.head].key)
		q.items[q.head] = deadline{} // its key to the garbage collector
		q.head++
	}
	if q.head > 0 && q.head >= len(q.items)/2 {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:]) // the moved items' old slots: their keys to the garbage collector too
		q.items = q.items[:n]
		q.head = 0
	}
}

// appendRecord appends the encoding of a completed key (its fingerprint and response) to b:
// the fingerprint, the status, the headers, each length-prefixed, then the body to the end. A
// header's count of values is written plus one, 0 standing for a nil list (replayed as nil).
func appendRecord(b []byte, fp string, r Response) []byte {
	b = appendBytes(b, fp)
	b = binary.AppendVarint(b, int64(r.Status))
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	for name, values := range r.Header {
		b = appendBytes(b, name)
		if values == nil {
			b = append(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(values))+1)
		for _, v := range values {
			b = appendBytes(b, v)
		}
	}
	return append(b, r.Body...)
}

// recordLen is the length of appendRecord's encoding of fp and r (a record is kept a day: its
// slice is allocated to size, not grown by append).
func recordLen(fp string, r Response) int {
	n := bytesLen(fp) + binary.MaxVarintLen64 + uvarintLen(uint64(len(r.Header))) + len(r.Body)
	for name, values := range r.Header {
		n += bytesLen(name) + uvarintLen(uint64(len(values))+1)
		for _, v := range values {
			n += bytesLen(v)
		}
	}
	return n
}

func bytesLen(s string) int { return uvarintLen(uint64(len(s))) + len(s) }

func uvarintLen(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

func appendBytes(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// errRecord is the error of a record appendRecord did not write (it cannot happen: the records
// never leave the process).
var errRecord = errors.New("idempotency: malformed in-memory record")

// parseRecord decodes what appendRecord encoded into a Response of the caller's own (its
// Header never nil).
func parseRecord(rec []byte) (fp string, r Response, err error) {
	next := func() (string, bool) {
		n, k := binary.Uvarint(rec)
		if k <= 0 || uint64(len(rec)-k) < n {
			return "", false
		}
		s := string(rec[k : k+int(n)])
		rec = rec[k+int(n):]
		return s, true
	}
	count := func() (uint64, bool) {
		n, k := binary.Uvarint(rec)
		if k <= 0 || n > uint64(len(rec)) { // each item takes at least one byte
			return 0, false
		}
		rec = rec[k:]
		return n, true
	}
	fp, ok := next()
	if !ok {
		return "", Response{}, errRecord
	}
	status, k := binary.Varint(rec)
	if k <= 0 {
		return "", Response{}, errRecord
	}
	rec = rec[k:]
	names, ok := count()
	if !ok {
		return "", Response{}, errRecord
	}
	r = Response{Status: int(status), Header: make(http.Header, names)}
	for range names {
		name, ok := next()
		n, ok2 := count()
		if !ok || !ok2 {
			return "", Response{}, errRecord
		}
		if n == 0 {
			r.Header[name] = nil
			continue
		}
		n--
		values := make([]string, 0, n)
		for range n {
			v, ok := next()
			if !ok {
				return "", Response{}, errRecord
			}
			values = append(values, v)
		}
		r.Header[name] = values
	}
	if len(rec) > 0 {
		r.Body = append([]byte(nil), rec...)
	}
	return fp, r, nil
}

// len returns the number of entries, expired or not (tests).
func (s *Memory) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inFlight) + len(s.done)
}
