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

// TestGuardFloodSparesInnocents is the distributed flood: 100,000 distinct failing addresses
// (IPv4, /64s of one /48, /64s of many /48s) against a table of the default size. A client that
// never failed is answered normally throughout, an attacker that keeps trying stays refused, the
// table never exceeds its bound, and the flooded /48 is refused as a whole.
func TestGuardFloodSparesInnocents(t *testing.T) {
	g, clock := newGuard(0, 0, 0) // defaults: 20 a minute, 65,536 entries
	const persistent = "198.51.100.77"
	for i := 0; i < DefaultFailures; i++ {
		g.Fail(persistent)
	}
	innocents := []string{"192.0.2.1", "[2001:db8:ffff:1::1]:443", "::ffff:192.0.2.2"}
	for i := 0; i < 100_000; i++ {
		var addr string
		switch i % 4 {
		case 0: // IPv4 10.0.0.0/8
			addr = fmt.Sprintf("10.%d.%d.%d", i>>16&0xff, i>>8&0xff, i&0xff)
		case 1: // /64s of one /48
			addr = fmt.Sprintf("[2001:db8:aaaa:%x::1]:%d", i&0xffff, 1024+i%5000)
		default: // /64s over many /48s (a handful each)
			addr = fmt.Sprintf("2001:db8:%x:%x::%x", 0x1000+i/8, i%8, i)
		}
		g.Fail(addr)
		if n := g.Len(); n > DefaultMaxAddrs {
			t.Fatalf("after %d failures the table holds %d entries, bound %d", i+1, n, DefaultMaxAddrs)
		}
		if (i+1)%1000 == 0 {
			for _, a := range innocents {
				if ra, ok := g.Check(a); !ok {
					t.Fatalf("after %d failures the innocent %s is refused (retry after %v)", i+1, a, ra)
				}
			}
			if _, ok := g.Check(persistent); ok {
				t.Fatalf("after %d failures the persistent attacker is admitted", i+1)
			}
		}
		if i%10_000 == 0 {
			clock.t = clock.t.Add(time.Second) // the flood lasts well under a window
		}
	}
	if _, ok := g.Check("2001:db8:aaaa:ffff::1234"); ok {
		t.Fatal("a new /64 of the flooded /48 is admitted")
	}
	for _, a := range innocents {
		if _, ok := g.Check(a); !ok {
			t.Fatalf("after the flood the innocent %s is refused", a)
		}
	}
	// Once a window passes without failures, the table empties.
	clock.t = clock.t.Add(2 * time.Minute)
	if _, ok := g.Check(persistent); !ok {
		t.Fatal("the attacker is still refused a window after its last attempt")
	}
	if n := g.Len(); n != 0 {
		t.Fatalf("%d entries left a window after the flood", n)
	}
}

func TestGuardRefusesSingleAttacker(t *testing.T) {
	g, _ := newGuard(0, 0, 0)
	for i := 0; i < DefaultFailures; i++ {
		if _, ok := g.Check("203.0.113.9"); !ok {
			t.Fatalf("refused after %d failures", i)
		}
		g.Fail("203.0.113.9")
	}
	if ra, ok := g.Check("203.0.113.9"); ok || ra != DefaultWindow {
		t.Fatalf("after %d failures: ok=%v retryAfter=%v, want refused for the window", DefaultFailures, ok, ra)
	}
}

func TestGuardFoldsFloodedPrefix48(t *testing.T) {
	g, _ := newGuard(0, 0, 0)
	// One failure from each of FoldPrefix48 /64s of a /48 folds it; the /48 then counts as one
	// client, refused after DefaultFailures failures in all.
	for i := 0; i < DefaultFailures; i++ {
		a := fmt.Sprintf("2001:db8:5:%x::1", i)
		if _, ok := g.Check(a); !ok {
			t.Fatalf("refused after %d failures of the /48", i)
		}
		g.Fail(a)
	}
	if n := g.Len(); n != 1 {
		t.Fatalf("the /48 takes %d entries, want 1", n)
	}
	if _, ok := g.Check("2001:db8:5:beef::9"); ok {
		t.Fatal("a /64 of the flooded /48 is admitted")
	}
	if _, ok := g.Check("2001:db8:6::1"); !ok {
		t.Fatal("another /48 is refused")
	}
	// Fewer failing /64s than FoldPrefix48 do not fold: the other /64s of that /48 are fine.
	g2, _ := newGuard(2, time.Minute, 100)
	for i := 0; i < FoldPrefix48-1; i++ {
		a := fmt.Sprintf("2001:db8:7:%x::1", i)
		g2.Fail(a)
		g2.Fail(a)
	}
	if _, ok := g2.Check("2001:db8:7:0::5"); ok {
		t.Fatal("a failing /64 is admitted")
	}
	if _, ok := g2.Check("2001:db8:7:ffff::5"); !ok {
		t.Fatal("a /64 that never failed is refused before its /48 folds")
	}
}

func TestGuardBoundedMemory(t *testing.T) {
	g, clock := newGuard(2, time.Minute, 10)
	g.Fail("192.0.2.200")
	g.Fail("192.0.2.200")
	for i := 0; i < 1000; i++ {
		g.Fail(fmt.Sprintf("10.0.%d.%d", i/250, i%250))
		if n := g.Len(); n > 10 {
			t.Fatalf("table holds %d addresses, bound 10", n)
		}
		if _, ok := g.Check("203.0.113.1"); !ok {
			t.Fatal("an address that never failed is refused")
		}
	}
	// The oldest were forgotten to make room: the early attacker has its attempts back.
	if _, ok := g.Check("192.0.2.200"); !ok {
		t.Fatal("the oldest entry was not evicted")
	}
	// The newest are still counted.
	g.Fail("10.0.3.249")
	if _, ok := g.Check("10.0.3.249"); ok {
		t.Fatal("a recent attacker was forgotten")
	}
	// Once the windows end, the table empties.
	clock.t = clock.t.Add(time.Minute)
	if _, ok := g.Check("10.0.3.249"); !ok {
		t.Fatal("refused after every window ended")
	}
	if n := g.Len(); n != 0 {
		t.Fatalf("%d entries after every window ended", n)
	}
}

// TestGuardAdmitsKnownCredentials: from an address refused for its failures, a credential known
// valid is admitted and an unknown one is not; a known credential that fails again is forgotten
// (and refused from then on), as is one past KnownTTL since its last success.
func TestGuardAdmitsKnownCredentials(t *testing.T) {
	g, clock := newGuard(3, time.Hour, 100)
	const addr = "192.0.2.1"
	g.Valid("key-a")
	g.Valid("key-b")
	for i := 0; i < 3; i++ {
		g.Fail(addr)
	}
	if _, ok := g.Check(addr); ok {
		t.Fatal("the address is not refused after 3 failures")
	}
	for _, c := range []string{"key-a", "key-b"} {
		if _, ok := g.Admit(addr, c); !ok {
			t.Errorf("known valid %q refused", c)
		}
	}
	for _, c := range []string{"garbage", ""} {
		if ra, ok := g.Admit(addr, c); ok || ra <= 0 {
			t.Errorf("unknown %q: ok=%v retryAfter=%v, want refused", c, ok, ra)
		}
	}
	g.Forget("key-a") // it failed (revoked, say)
	if _, ok := g.Admit(addr, "key-a"); ok {
		t.Error("a forgotten credential is admitted")
	}
	clock.t = clock.t.Add(KnownTTL - time.Second)
	g.Valid("key-c")
	clock.t = clock.t.Add(time.Second)
	if g.Known("key-b") || !g.Known("key-c") {
		t.Errorf("after KnownTTL: key-b known %v (want false), key-c known %v (want true)", g.Known("key-b"), g.Known("key-c"))
	}
}

// TestGuardKnownBounded: the known credentials never exceed their bound; past it the least
// recently successful one is forgotten.
func TestGuardKnownBounded(t *testing.T) {
	g, clock := newGuard(1, time.Minute, 100)
	g.maxKnown = 10
	for i := 0; i < 25; i++ {
		clock.t = clock.t.Add(time.Millisecond)
		g.Valid(fmt.Sprint("cred-", i))
		g.Valid("cred-0") // kept fresh
		if n := g.KnownLen(); n > 10 {
			t.Fatalf("%d known credentials, bound 10", n)
		}
	}
	if !g.Known("cred-0") || g.Known("cred-1") || !g.Known("cred-24") {
		t.Errorf("known: cred-0 %v (want true), cred-1 %v (want false), cred-24 %v (want true)",
			g.Known("cred-0"), g.Known("cred-1"), g.Known("cred-24"))
	}
}
