package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
)

// uniquePrefix returns a Redis key prefix no other test run uses, and deletes
// the keys under it when the test ends.
func uniquePrefix(t testing.TB, c redis.UniversalClient) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	p := "ratelimit-test:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, p+"*", 100).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	return p
}

// logEntries returns the number of entries of the log at Redis key (0 when there is no such
// key), checking that the string is the mark and whole entries in ascending order (see
// SlidingLogLua).
func logEntries(t testing.TB, c redis.UniversalClient, key string) int {
	t.Helper()
	v, err := c.Get(context.Background(), key).Bytes()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatalf("reading log %s: %v", key, err)
	}
	if len(v) < 8 || string(v[:8]) != logMark || len(v)%8 != 0 {
		t.Fatalf("log %s: %d bytes %q..., not the mark and whole entries", key, len(v), v[:min(len(v), 8)])
	}
	for i := 16; i+8 <= len(v); i += 8 {
		if binary.BigEndian.Uint64(v[i:]) < binary.BigEndian.Uint64(v[i-8:]) {
			t.Fatalf("log %s: entry %d before entry %d", key, i/8, i/8-1)
		}
	}
	return len(v)/8 - 1
}
