package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// patience is how long a test waits for something that takes milliseconds on an idle machine:
// a deadline for a failing test. Where a test tells "woken" from "waited out", the Wait it
// would otherwise wait out is a multiple of it.
const patience = 30 * time.Second

// parked counts the Begin calls (of any store of this package) waiting for their key, read
// from the goroutines' stacks: it is how a test knows that its duplicates wait before it
// completes, releases or cancels, instead of sleeping "long enough".
func parked() int {
	return testenv.Parked(func(fn string) bool {
		return strings.HasPrefix(fn, "github.com/wabarelay/wabarelay/idempotency.(*") &&
			(strings.HasSuffix(fn, ").Begin") || strings.HasSuffix(fn, ").begin"))
	})
}

// waiting reports whether n Begin calls are parked within patience (for a key's owner, on a
// goroutine of its own, that waits for its duplicates).
func waiting(n int) bool { return testenv.Within(patience, func() bool { return parked() >= n }) }

// waitWaiting fails the test unless n Begin calls are parked within patience.
func waitWaiting(t *testing.T, n int) {
	t.Helper()
	testenv.Eventually(t, patience, func() bool { return parked() >= n }, "%d Begin calls waiting", n)
}

// newStores returns two Stores that share state: for Redis, two stores on two separate clients
// (two "instances"); for Memory, the same store twice.
type newStores func(t *testing.T, opt Options) (a, b Store)

// runConformance runs the behaviour every Store must have, each case through run: the case
// itself for Redis (whose leases and TTLs run on the server's clock), synctest.Test for Memory
// (its leases, TTLs, waits and the tests' own pauses then take no real time).
func runConformance(t *testing.T, stores newStores, run func(*testing.T, func(*testing.T))) {
	for _, c := range []struct {
		name string
		test func(*testing.T, newStores)
	}{
		{"ConcurrentBeginOneSend", testConcurrentBegin},
		{"Mismatch", testMismatch},
		{"ReleaseHandsOver", testReleaseHandsOver},
		{"WaitLimitAndLease", testWaitLimitAndLease},
		{"LeaseExpiryWhileWaiting", testLeaseExpiryWhileWaiting},
		{"Fencing", testFencing},
		{"TTLExpiry", testTTLExpiry},
		{"ContextCancelWhileWaiting", testContextCancel},
		{"NoWait", testNoWait},
		{"ResponseRoundTrip", testResponseRoundTrip},
	} {
		t.Run(c.name, func(t *testing.T) { run(t, func(t *testing.T) { c.test(t, stores) }) })
	}
}

// sampleResponse is a response as the relay would store it.
func sampleResponse(id string) Response {
	return Response{
		Status: 200,
		Header: http.Header{
			"Content-Type":  {"application/json; charset=UTF-8"},
			"X-Fb-Trace-Id": {"AbC" + id},
		},
		Body: []byte(`{"messaging_product":"whatsapp","contacts":[{"input":"+15551234567","wa_id":"15551234567"}],"messages":[{"id":"wamid.` + id + `"}]}`),
	}
}

func sameResponse(t *testing.T, got *Response, want Response) {
	t.Helper()
	if got == nil {
		t.Fatalf("response is nil, want %d %q", want.Status, want.Body)
	}
	if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || !reflect.DeepEqual(got.Header, want.Header) {
		t.Fatalf("response = %d %v %q, want %d %v %q", got.Status, got.Header, got.Body, want.Status, want.Header, want.Body)
	}
}

func mustBegin(t *testing.T, s Store, key, fp string, want Outcome) Result {
	t.Helper()
	r, err := s.Begin(context.Background(), key, fp)
	if err != nil {
		t.Fatalf("Begin(%q, %q): %v", key, fp, err)
	}
	if r.Outcome != want {
		t.Fatalf("Begin(%q, %q) = %v, want %v", key, fp, r.Outcome, want)
	}
	if (r.Outcome == Acquired) != (r.Token != "") {
		t.Fatalf("Begin(%q, %q) = %v with token %q", key, fp, r.Outcome, r.Token)
	}
	if (r.Outcome == Replay) != (r.Response != nil) {
		t.Fatalf("Begin(%q, %q) = %v with response %v", key, fp, r.Outcome, r.Response)
	}
	return r
}

// race starts n Begin calls of key at once, on stores a and b in turn; the one that acquires
// calls owned, then completes with want. The function it returns waits for all of them and
// checks that exactly one acquired and the others replayed want.
func race(t *testing.T, a, b Store, n int, key, fp string, want Response, owned func()) (wait func()) {
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([]Result, n)
		errs    = make([]error, n)
	)
	for i := range n {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			<-start
			r, err := s.Begin(context.Background(), key, fp)
			results[i], errs[i] = r, err
			if err == nil && r.Outcome == Acquired {
				owned()
				errs[i] = s.Complete(context.Background(), key, r.Token, want)
			}
		})
	}
	close(start)
	return func() {
		t.Helper()
		wg.Wait()
		counts := map[Outcome]int{}
		for i, r := range results {
			if errs[i] != nil {
				t.Fatalf("caller %d: %v", i, errs[i])
			}
			counts[r.Outcome]++
			if r.Outcome == Replay {
				sameResponse(t, r.Response, want)
			}
		}
		if counts[Acquired] != 1 || counts[Replay] != n-1 {
			t.Fatalf("outcomes = %v, want 1 acquired and %d replays", counts, n-1)
		}
	}
}

// testConcurrentBegin: 50 concurrent Begins on one key over two stores; exactly one is Acquired,
// its owner completes once the 49 others wait, and they all replay the identical response, woken
// by the completion (long before their Wait would end).
func testConcurrentBegin(t *testing.T, newStores newStores) {
	const wait = 4 * patience
	a, b := newStores(t, Options{Wait: wait})
	const n = 50
	const key, fp = "chan-1:order-42", "fp-1"
	want := sampleResponse("concurrent")

	t0 := time.Now()
	race(t, a, b, n, key, fp, want, func() {
		if !waiting(n - 1) { // the upstream send, while the duplicates wait
			t.Errorf("the %d duplicates are not all waiting", n-1)
		}
	})()
	total := time.Since(t0)
	t.Logf("%d callers over two stores: 1 send, %d replays, all done in %v", n, n-1, total)
	if total > wait/2 {
		t.Errorf("took %v; waiters must be woken by the completion, not wait out their %v", total, wait)
	}
	// Later repeats replay too, from either store.
	sameResponse(t, mustBegin(t, a, key, fp, Replay).Response, want)
	sameResponse(t, mustBegin(t, b, key, fp, Replay).Response, want)
}

// testMismatch: the same key with another fingerprint is Mismatch at once, in flight and after
// completion.
func testMismatch(t *testing.T, newStores newStores) {
	a, b := newStores(t, Options{Wait: 4 * patience})
	const key = "chan-1:k-mismatch"
	r := mustBegin(t, a, key, "fp-A", Acquired)

	t0 := time.Now()
	mustBegin(t, b, key, "fp-B", Mismatch)
	mustBegin(t, a, key, "fp-B", Mismatch)
	if d := time.Since(t0); d > patience {
		t.Errorf("Mismatch while in flight took %v; it must not wait (Wait %v)", d, 4*patience)
	}

	want := sampleResponse("m")
	if err := a.Complete(context.Background(), key, r.Token, want); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, b, key, "fp-B", Mismatch)
	sameResponse(t, mustBegin(t, b, key, "fp-A", Replay).Response, want)
	// Another key is independent.
	mustBegin(t, b, "chan-2:k-mismatch", "fp-B", Acquired)
}

// testReleaseHandsOver: after Release, exactly one waiter becomes the owner and the others replay
// its response once it completes.
func testReleaseHandsOver(t *testing.T, newStores newStores) {
	a, b := newStores(t, Options{Wait: 4 * patience})
	const key, fp = "chan-1:k-release", "fp"
	first := mustBegin(t, a, key, fp, Acquired)
	want := sampleResponse("second")

	const n = 10
	done := race(t, a, b, n, key, fp, want, func() {
		if !waiting(n - 1) { // the others wait again, now for the new owner
			t.Errorf("the other %d are not waiting for the new owner", n-1)
		}
	})
	waitWaiting(t, n) // all of them wait for the first owner
	if err := a.Release(context.Background(), key, first.Token); err != nil {
		t.Fatal(err)
	}
	done()
	// The released owner can no longer complete or release.
	if err := a.Complete(context.Background(), key, first.Token, sampleResponse("stale")); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("Complete by released owner = %v, want ErrNotOwner", err)
	}
	if err := a.Release(context.Background(), key, first.Token); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("Release by released owner = %v, want ErrNotOwner", err)
	}
	sameResponse(t, mustBegin(t, b, key, fp, Replay).Response, want)

	// Release with nobody waiting frees the key for the next request.
	r := mustBegin(t, b, "chan-1:k-release-2", fp, Acquired)
	if err := b.Release(context.Background(), "chan-1:k-release-2", r.Token); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, a, "chan-1:k-release-2", fp, Acquired)
}

// testWaitLimitAndLease: an owner that never completes makes duplicates answer InProgress after
// Options.Wait; once its lease ends, a new Begin acquires.
func testWaitLimitAndLease(t *testing.T, newStores newStores) {
	// the lease is far beyond the wait: a duplicate slowed down by a loaded machine still
	// answers within the lease
	const wait, lease = 500 * time.Millisecond, 4 * time.Second
	a, b := newStores(t, Options{Wait: wait, Lease: lease})
	const key, fp = "chan-1:k-wait", "fp"
	acquiredAt := time.Now()
	mustBegin(t, a, key, fp, Acquired)

	var wg sync.WaitGroup
	for i := range 6 {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			t0 := time.Now()
			r, err := s.Begin(context.Background(), key, fp)
			d := time.Since(t0)
			if err != nil || r.Outcome != InProgress {
				t.Errorf("duplicate %d: %v %v, want InProgress", i, r.Outcome, err)
			}
			if d < wait || d > wait+2*time.Second {
				t.Errorf("duplicate %d answered InProgress after %v, want after its Wait %v (lease %v)", i, d, wait, lease)
			}
		})
	}
	wg.Wait()

	// The lease ends (by the clock); then a Begin acquires.
	time.Sleep(time.Until(acquiredAt.Add(lease)))
	r := acquireEventually(t, b, key, fp)
	mustBegin(t, a, key, "other-fp", Mismatch) // the new claim carries its fingerprint
	if err := b.Complete(context.Background(), key, r.Token, sampleResponse("after-lease")); err != nil {
		t.Fatal(err)
	}
	sameResponse(t, mustBegin(t, a, key, fp, Replay).Response, sampleResponse("after-lease"))
}

// acquireEventually calls Begin on key until it acquires (the key's lease or TTL is ending):
// until then the answer must be InProgress or Mismatch.
func acquireEventually(t *testing.T, s Store, key, fp string) Result {
	t.Helper()
	var r Result
	testenv.Eventually(t, patience, func() bool {
		var err error
		r, err = s.Begin(context.Background(), key, fp)
		switch {
		case err != nil:
			t.Fatalf("Begin(%q): %v", key, err)
		case r.Outcome != Acquired && r.Outcome != InProgress && r.Outcome != Mismatch:
			t.Fatalf("Begin(%q) = %v while its lease or TTL ends", key, r.Outcome)
		}
		return r.Outcome == Acquired
	}, "Begin(%q) to acquire after the lease or TTL ended", key)
	return r
}

// testLeaseExpiryWhileWaiting: duplicates waiting for a crashed owner take over when its lease
// ends (exactly one of them), within their wait.
func testLeaseExpiryWhileWaiting(t *testing.T, newStores newStores) {
	a, b := newStores(t, Options{Wait: patience, Lease: 500 * time.Millisecond})
	const key, fp = "chan-1:k-crash", "fp"
	mustBegin(t, a, key, fp, Acquired) // this owner "crashes"
	want := sampleResponse("takeover")

	race(t, a, b, 6, key, fp, want, func() { time.Sleep(50 * time.Millisecond) })()
}

// testFencing: once the lease has ended and another request owns the key, the old owner's
// Complete and Release return ErrNotOwner and change nothing.
func testFencing(t *testing.T, newStores newStores) {
	const lease = 300 * time.Millisecond
	a, b := newStores(t, Options{Wait: -1, Lease: lease})
	ctx := context.Background()
	const key, fp = "chan-1:k-fence", "fp"
	old := mustBegin(t, a, key, fp, Acquired)
	time.Sleep(lease) // the lease, set before Begin returned, ends
	cur := acquireEventually(t, b, key, fp)

	if err := a.Complete(ctx, key, old.Token, sampleResponse("old")); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("stale Complete = %v, want ErrNotOwner", err)
	}
	if err := a.Release(ctx, key, old.Token); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("stale Release = %v, want ErrNotOwner", err)
	}
	mustBegin(t, a, key, fp, InProgress) // still owned by cur (Wait -1: no waiting)

	if err := b.Complete(ctx, key, cur.Token, sampleResponse("cur")); err != nil {
		t.Fatal(err)
	}
	sameResponse(t, mustBegin(t, a, key, fp, Replay).Response, sampleResponse("cur"))

	// After completion nobody can overwrite or delete the stored response.
	for _, tok := range []string{cur.Token, old.Token, "bogus"} {
		if err := b.Complete(ctx, key, tok, sampleResponse("again")); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("Complete after completion = %v, want ErrNotOwner", err)
		}
		if err := b.Release(ctx, key, tok); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("Release after completion = %v, want ErrNotOwner", err)
		}
	}
	sameResponse(t, mustBegin(t, b, key, fp, Replay).Response, sampleResponse("cur"))

	// A lease that ended with nobody taking over: Complete is refused too (the key is free).
	k2 := "chan-1:k-fence-2"
	r := mustBegin(t, a, k2, fp, Acquired)
	// The lease was set before Begin returned: once this much time has passed, it has ended
	// whatever the load (only the check below can tell; nobody takes the key over meanwhile).
	time.Sleep(lease + 10*time.Millisecond)
	if err := a.Complete(ctx, k2, r.Token, sampleResponse("late")); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("Complete after lease = %v, want ErrNotOwner", err)
	}
	if err := a.Complete(ctx, "chan-1:never-claimed", "tok", sampleResponse("x")); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("Complete of unknown key = %v, want ErrNotOwner", err)
	}
	mustBegin(t, b, k2, fp, Acquired)
}

// testTTLExpiry: a stored response is forgotten after Options.TTL; the key is then new.
func testTTLExpiry(t *testing.T, newStores newStores) {
	const ttl = 2 * time.Second // the replays below come well within it, even on a loaded machine
	a, b := newStores(t, Options{TTL: ttl})
	const key, fp = "chan-1:k-ttl", "fp"
	r := mustBegin(t, a, key, fp, Acquired)
	if err := a.Complete(context.Background(), key, r.Token, sampleResponse("ttl")); err != nil {
		t.Fatal(err)
	}
	completedAt := time.Now() // the TTL was set before Complete returned
	mustBegin(t, b, key, "other", Mismatch)
	sameResponse(t, mustBegin(t, b, key, fp, Replay).Response, sampleResponse("ttl"))
	time.Sleep(time.Until(completedAt.Add(ttl)))
	acquireEventually(t, b, key, "other")
}

// testContextCancel: a waiting Begin returns ctx's error promptly when ctx ends.
func testContextCancel(t *testing.T, newStores newStores) {
	a, b := newStores(t, Options{Wait: 4 * patience})
	const key, fp = "chan-1:k-ctx", "fp"
	mustBegin(t, a, key, fp, Acquired)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := b.Begin(ctx, key, fp)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Begin with ending ctx = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(t0); d > patience {
		t.Fatalf("Begin returned %v after ctx ended at 200ms (Wait %v)", d, 4*patience)
	}
}

// testNoWait: a negative Wait answers InProgress at once.
func testNoWait(t *testing.T, newStores newStores) {
	a, b := newStores(t, Options{Wait: -1})
	const key, fp = "chan-1:k-nowait", "fp"
	mustBegin(t, a, key, fp, Acquired)
	t0 := time.Now()
	mustBegin(t, b, key, fp, InProgress)
	if d := time.Since(t0); d > DefaultWait/2 {
		t.Fatalf("InProgress took %v with Wait < 0: it waited", d)
	}
}

// testResponseRoundTrip: binary bodies, empty bodies, odd headers and odd fingerprints survive
// storage; replays are copies the caller may change.
func testResponseRoundTrip(t *testing.T, newStores newStores) {
	a, b := newStores(t, Options{})
	ctx := context.Background()
	cases := []struct {
		name, fp string
		resp     Response
		want     Response
	}{
		{"binary", `fp "quoted" \ / é`, Response{Status: 504, Header: http.Header{"X-Odd": {"a\"b", "ünï", ""}}, Body: []byte{0, 0xff, 0xfe, '"', '\\', '\n', 0x80}},
			Response{Status: 504, Header: http.Header{"X-Odd": {"a\"b", "ünï", ""}}, Body: []byte{0, 0xff, 0xfe, '"', '\\', '\n', 0x80}}},
		{"empty", "", Response{Status: 500}, Response{Status: 500, Header: http.Header{}}},
		{"nil values", "fp", Response{Status: 200, Header: http.Header{"Date": nil, "X-Empty": {}, "Content-Type": {"a/b"}}},
			Response{Status: 200, Header: http.Header{"Date": nil, "X-Empty": {}, "Content-Type": {"a/b"}}}},
		{"large", "fp", Response{Status: 200, Body: bytes.Repeat([]byte("0123456789"), 100_000)},
			Response{Status: 200, Header: http.Header{}, Body: bytes.Repeat([]byte("0123456789"), 100_000)}},
	}
	for _, tc := range cases {
		key := "chan-rt:" + tc.name
		r := mustBegin(t, a, key, tc.fp, Acquired)
		if err := a.Complete(ctx, key, r.Token, tc.resp); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := mustBegin(t, b, key, tc.fp, Replay).Response
		if got.Status != tc.want.Status || len(got.Body) != len(tc.want.Body) || !bytes.Equal(got.Body, tc.want.Body) || !reflect.DeepEqual(got.Header, tc.want.Header) {
			t.Fatalf("%s: replay = %d %v %d bytes, want %d %v %d bytes", tc.name, got.Status, got.Header, len(got.Body), tc.want.Status, tc.want.Header, len(tc.want.Body))
		}
		mustBegin(t, b, key, tc.fp+"x", Mismatch)
		// The replay is the caller's own copy.
		got.Header.Set("X-Mutated", "1")
		if len(got.Body) > 0 {
			got.Body[0] ^= 1
		}
		again := mustBegin(t, a, key, tc.fp, Replay).Response
		if !bytes.Equal(again.Body, tc.want.Body) || again.Header.Get("X-Mutated") != "" {
			t.Fatalf("%s: changing a replay changed the stored response", tc.name)
		}
	}
	// Changing the Response after Complete does not change what is stored.
	resp := sampleResponse("mut")
	r := mustBegin(t, a, "chan-rt:mut", "fp", Acquired)
	if err := a.Complete(ctx, "chan-rt:mut", r.Token, resp); err != nil {
		t.Fatal(err)
	}
	resp.Body[0] = 'X'
	resp.Header.Set("Content-Type", "text/plain")
	sameResponse(t, mustBegin(t, b, "chan-rt:mut", "fp", Replay).Response, sampleResponse("mut"))
}

func TestFingerprint(t *testing.T) {
	a := Fingerprint("POST", "/v21.0/123/messages", "", []byte(`{"to":"1"}`))
	if len(a) != 64 {
		t.Fatalf("len = %d", len(a))
	}
	if a != Fingerprint("POST", "/v21.0/123/messages", "", []byte(`{"to":"1"}`)) {
		t.Fatal("not stable")
	}
	// without a query, the fingerprint of earlier versions (records stored before still replay)
	if a != earlierFingerprint("POST", "/v21.0/123/messages", []byte(`{"to":"1"}`)) {
		t.Fatal("an empty query changed the fingerprint")
	}
	for _, other := range []string{
		Fingerprint("POST", "/v21.0/123/messages", "", []byte(`{"to":"2"}`)),
		Fingerprint("POST", "/v21.0/124/messages", "", []byte(`{"to":"1"}`)),
		Fingerprint("PUT", "/v21.0/123/messages", "", []byte(`{"to":"1"}`)),
		Fingerprint("POS", "T/v21.0/123/messages", "", []byte(`{"to":"1"}`)),
		Fingerprint("POST", "/v21.0/123/messages", "to=19999999999", []byte(`{"to":"1"}`)),
		Fingerprint("POST", "/v21.0/123/messages", "x", []byte(`{"to":"1"}`)),
	} {
		if other == a {
			t.Fatal("collision")
		}
	}
}

// earlierFingerprint is Fingerprint as it was before the query counted.
func earlierFingerprint(method, path string, body []byte) string {
	h := sha256.New()
	var n [8]byte
	for _, part := range [][]byte{[]byte(method), []byte(path), body} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestOptionsDefaults(t *testing.T) {
	o := Options{}.withDefaults()
	if o.TTL != 24*time.Hour || o.Lease != 2*time.Minute || o.Wait != 35*time.Second || o.Prefix != "wabarelay:idem:" {
		t.Fatalf("defaults = %+v", o)
	}
	if o := (Options{Wait: -1}).withDefaults(); o.Wait != 0 {
		t.Fatalf("Wait -1 → %v, want 0", o.Wait)
	}
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[Outcome]string{Acquired: "acquired", Replay: "replay", InProgress: "in_progress", Mismatch: "mismatch", 9: "Outcome(9)"} {
		if o.String() != want {
			t.Errorf("%d.String() = %q", int(o), o.String())
		}
	}
}
