package idempotency

import (
	"context"
	"testing"
	"time"
)

func newMemoryStores(t *testing.T, opt Options) (Store, Store) {
	s := NewMemory(opt)
	t.Cleanup(func() { s.Close() })
	return s, s
}

func TestMemory(t *testing.T) {
	runConformance(t, newMemoryStores)
}

// TestMemoryJanitor: expired entries are dropped without being used again.
func TestMemoryJanitor(t *testing.T) {
	s := NewMemory(Options{TTL: 200 * time.Millisecond, Lease: 200 * time.Millisecond})
	defer s.Close()
	ctx := context.Background()
	r, err := s.Begin(ctx, "k-done", "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k-done", r.Token, sampleResponse("j")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin(ctx, "k-pending", "fp"); err != nil {
		t.Fatal(err)
	}
	if s.len() != 2 {
		t.Fatalf("len = %d, want 2", s.len())
	}
	deadline := time.Now().Add(3 * time.Second)
	for s.len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("janitor left %d entries", s.len())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, s, "k-done", "fp", Acquired) // still answers after Close
}
