package authguard

import (
	"fmt"
	"testing"
	"time"
)

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newGuard(failures int, window time.Duration, maxAddrs int) (*Guard, *fakeClock) {
	g := New(failures, window, maxAddrs)
	c := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	g.now = c.now
	return g, c
}

func TestGuardBlocksAfterFailuresUntilWindowEnds(t *testing.T) {
	g, clock := newGuard(3, time.Minute, 100)
	for i := 0; i < 3; i++ {
		if _, ok := g.Check("192.0.2.1"); !ok {
			t.Fatalf("refused after %d failures", i)
		}
		g.Fail("192.0.2.1")
	}
	ra, ok := g.Check("192.0.2.1")
	if ok || ra != time.Minute {
		t.Fatalf("after 3 failures: ok=%v retryAfter=%v, want refused for 1m", ok, ra)
	}
	if _, ok := g.Check("192.0.2.2"); !ok {
		t.Fatal("another address is refused")
	}
	clock.t = clock.t.Add(59*time.Second + 500*time.Millisecond)
	if ra, ok := g.Check("192.0.2.1"); ok || ra != time.Second {
		t.Fatalf("half a second before the end: ok=%v retryAfter=%v, want refused, at least 1s", ok, ra)
	}
	clock.t = clock.t.Add(time.Second)
	if _, ok := g.Check("192.0.2.1"); !ok {
		t.Fatal("still refused after the window ended")
	}
	g.Fail("192.0.2.1") // a new window starts with one failure
	if _, ok := g.Check("192.0.2.1"); !ok {
		t.Fatal("one failure in a new window refuses")
	}
}

func TestGuardGroupsAddresses(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{"2001:db8:1:2::1", "2001:db8:1:2:ffff::9"}, // same /64
		{"192.0.2.7:5555", "192.0.2.7"},             // port ignored
		{"[2001:db8::1]:443", "2001:db8::2"},        // port ignored, same /64
		{"::ffff:192.0.2.9", "192.0.2.9"},           // v4-mapped
	} {
		g, _ := newGuard(1, time.Minute, 100)
		g.Fail(c.a)
		if _, ok := g.Check(c.b); ok {
			t.Errorf("%s and %s are not grouped", c.a, c.b)
		}
	}
	g, _ := newGuard(1, time.Minute, 100)
	g.Fail("2001:db8:1:2::1")
	if _, ok := g.Check("2001:db8:1:3::1"); !ok {
		t.Error("another /64 is refused")
	}
}

func TestGuardBoundedMemory(t *testing.T) {
	g, clock := newGuard(2, time.Minute, 10)
	for i := 0; i < 1000; i++ {
		g.Fail(fmt.Sprintf("10.0.%d.%d", i/250, i%250))
	}
	if n := len(g.addrs); n > 11 { // 10 addresses + the overflow bucket
		t.Fatalf("table holds %d addresses, bound 10 (+1 overflow)", n)
	}
	// the flood of new addresses is limited as a whole
	if _, ok := g.Check("203.0.113.1"); ok {
		t.Fatal("a new address is admitted while the overflow bucket is over its limit")
	}
	// once the windows end, the table frees up
	clock.t = clock.t.Add(time.Minute)
	if _, ok := g.Check("203.0.113.1"); !ok {
		t.Fatal("refused after every window ended")
	}
	g.Fail("203.0.113.1")
	if _, ok := g.addrs["203.0.113.1"]; !ok {
		t.Fatal("expired buckets were not swept for a new address")
	}
}
