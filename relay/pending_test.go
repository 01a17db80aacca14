package relay

import (
	"context"
	"testing"
	"time"
)

// TestPendingWait: Wait returns at once with no work, waits for work started before and during
// it, and gives up with ctx's error when ctx ends first; a panic of the work is recovered.
func TestPendingWait(t *testing.T) {
	var p Pending
	relay := &Relay{Pending: &p}
	if err := p.Wait(context.Background()); err != nil {
		t.Fatalf("idle: %v", err)
	}

	first, second := make(chan struct{}), make(chan struct{})
	relay.background(func() { <-first })
	waited := make(chan error, 1)
	go func() { waited <- p.Wait(context.Background()) }()
	relay.background(func() { <-second })
	relay.background(func() { panic("boom") })
	close(first)
	for left := 0; left != 1; { // the first and the panicking work have finished
		time.Sleep(time.Millisecond)
		p.mu.Lock()
		left = p.n
		p.mu.Unlock()
	}
	select {
	case err := <-waited:
		t.Fatalf("Wait returned (%v) with work left", err)
	default:
	}
	close(second)
	if err := <-waited; err != nil {
		t.Fatalf("Wait: %v", err)
	}

	block := make(chan struct{})
	defer close(block)
	relay.background(func() { <-block })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Wait(ctx); err != context.Canceled {
		t.Fatalf("Wait with an ended context: %v", err)
	}
}
