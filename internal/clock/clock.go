// Package clock is the time the delivery queue decides by: when a delivery, a retry or a
// probe falls due, when a lease ends, which days and held deliveries are past retention. The
// store passes it to the statements that decide on time and the dispatcher to its own
// decisions; tests set and advance a Stub instead of waiting.
//
// A nil Clock is the real time: time.Now in Go, and in SQL the database's own now() (the
// statements take coalesce($n::timestamptz, now()) and Param gives them NULL), so that
// instances whose clocks differ still agree on what is due, as before there was a Clock.
package clock

import (
	"sync"
	"time"
)

// Clock tells the time. Nil is the real time (see the package comment).
type Clock interface {
	Now() time.Time
}

// Now returns c's time, or time.Now() when c is nil.
func Now(c Clock) time.Time {
	if c == nil {
		return time.Now()
	}
	return c.Now()
}

// Param returns c's time as the now argument of a statement: nil (SQL NULL, which the
// statement's coalesce turns into the database's now()) when c is nil.
func Param(c Clock) *time.Time {
	if c == nil {
		return nil
	}
	t := c.Now()
	return &t
}

// Notifier is a Clock that tells when its time jumps (a Stub): a component that sleeps until
// something falls due registers to be woken, since a jump changes what is due without any
// real time passing.
type Notifier interface {
	Clock
	// OnChange registers f to run after every change of the time. f must not block.
	OnChange(f func())
}

// Stub is a Clock that stands still until it is set or advanced (tests). Create it with
// NewStub.
type Stub struct {
	mu    sync.Mutex
	now   time.Time
	hooks []func()
}

// NewStub returns a Stub at t, in UTC and rounded down to the microsecond (Postgres's
// precision: a time read back from the database equals the one written).
func NewStub(t time.Time) *Stub {
	return &Stub{now: t.UTC().Truncate(time.Microsecond)}
}

// Now returns the stub's time.
func (s *Stub) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

// Set moves the stub to t (in UTC, rounded down to the microsecond) and runs the OnChange
// hooks.
func (s *Stub) Set(t time.Time) {
	s.move(func(time.Time) time.Time { return t })
}

// Advance moves the stub d ahead, runs the OnChange hooks and returns the new time.
func (s *Stub) Advance(d time.Duration) time.Time {
	return s.move(func(now time.Time) time.Time { return now.Add(d) })
}

// move sets the time to to(the current time), then runs the hooks.
func (s *Stub) move(to func(time.Time) time.Time) time.Time {
	s.mu.Lock()
	s.now = to(s.now).UTC().Truncate(time.Microsecond)
	now, hooks := s.now, s.hooks
	s.mu.Unlock()
	for _, f := range hooks {
		f()
	}
	return now
}

// OnChange registers f to run after every Set and Advance.
func (s *Stub) OnChange(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks = append(s.hooks[:len(s.hooks):len(s.hooks)], f)
}
