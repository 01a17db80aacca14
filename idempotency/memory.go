package idempotency

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"time"
)

// Memory is a [Store] for one process: a map of keys with per-key wake-up channels, and a
// janitor goroutine that drops expired entries. It has the same semantics as [Redis] but
// de-duplicates only within the process. Options.Prefix is unused. Call Close when done.
type Memory struct {
	opt Options

	mu sync.Mutex
	m  map[string]*memEntry

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

var _ Store = (*Memory)(nil)

// memEntry is one key. An entry is replaced, never mutated, when its state changes.
type memEntry struct {
	done    bool // completed; else in flight
	fp      string
	owner   string   // in flight only
	resp    Response // completed only; never handed out, only copies
	expires time.Time
	wake    chan struct{} // in flight only: closed when completed, released or expired
}

// NewMemory returns an in-process Store and starts its janitor.
func NewMemory(opt Options) *Memory {
	opt = opt.withDefaults()
	s := &Memory{
		opt:  opt,
		m:    make(map[string]*memEntry),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	go s.janitor(min(max(min(opt.TTL, opt.Lease)/2, time.Second), time.Minute))
	return s
}

// Close stops the janitor and waits for it. The store still answers afterwards, but expired
// entries are then only dropped when their key is used again.
func (s *Memory) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
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
		now := time.Now()
		s.mu.Lock()
		e := s.m[key]
		if e != nil && !now.Before(e.expires) {
			s.expireLocked(key, e)
			e = nil
		}
		if e == nil {
			token := rand.Text()
			s.m[key] = &memEntry{fp: fp, owner: token, expires: now.Add(s.opt.Lease), wake: make(chan struct{})}
			s.mu.Unlock()
			return Result{Outcome: Acquired, Token: token}, nil
		}
		switch {
		case e.fp != fp:
			s.mu.Unlock()
			return Result{Outcome: Mismatch}, nil
		case e.done:
			resp := e.resp.Clone()
			s.mu.Unlock()
			return Result{Outcome: Replay, Response: &resp}, nil
		case final || s.opt.Wait <= 0:
			s.mu.Unlock()
			return Result{Outcome: InProgress}, nil
		}
		wake, expires := e.wake, e.expires
		s.mu.Unlock()

		// Wake-ups are reliable in-process: wake is closed on Complete, Release and expiry (by
		// whoever notices first; the lease timer makes sure someone does).
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		lease := time.NewTimer(time.Until(expires))
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
	stored := resp.Clone()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.ownedLocked(key, token)
	if err != nil {
		return err
	}
	s.m[key] = &memEntry{done: true, fp: e.fp, resp: stored, expires: time.Now().Add(s.opt.TTL)}
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
	delete(s.m, key)
	close(e.wake)
	return nil
}

// ownedLocked returns the in-flight entry of key if token owns it, else ErrNotOwner. s.mu must
// be held.
func (s *Memory) ownedLocked(key, token string) (*memEntry, error) {
	e := s.m[key]
	if e == nil || e.done || e.owner != token {
		return nil, ErrNotOwner
	}
	if !time.Now().Before(e.expires) {
		s.expireLocked(key, e)
		return nil, ErrNotOwner
	}
	return e, nil
}

// expireLocked drops the expired entry e of key and wakes its waiters. s.mu must be held.
func (s *Memory) expireLocked(key string, e *memEntry) {
	delete(s.m, key)
	if !e.done {
		close(e.wake)
	}
}

// janitor drops expired entries every interval until Close.
func (s *Memory) janitor(interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.mu.Lock()
			for k, e := range s.m {
				if !now.Before(e.expires) {
					s.expireLocked(k, e)
				}
			}
			s.mu.Unlock()
		}
	}
}

// len returns the number of entries, expired or not (tests).
func (s *Memory) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
