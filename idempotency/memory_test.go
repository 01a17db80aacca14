package idempotency

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"net/http"
	"reflect"
	"runtime"
	"strconv"
	"strings"
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

// TestMemoryJanitorKeepsReplacedEntries: the janitor drops a key at its queued deadline only if
// the key's present entry has expired: a key completed again after its first record expired
// (the first deadline still queued) keeps its new record. And its queues of deadlines do not
// grow with the keys that came and went.
func TestMemoryJanitorKeepsReplacedEntries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemory(Options{TTL: 2 * time.Second, Lease: 2 * time.Second})
		defer func() { _ = s.Close() }()
		ctx := context.Background()
		complete := func(key string) { t.Helper(); completeKey(t, s, key) }
		// The janitor runs every second from the start (the bubble's clock: 1 s, 2 s, 3 s ...).
		time.Sleep(500 * time.Millisecond)
		complete("k")                       // due at 2.5 s
		time.Sleep(2200 * time.Millisecond) // 2.7 s: expired, and the janitor has not run since
		complete("k")                       // again: a new record, due at 4.7 s
		time.Sleep(500 * time.Millisecond)  // 3.2 s: the janitor popped the first deadline at 3 s
		synctest.Wait()
		if got := mustBegin(t, s, "k", "fp", Replay).Response; string(got.Body) != string(sampleResponse("k").Body) {
			t.Fatalf("replay after the old deadline: %q", got.Body)
		}

		// Keys that come and go: the queues stay the size of what is live.
		for i := range 1000 {
			complete("k" + strconv.Itoa(i))
			if _, err := s.Begin(ctx, "p"+strconv.Itoa(i), "fp"); err != nil { // in flight, never completed
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		s.mu.Lock()
		queued, held := len(s.ttls.items)-s.ttls.head+len(s.leases.items)-s.leases.head, len(s.inFlight)+len(s.done)
		capacity := cap(s.ttls.items) + cap(s.leases.items)
		s.mu.Unlock()
		if held != 0 || queued != 0 {
			t.Fatalf("after every deadline passed: %d entries, %d deadlines queued", held, queued)
		}
		if capacity > 400 { // 2 s of keys at 10/s each, with room for growth; 2,000 or more if never reused
			t.Fatalf("queues' capacity %d after 2,000 keys of which at most 60 lived at once", capacity)
		}
	})
}

// TestMemoryRecord: a completed key's record decodes to what was stored; a record cut short or
// garbled is an error, never a panic.
func TestMemoryRecord(t *testing.T) {
	resp := Response{Status: 504, Header: http.Header{"X-Odd": {"a\"b", "ünï", ""}, "Content-Type": {"application/json"}},
		Body: []byte{0, 0xff, '"', '\n'}}
	rec := appendRecord(nil, "fp é", resp)
	fp, got, err := parseRecord(rec)
	if err != nil || fp != "fp é" || got.Status != 504 || !reflect.DeepEqual(got.Header, resp.Header) || !bytes.Equal(got.Body, resp.Body) {
		t.Fatalf("round trip: %q %+v %v", fp, got, err)
	}
	// A record without a body: the body ends the record, so every shorter prefix that cuts into
	// the head must fail.
	head := appendRecord(nil, "fp", Response{Status: 200, Header: http.Header{"A": {"b"}}})
	for n := range len(head) {
		if _, _, err := parseRecord(head[:n]); err == nil {
			t.Fatalf("a record cut to %d of %d bytes decoded", n, len(head))
		}
	}
}

// FuzzMemoryRecord: parseRecord never panics, and what it decodes encodes back to the same
// response.
func FuzzMemoryRecord(f *testing.F) {
	f.Add(appendRecord(nil, "fp", sampleResponse("x")))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, rec []byte) {
		fp, r, err := parseRecord(rec)
		if err != nil {
			return
		}
		fp2, r2, err := parseRecord(appendRecord(nil, fp, r))
		if err != nil || fp2 != fp || r2.Status != r.Status || !reflect.DeepEqual(r2.Header, r.Header) || !bytes.Equal(r2.Body, r.Body) {
			t.Fatalf("re-encoded: %q %+v %v, want %q %+v", fp2, r2, err, fp, r)
		}
	})
}

// TestMemoryRecordLen: recordLen is at least the record's length (append never grows the slice
// it sized) and at most a status varint's slack over it.
func TestMemoryRecordLen(t *testing.T) {
	for _, c := range []struct {
		fp string
		r  Response
	}{
		{"", Response{}},
		{"fp", sampleResponse("x")},
		{strings.Repeat("f", 200), Response{Status: -1, Header: http.Header{"A": {strings.Repeat("v", 300), ""}, "B": nil},
			Body: bytes.Repeat([]byte{1}, 70_000)}},
	} {
		n, rec := recordLen(c.fp, c.r), appendRecord(nil, c.fp, c.r)
		if n < len(rec) || n > len(rec)+binary.MaxVarintLen64 {
			t.Errorf("recordLen = %d for a record of %d bytes", n, len(rec))
		}
	}
}

// BenchmarkMemoryHeldKey reports the heap an answered key holds in the in-memory store until
// its TTL passes (a send's answer as the relay stores it, 100,000 keys), and the objects it
// takes: docs/relay.md quotes them.
func BenchmarkMemoryHeldKey(b *testing.B) {
	const keys = 100_000
	ctx := context.Background()
	for b.Loop() {
		s := NewMemory(Options{})
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range keys {
			key := "0123456789abcdef0123456789abcdef:order-" + strconv.Itoa(i)
			r, err := s.Begin(ctx, key, "3a7bd3e2360a3d29eea436fcfb7e44c735d117c42d1c1835420b6b9942dd4f1b")
			if err != nil {
				b.Fatal(err)
			}
			resp := sampleResponse(strconv.Itoa(i))
			resp.Header["X-Fb-Request-Id"] = []string{"BAhHZN-L4PEDEFdxm8wZloK"}
			if err := s.Complete(ctx, key, r.Token, resp); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/keys, "heap-B/key")
		b.ReportMetric(float64(after.HeapObjects-before.HeapObjects)/keys, "objects/key")
		runtime.KeepAlive(s)
		_ = s.Close()
	}
}

// TestMemoryForeverLeaseAndTTL: a Lease or TTL meant as "forever" (the largest Duration) keeps
// its key claimed and its answer replayed: the deadline stops at the clock's end instead of
// wrapping around into the past (which would let a second caller send again).
func TestMemoryForeverLeaseAndTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemory(Options{Lease: math.MaxInt64, TTL: math.MaxInt64, Wait: -1})
		defer func() { _ = s.Close() }()
		time.Sleep(time.Second) // the store's clock is past 0
		r := mustBegin(t, s, "k", "fp", Acquired)
		mustBegin(t, s, "k", "fp", InProgress)
		if err := s.Complete(context.Background(), "k", r.Token, sampleResponse("x")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		mustBegin(t, s, "k", "fp", Replay)
	})
}

// TestMemoryQueuesAfterClose: a closed store still answers, and queues no deadlines (no janitor
// would pop them): keys claimed, completed and released again and again hold nothing.
func TestMemoryQueuesAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemory(Options{Lease: time.Second, TTL: time.Second})
		_ = s.Close()
		ctx := context.Background()
		for i := range 1000 {
			r := mustBegin(t, s, "k", "fp", Acquired)
			if i%2 == 0 {
				_ = s.Release(ctx, "k", r.Token)
				continue
			}
			if err := s.Complete(ctx, "k", r.Token, sampleResponse("x")); err != nil {
				t.Fatal(err)
			}
			mustBegin(t, s, "k", "fp", Replay)
			time.Sleep(2 * time.Second) // expired: the next Begin drops it
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if q := len(s.leases.items) + len(s.ttls.items); q != 0 || len(s.inFlight)+len(s.done) > 1 {
			t.Fatalf("closed store after 1,000 claims of one key: %d deadlines queued, %d entries", q, len(s.inFlight)+len(s.done))
		}
	})
}

// TestMemoryQueuesForgetPoppedKeys: once every deadline has passed, no slot of a queue's array
// still holds a key (a compaction moves the items still to come to the front; the slots they
// left must not keep their keys from the garbage collector).
func TestMemoryQueuesForgetPoppedKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemory(Options{TTL: 2 * time.Second, Lease: 2 * time.Second})
		defer func() { _ = s.Close() }()
		complete := func(key string) { completeKey(t, s, key) }
		time.Sleep(500 * time.Millisecond)
		for i := range 1000 {
			complete("a" + strconv.Itoa(i)) // due at 2.5 s
		}
		time.Sleep(time.Second)
		for i := range 1000 {
			complete("b" + strconv.Itoa(i)) // due at 3.5 s: compacted to the front at 3 s
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, q := range []deadlines{s.ttls, s.leases} {
			for i, d := range q.items[:cap(q.items)] {
				if d.key != "" {
					t.Fatalf("slot %d of a queue still holds %q after every deadline passed", i, d.key)
				}
			}
		}
	})
}

// completeKey claims key with fingerprint "fp" and completes it with sampleResponse(key).
func completeKey(t *testing.T, s Store, key string) {
	t.Helper()
	r := mustBegin(t, s, key, "fp", Acquired)
	if err := s.Complete(context.Background(), key, r.Token, sampleResponse(key)); err != nil {
		t.Fatal(err)
	}
}
