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

// ringEntries returns the number of entries of the ring at Redis key (its slot count, from the
// header; 0 when there is no such key), checking that the string is exactly the header and
// those slots (see SlidingLogLua).
func ringEntries(t testing.TB, c redis.UniversalClient, key string) int {
	t.Helper()
	v, err := c.Get(context.Background(), key).Bytes()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatalf("reading ring %s: %v", key, err)
	}
	if len(v) < 16 {
		t.Fatalf("ring %s: %d bytes, shorter than its header", key, len(v))
	}
	n := int(binary.BigEndian.Uint32(v[4:8]))
	if len(v) != 16+8*n {
		t.Fatalf("ring %s: %d bytes for %d slots", key, len(v), n)
	}
	return n
}
