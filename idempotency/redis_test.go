package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// testPrefix returns a key prefix of its own for a test (the Redis server may be shared).
func testPrefix() string { return "wabarelay:idem:test:" + rand.Text() + ":" }

// newRedisPair returns two stores on two separate clients of the same Redis: two instances.
func newRedisPair(t *testing.T, url string, opt Options) (*Redis, *Redis) {
	t.Helper()
	if opt.Prefix == "" {
		opt.Prefix = testPrefix()
	}
	a := NewRedis(testenv.RedisClient(t, url, testenv.ShortTimeouts), opt, zaptest.NewLogger(t).Named("a"))
	b := NewRedis(testenv.RedisClient(t, url, testenv.ShortTimeouts), opt, zaptest.NewLogger(t).Named("b"))
	t.Cleanup(func() { _, _ = a.Close(), b.Close() })
	return a, b
}

// dialFailures is a go-redis hook that counts a client's failed dials.
type dialFailures struct{ n *atomic.Int64 }

func (h dialFailures) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			h.n.Add(1)
		}
		return c, err
	}
}
func (h dialFailures) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h dialFailures) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// waitSubscribed waits until s's pub/sub listener is subscribed.
func waitSubscribed(t *testing.T, s *Redis) {
	t.Helper()
	testenv.Eventually(t, patience, s.subscribed.Load, "the pub/sub listener to subscribe")
}

func TestRedis(t *testing.T) {
	url := testenv.Redis(t)
	runConformance(t, func(t *testing.T, opt Options) (Store, Store) {
		return newRedisPair(t, url, opt)
	}, func(t *testing.T, test func(*testing.T)) { test(t) })
}

// TestRedisWakeByPubSub: with the safety poll out of the way, a waiter on one instance is woken
// by the other instance's Complete through pub/sub (in milliseconds; the test allows patience,
// a fraction of the Wait that would otherwise end the waiting).
func TestRedisWakeByPubSub(t *testing.T) {
	a, b := newRedisPair(t, testenv.Redis(t), Options{Wait: 4 * patience})
	a.poll, b.poll = time.Hour, time.Hour
	const key, fp = "chan-1:k-pubsub", "fp"
	r := mustBegin(t, a, key, fp, Acquired)
	mustBegin(t, b, "chan-1:k-warm", fp, Acquired) // the listener starts with the first Begin
	waitSubscribed(t, b)

	done := make(chan Result, 1)
	go func() {
		res, err := b.Begin(context.Background(), key, fp)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	waitWaiting(t, 1)
	t0 := time.Now()
	if err := a.Complete(context.Background(), key, r.Token, sampleResponse("ps")); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res.Outcome != Replay {
			t.Fatalf("waiter got %v, want Replay", res.Outcome)
		}
		t.Logf("waiter woken %v after Complete", time.Since(t0))
	case <-time.After(patience):
		t.Fatalf("waiter not woken by pub/sub within %v", patience)
	}
}

// TestRedisRecord checks what is stored in Redis: the key name, the JSON records, the in-flight
// lease and the completed TTL (PTTL).
func TestRedisRecord(t *testing.T) {
	url := testenv.Redis(t)
	c := testenv.RedisClient(t, url, testenv.ShortTimeouts)
	prefix := testPrefix()
	a, _ := newRedisPair(t, url, Options{Prefix: prefix, Lease: 90 * time.Second})
	ctx := context.Background()
	const key, fp = "chan-1:k-record", "fp-hex"

	r := mustBegin(t, a, key, fp, Acquired)
	var pending map[string]any
	raw, err := c.Get(ctx, prefix+key).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &pending); err != nil {
		t.Fatal(err)
	}
	if pending["s"] != "p" || pending["f"] != fp || pending["o"] != ownerOf(t, r.Token) {
		t.Fatalf("in-flight record = %s", raw)
	}
	if pttl := c.PTTL(ctx, prefix+key).Val(); pttl > 90*time.Second || pttl < 85*time.Second {
		t.Fatalf("in-flight PTTL = %v, want the lease 90s", pttl)
	}

	if err := a.Complete(ctx, key, r.Token, sampleResponse("rec")); err != nil {
		t.Fatal(err)
	}
	raw, err = c.Get(ctx, prefix+key).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	var got record
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("completed record %s: %v", raw, err)
	}
	want := sampleResponse("rec")
	if got.State != "d" || got.FP != fp || got.Owner != "" || got.Status != want.Status || string(got.Body) != string(want.Body) {
		t.Fatalf("completed record = %s", raw)
	}
	t.Logf("completed record: %s", raw)
	if pttl := c.PTTL(ctx, prefix+key).Val(); pttl > 24*time.Hour || pttl < 24*time.Hour-10*time.Second {
		t.Fatalf("completed PTTL = %v, want Options.TTL = 24h", pttl)
	}

	// A custom TTL.
	b := NewRedis(c, Options{Prefix: prefix, TTL: 90 * time.Minute}, nil)
	defer func() { _ = b.Close() }()
	r = mustBegin(t, b, "chan-1:k-ttl2", fp, Acquired)
	if err := b.Complete(ctx, "chan-1:k-ttl2", r.Token, want); err != nil {
		t.Fatal(err)
	}
	if pttl := c.PTTL(ctx, prefix+"chan-1:k-ttl2").Val(); pttl > 90*time.Minute || pttl < 90*time.Minute-10*time.Second {
		t.Fatalf("completed PTTL = %v, want 90m", pttl)
	}

	// Release deletes the key.
	r = mustBegin(t, b, "chan-1:k-rel", fp, Acquired)
	if err := b.Release(ctx, "chan-1:k-rel", r.Token); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, prefix+"chan-1:k-rel").Val(); n != 0 {
		t.Fatal("released key still exists")
	}

	// An unreadable record is an error, not a guess.
	c.Set(ctx, prefix+"chan-1:k-bad", "not json", time.Minute)
	if _, err := b.Begin(ctx, "chan-1:k-bad", fp); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Begin on unreadable record = %v, want ErrUnavailable", err)
	}
}

// TestRedisKillRestart: with Redis down, Begin, Complete, Release and waiting Begins fail
// promptly with ErrUnavailable; after Redis is back, the same stores work again and the pub/sub
// listener has recovered.
func TestRedisKillRestart(t *testing.T) {
	srv := testenv.StartRedis(t)
	// Two instances whose clients count their failed dials. Wait is far beyond every "promptly"
	// below, so that failing promptly and waiting it out cannot be confused.
	opt := Options{Wait: 4 * patience, Lease: 10 * patience, Prefix: testPrefix()}
	var failed [2]atomic.Int64
	var stores [2]*Redis
	for i, name := range []string{"a", "b"} {
		c := testenv.RedisClient(t, srv.URL(), testenv.ShortTimeouts)
		c.AddHook(dialFailures{&failed[i]})
		stores[i] = NewRedis(c, opt, zaptest.NewLogger(t).Named(name))
	}
	a, b := stores[0], stores[1]
	t.Cleanup(func() { _, _ = a.Close(), b.Close() })
	ctx := context.Background()
	const fp = "fp"

	// Both listeners up before the outage.
	mustBegin(t, a, "k-warm-a", fp, Acquired)
	owned := mustBegin(t, b, "k-warm-b", fp, Acquired)
	waitSubscribed(t, a)
	waitSubscribed(t, b)

	// A duplicate waiting when Redis dies.
	waitErr := make(chan error, 1)
	go func() {
		_, err := a.Begin(ctx, "k-warm-b", fp)
		waitErr <- err
	}()
	waitWaiting(t, 1)

	srv.Kill(t)
	killedAt := time.Now()
	const prompt = patience
	select {
	case err := <-waitErr:
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("waiting Begin = %v, want ErrUnavailable", err)
		}
		t.Logf("waiting Begin failed %v after the kill: %v", time.Since(killedAt), err)
	case <-time.After(prompt):
		t.Fatalf("waiting Begin still waiting %v after the kill", prompt)
	}

	check := func(op string, f func() error) {
		t.Helper()
		t0 := time.Now()
		err := f()
		d := time.Since(t0)
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s with Redis down = %v, want ErrUnavailable", op, err)
		}
		if d > prompt {
			t.Fatalf("%s with Redis down took %v", op, d)
		}
		t.Logf("%s with Redis down: %v after %v", op, err, d)
	}
	check("Begin", func() error { _, err := a.Begin(ctx, "k-down", fp); return err })
	check("Complete", func() error { return b.Complete(ctx, "k-warm-b", owned.Token, sampleResponse("x")) })
	check("Release", func() error { return b.Release(ctx, "k-warm-b", owned.Token) })
	testenv.Eventually(t, patience, func() bool { return !a.subscribed.Load() && !b.subscribed.Load() },
		"the listeners to report unsubscribed with Redis down")

	// Each listener fails to reconnect twice (nothing else dials now) before Redis is back.
	base := [2]int64{failed[0].Load(), failed[1].Load()}
	testenv.Eventually(t, patience, func() bool { return failed[0].Load() >= base[0]+2 && failed[1].Load() >= base[1]+2 },
		"the listeners to try to reconnect twice each")
	srv.Restart(t)
	restartedAt := time.Now()

	// Begin works again with the same stores (the restarted Redis is empty).
	var r Result
	testenv.Eventually(t, patience, func() bool {
		var err error
		r, err = a.Begin(ctx, "k-after", fp)
		return err == nil
	}, "Begin to work after the restart")
	if r.Outcome != Acquired {
		t.Fatalf("Begin after restart = %v", r.Outcome)
	}
	t.Logf("Begin works %v after restart", time.Since(restartedAt))

	// The pub/sub listeners are back: a waiter on b (no safety poll) is woken by a's Complete.
	waitSubscribed(t, b)
	waitSubscribed(t, a)
	t.Logf("listeners re-subscribed %v after restart", time.Since(restartedAt))
	b.poll = time.Hour // only pub/sub can wake it now; no Begin of b is running
	var wg sync.WaitGroup
	var res Result
	var werr error
	wg.Go(func() { res, werr = b.Begin(ctx, "k-after", fp) })
	waitWaiting(t, 1)
	t0 := time.Now()
	if err := a.Complete(ctx, "k-after", r.Token, sampleResponse("after")); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if werr != nil || res.Outcome != Replay {
		t.Fatalf("waiter after restart: %v %v", res.Outcome, werr)
	}
	// Without pub/sub, the waiter would have waited out its Wait (4 × patience).
	if d := time.Since(t0); d > patience {
		t.Fatalf("waiter after restart woken %v after Complete: pub/sub did not recover", d)
	}
	sameResponse(t, res.Response, sampleResponse("after"))
}

// TestRedisCloseStopsListener: Close returns with the listener stopped, also when it never
// started or Redis is down.
func TestRedisClose(t *testing.T) {
	url := testenv.Redis(t)
	s := NewRedis(testenv.RedisClient(t, url, testenv.ShortTimeouts), Options{Prefix: testPrefix()}, nil)
	if err := s.Close(); err != nil { // never started
		t.Fatal(err)
	}
	mustBegin(t, s, "k", "fp", Acquired) // still answers; starts nothing
	if s.subscribed.Load() {
		t.Fatal("listener started after Close")
	}

	s = NewRedis(testenv.RedisClient(t, url, testenv.ShortTimeouts), Options{Prefix: testPrefix()}, nil)
	mustBegin(t, s, "k", "fp", Acquired)
	waitSubscribed(t, s)
	done := make(chan struct{})
	go func() { _ = s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(patience):
		t.Fatal("Close did not return")
	}

	// Redis unreachable: the listener is retrying; Close still returns.
	core, logs := observer.New(zapcore.WarnLevel)
	s = NewRedis(testenv.RedisClient(t, "redis://127.0.0.1:1/0", testenv.ShortTimeouts), Options{}, zap.New(core))
	if _, err := s.Begin(context.Background(), "k", "fp"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Begin on unreachable Redis = %v", err)
	}
	testenv.Eventually(t, patience, func() bool { return logs.FilterMessageSnippet("pub/sub connection to Redis lost").Len() > 0 },
		"the listener to report its failed connection")
	done = make(chan struct{})
	go func() { _ = s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(patience):
		t.Fatal("Close did not return")
	}
}

func TestEscapeGlob(t *testing.T) {
	if got := escapeGlob(`a*b?c[d]e\f^g-h:`); got != `a\*b\?c\[d\]e\\f\^g\-h:` {
		t.Fatalf("escapeGlob = %q", got)
	}
}

// TestPendingRecordIsJSON: the in-flight record Begin writes (and Complete rebuilds) is exactly
// encoding/json's encoding of the record, whatever the fingerprint holds.
func TestPendingRecordIsJSON(t *testing.T) {
	for _, fp := range []string{"", "0123abcd", `fp "quoted" \ back`, "<a&b>", "tab\there", "é ü", "\u2028", "\xff"} {
		want, err := json.Marshal(record{State: statePending, FP: fp, Owner: "OWNER234567"})
		if err != nil {
			t.Fatal(err)
		}
		if got := pendingRecord(fp, "OWNER234567"); got != string(want) {
			t.Errorf("pendingRecord(%q) = %s, want %s", fp, got, want)
		}
	}
}
