package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// testRedisURL is a real Redis for this test: WABARELAY_TEST_REDIS_URL if set,
// else a throwaway redis-server.
func testRedisURL(t testing.TB) string { return testenv.Redis(t) }

// newClient returns a go-redis client for url, closed when the test ends.
func newClient(t testing.TB, url string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("parse redis url: %v", err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis ping %s: %v", url, err)
	}
	return c
}

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
