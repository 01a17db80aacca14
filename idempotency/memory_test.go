package idempotency

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

func newMemoryStores(t *testing.T, opt Options) (Store, Store) {
	s := NewMemory(opt)
	t.Cleanup(func() { _ = s.Close() })
	return s, s
}

// TestMemory runs the conformance cases in synctest bubbles: the store's clock, timers and
// janitor are the bubble's.
func TestMemory(t *testing.T) {
	runConformance(t, newMemoryStores, synctest.Test)
}

// TestMemoryJanitor: expired entries are dropped without being used again.
func TestMemoryJanitor(t *testing.T) {
	synctest.Test(t, testMemoryJanitor)
}

func testMemoryJanitor(t *testing.T) {
	s := NewMemory(Options{TTL: 200 * time.Millisecond, Lease: 200 * time.Millisecond})
	defer func() { _ = s.Close() }()
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
	// The janitor sweeps every second (its shortest interval): by then both have expired.
	time.Sleep(time.Second)
	synctest.Wait()
	if s.len() != 0 {
		t.Fatalf("janitor left %d entries", s.len())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, s, "k-done", "fp", Acquired) // still answers after Close
}
