package relay

import (
	"context"
	"sync"
)

// Pending tracks the relay's work left after a caller got its answer (storing a send's answer
// for replays), so that whoever stops the relay can wait for it instead of cutting it short:
// an interrupted store leaves the send's idempotency key claimed until its lease ends. One
// Pending may serve several relays (every relay handler of a configuration); the zero value is
// ready to use.
type Pending struct {
	mu sync.Mutex
	n  int
	// idle is closed when n drops to zero; nil until a Wait needs it.
	idle chan struct{}
}

func (p *Pending) start() {
	p.mu.Lock()
	p.n++
	p.mu.Unlock()
}

func (p *Pending) finish() {
	p.mu.Lock()
	if p.n--; p.n == 0 && p.idle != nil {
		close(p.idle)
		p.idle = nil
	}
	p.mu.Unlock()
}

// Wait returns once no tracked work is left, or ctx's error when ctx ends first. Work started
// while it waits is waited for too.
func (p *Pending) Wait(ctx context.Context) error {
	p.mu.Lock()
	if p.n == 0 {
		p.mu.Unlock()
		return nil
	}
	if p.idle == nil {
		p.idle = make(chan struct{})
	}
	idle := p.idle
	p.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
