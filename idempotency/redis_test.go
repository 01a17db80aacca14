package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap/zaptest"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// newTestClient returns a client with short timeouts, so that a dead Redis shows promptly.
func newTestClient(t testing.TB, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 500*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// testPrefix returns a key prefix of its own for a test (the Redis server may be shared).
func testPrefix() string { return "wabarelay:idem:test:" + rand.Text() + ":" }

// newRedisPair returns two stores on two separate clients of the same Redis: two instances.
func newRedisPair(t *testing.T, url string, opt Options) (*Redis, *Redis) {
	t.Helper()
	if opt.Prefix == "" {
		opt.Prefix = testPrefix()
	}
	a := NewRedis(newTestClient(t, url), opt, zaptest.NewLogger(t).Named("a"))
	b := NewRedis(newTestClient(t, url), opt, zaptest.NewLogger(t).Named("b"))
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// waitSubscribed waits until s's pub/sub listener is subscribed.
func waitSubscribed(t *testing.T, s *Redis, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !s.subscribed.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("pub/sub listener not subscribed within %v", within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRedis(t *testing.T) {
	url := testenv.Redis(t)
	runConformance(t, func(t *testing.T, opt Options) (Store, Store) {
		return newRedisPair(t, url, opt)
	})
}

// TestRedisWakeByPubSub: with the safety poll out of the way, a waiter on one instance is woken
// by the other instance's Complete through pub/sub, within milliseconds.
func TestRedisWakeByPubSub(t *testing.T) {
	a, b := newRedisPair(t, testenv.Redis(t), Options{Wait: 10 * time.Second})
	a.poll, b.poll = time.Hour, time.Hour
	const key, fp = "chan-1:k-pubsub", "fp"
	r := mustBegin(t, a, key, fp, Acquired)
	mustBegin(t, b, "chan-1:k-warm", fp, Acquired) // the listener starts with the first Begin
	waitSubscribed(t, b, 5*time.Second)

	done := make(chan Result, 1)
	go func() {
		res, err := b.Begin(context.Background(), key, fp)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	time.Sleep(100 * time.Millisecond)
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
	case <-time.After(2 * time.Second):
		t.Fatal("waiter not woken by pub/sub within 2s")
	}
}

// TestRedisRecord checks what is stored in Redis: the key name, the JSON records, the in-flight
// lease and the completed TTL (PTTL).
func TestRedisRecord(t *testing.T) {
	url := testenv.Redis(t)
	c := newTestClient(t, url)
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
	if pending["s"] != "p" || pending["f"] != fp || pending["o"] != r.Token {
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
	defer b.Close()
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
	a, b := newRedisPair(t, srv.URL(), Options{Wait: 10 * time.Second, Lease: time.Minute})
	ctx := context.Background()
	const fp = "fp"

	// Both listeners up before the outage.
	mustBegin(t, a, "k-warm-a", fp, Acquired)
	owned := mustBegin(t, b, "k-warm-b", fp, Acquired)
	waitSubscribed(t, a, 5*time.Second)
	waitSubscribed(t, b, 5*time.Second)

	// A duplicate waiting when Redis dies.
	waitErr := make(chan error, 1)
	go func() {
		_, err := a.Begin(ctx, "k-warm-b", fp)
		waitErr <- err
	}()
	time.Sleep(100 * time.Millisecond)

	srv.Kill(t)
	killedAt := time.Now()
	const prompt = 3 * time.Second
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
	if a.subscribed.Load() || b.subscribed.Load() {
		// The listener may take a moment to notice; give it one.
		time.Sleep(500 * time.Millisecond)
		if a.subscribed.Load() || b.subscribed.Load() {
			t.Fatal("listener still reports subscribed with Redis down")
		}
	}

	time.Sleep(300 * time.Millisecond) // let the listeners fail a reconnect or two
	srv.Restart(t)
	restartedAt := time.Now()

	// Begin works again with the same stores (the restarted Redis is empty).
	var r Result
	for {
		var err error
		r, err = a.Begin(ctx, "k-after", fp)
		if err == nil {
			break
		}
		if time.Since(restartedAt) > 5*time.Second {
			t.Fatalf("Begin still failing 5s after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.Outcome != Acquired {
		t.Fatalf("Begin after restart = %v", r.Outcome)
	}
	t.Logf("Begin works %v after restart", time.Since(restartedAt))

	// The pub/sub listeners are back: a waiter on b (no safety poll) is woken by a's Complete.
	waitSubscribed(t, b, 10*time.Second)
	waitSubscribed(t, a, 10*time.Second)
	t.Logf("listeners re-subscribed %v after restart", time.Since(restartedAt))
	b.poll = time.Hour // only pub/sub can wake it now; no Begin of b is running
	var wg sync.WaitGroup
	var res Result
	var werr error
	wg.Go(func() { res, werr = b.Begin(ctx, "k-after", fp) })
	time.Sleep(100 * time.Millisecond)
	t0 := time.Now()
	if err := a.Complete(ctx, "k-after", r.Token, sampleResponse("after")); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if werr != nil || res.Outcome != Replay {
		t.Fatalf("waiter after restart: %v %v", res.Outcome, werr)
	}
	// Woken by pub/sub or, failing it, by the 250 ms poll; the margin is for a loaded machine.
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("waiter after restart woken %v after Complete", d)
	}
	sameResponse(t, res.Response, sampleResponse("after"))
}

// TestRedisCloseStopsListener: Close returns with the listener stopped, also when it never
// started or Redis is down.
func TestRedisClose(t *testing.T) {
	url := testenv.Redis(t)
	s := NewRedis(newTestClient(t, url), Options{Prefix: testPrefix()}, nil)
	if err := s.Close(); err != nil { // never started
		t.Fatal(err)
	}
	mustBegin(t, s, "k", "fp", Acquired) // still answers; starts nothing
	if s.subscribed.Load() {
		t.Fatal("listener started after Close")
	}

	s = NewRedis(newTestClient(t, url), Options{Prefix: testPrefix()}, nil)
	mustBegin(t, s, "k", "fp", Acquired)
	waitSubscribed(t, s, 5*time.Second)
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not return")
	}

	// Redis unreachable: the listener is retrying; Close still returns.
	s = NewRedis(newTestClient(t, "redis://127.0.0.1:1/0"), Options{}, nil)
	if _, err := s.Begin(context.Background(), "k", "fp"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Begin on unreachable Redis = %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	done = make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not return")
	}
}

func TestEscapeGlob(t *testing.T) {
	if got := escapeGlob(`a*b?c[d]e\f^g-h:`); got != `a\*b\?c\[d\]e\\f\^g\-h:` {
		t.Fatalf("escapeGlob = %q", got)
	}
}
