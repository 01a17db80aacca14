package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// waitFor starts s.Begin(key, fp) on a goroutine and waits until it waits for the key's owner
// (registered and having re-read, marking the record); the Result arrives on the channel.
func waitFor(t *testing.T, s *Redis, key, fp string) <-chan Result {
	t.Helper()
	done := make(chan Result, 1)
	go func() {
		res, err := s.Begin(context.Background(), key, fp)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	waitWaiting(t, 1)
	return done
}

// TestRedisPublishOnlyWhenWaited: a completion nobody waits for publishes nothing; a waiting
// duplicate marks the in-flight record (",\"w\":1" added, lease TTL kept, the JSON still the
// record) and the completion then publishes and wakes it (no safety poll).
func TestRedisPublishOnlyWhenWaited(t *testing.T) {
	srv := testenv.StartRedis(t) // its own server: the statistics are this test's
	c := testenv.RedisClient(t, srv.URL())
	a, b := newRedisPair(t, srv.URL(), Options{Wait: 4 * patience, Lease: time.Minute})
	a.poll, b.poll = time.Hour, time.Hour
	ctx := context.Background()
	const fp = "0123abcd"
	publishes := func() int64 { return testenv.CommandStats(t, c)["publish"].Calls }

	r := mustBegin(t, a, "chan-1:alone", fp, Acquired)
	mustBegin(t, b, "chan-1:warm", fp, Acquired) // b's listener starts with its first Begin
	waitSubscribed(t, b)
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.Complete(ctx, "chan-1:alone", r.Token, sampleResponse("alone")); err != nil {
		t.Fatal(err)
	}
	if n := publishes(); n != 0 {
		t.Fatalf("a completion nobody waits for published %d times", n)
	}
	sameResponse(t, mustBegin(t, b, "chan-1:alone", fp, Replay).Response, sampleResponse("alone"))

	r = mustBegin(t, a, "chan-1:waited", fp, Acquired)
	done := waitFor(t, b, "chan-1:waited", fp)
	raw, err := c.Get(ctx, a.opt.Prefix+"chan-1:waited").Result()
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if !strings.HasSuffix(raw, `,"w":1}`) || json.Unmarshal([]byte(raw), &rec) != nil ||
		rec["s"] != "p" || rec["f"] != fp || rec["o"] != ownerOf(t, r.Token) {
		t.Fatalf("in-flight record with a waiter = %s", raw)
	}
	if pttl := c.PTTL(ctx, a.opt.Prefix+"chan-1:waited").Val(); pttl <= 0 || pttl > time.Minute {
		t.Fatalf("PTTL after marking = %v, want the lease's", pttl)
	}
	if err := a.Complete(ctx, "chan-1:waited", r.Token, sampleResponse("waited")); err != nil {
		t.Fatal(err)
	}
	wantWokenReplay(t, done, sampleResponse("waited"))
	if n := publishes(); n != 1 {
		t.Fatalf("%d publishes, want 1 (the waited-for completion)", n)
	}
}

// TestRedisUnusualRecords: a fingerprint that JSON escapes (its record is checked by decoding,
// not by string operations) completes, replays, wakes a waiter and releases like any other; a
// token whose owner part would fool a naive string match owns nothing.
func TestRedisUnusualRecords(t *testing.T) {
	a, b := newRedisPair(t, testenv.Redis(t), Options{Wait: 4 * patience})
	a.poll, b.poll = time.Hour, time.Hour
	ctx := context.Background()
	const fp = `fp "quoted" \ back`

	r := mustBegin(t, a, "chan-1:odd", fp, Acquired)
	mustBegin(t, b, "chan-1:warm", fp, Acquired)
	waitSubscribed(t, b)
	done := waitFor(t, b, "chan-1:odd", fp)
	owner := ownerOf(t, r.Token)
	for _, token := range []string{"", owner + `"}` + tokenSep + fp, `x","o":"` + owner + tokenSep + fp, "not-the-owner",
		owner, "other" + tokenSep + fp} {
		if err := a.Complete(ctx, "chan-1:odd", token, sampleResponse("impostor")); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("Complete with token %q: %v, want ErrNotOwner", token, err)
		}
	}
	if err := a.Complete(ctx, "chan-1:odd", r.Token, sampleResponse("odd")); err != nil {
		t.Fatal(err)
	}
	wantWokenReplay(t, done, sampleResponse("odd"))
	mustBegin(t, b, "chan-1:odd", fp+"x", Mismatch)

	r = mustBegin(t, a, "chan-1:odd-rel", fp, Acquired)
	if err := a.Release(ctx, "chan-1:odd-rel", `x","o":"`+ownerOf(t, r.Token)+tokenSep+fp); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("Release by an impostor: %v, want ErrNotOwner", err)
	}
	if err := a.Release(ctx, "chan-1:odd-rel", r.Token); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, b, "chan-1:odd-rel", fp, Acquired)
}

// TestRedisCompleteKeepsTheKeysFingerprint: Complete checks ownership by the owner part of the
// token only; a token whose fingerprint part was altered (so that the in-flight record it
// rebuilds is not the key's) still completes its own claim, and the key keeps the fingerprint
// it was claimed with: a repeat with it replays, one with the altered fingerprint is a Mismatch.
// The same holds for a record a waiter marked.
func TestRedisCompleteKeepsTheKeysFingerprint(t *testing.T) {
	a, b := newRedisPair(t, testenv.Redis(t), Options{Wait: 4 * patience})
	a.poll, b.poll = time.Hour, time.Hour
	ctx := context.Background()
	const fp = "fp-hex"

	r := mustBegin(t, a, "chan-1:altered", fp, Acquired)
	if err := a.Complete(ctx, "chan-1:altered", ownerOf(t, r.Token)+tokenSep+"other-fp", sampleResponse("own")); err != nil {
		t.Fatal(err)
	}
	sameResponse(t, mustBegin(t, b, "chan-1:altered", fp, Replay).Response, sampleResponse("own"))
	mustBegin(t, b, "chan-1:altered", "other-fp", Mismatch)

	r = mustBegin(t, a, "chan-1:altered-waited", fp, Acquired)
	mustBegin(t, b, "chan-1:warm", fp, Acquired)
	waitSubscribed(t, b)
	done := waitFor(t, b, "chan-1:altered-waited", fp)
	if err := a.Complete(ctx, "chan-1:altered-waited", ownerOf(t, r.Token)+tokenSep+"other-fp", sampleResponse("waited")); err != nil {
		t.Fatal(err)
	}
	wantWokenReplay(t, done, sampleResponse("waited"))
	mustBegin(t, b, "chan-1:altered-waited", "other-fp", Mismatch)
}

// wantWokenReplay waits up to patience for the waiter of done (waitFor) and wants it to replay
// want.
func wantWokenReplay(t *testing.T, done <-chan Result, want Response) {
	t.Helper()
	select {
	case res := <-done:
		if res.Outcome != Replay {
			t.Fatalf("waiter got %v, want Replay", res.Outcome)
		}
		sameResponse(t, res.Response, want)
	case <-time.After(patience):
		t.Fatalf("waiter not woken within %v", patience)
	}
}

// ownerOf is the owner part of a token of Redis.Begin: the record's "o".
func ownerOf(t *testing.T, token string) string {
	t.Helper()
	owner, _, ok := strings.Cut(token, tokenSep)
	if !ok {
		t.Fatalf("token %q has no owner part", token)
	}
	return owner
}
