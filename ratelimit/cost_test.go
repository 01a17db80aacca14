package ratelimit

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// BenchmarkRedisCost measures what Redis itself spends per decision (INFO commandstats: the
// script's µs per EVALSHA, nested commands included), on a redis-server of its own, under 100
// per minute:
//
//   - spread: calls round-robin over 10,000 keys, as bench/relay spreads them over its channels
//     (each key holds few accepted calls);
//   - busy: round-robin over 200 keys; with -benchtime 20000x each key fills from 0 to 100, all
//     accepted;
//   - full: one key already holding 100, every call refused.
//
// Run with a fixed count, for example -benchtime 20000x. The metric redis-µs/op is the
// server's time per call; ns/op includes the round trip.
func BenchmarkRedisCost(b *testing.B) {
	srv := testenv.StartRedis(b)
	c := testenv.RedisClient(b, srv.URL())
	ctx := context.Background()
	for _, bc := range []struct {
		name    string
		keys    int
		prefill int
	}{
		{"spread", 10000, 0},
		{"busy", 200, 0},
		{"full", 1, 100},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := NewRedis(c, 100, time.Minute, "cost:"+bc.name+":"+strconv.Itoa(b.N)+":")
			keys := make([]string, bc.keys)
			for i := range keys {
				keys[i] = "{" + strconv.Itoa(i) + "}"
			}
			for range bc.prefill {
				if _, err := l.Allow(ctx, keys[0]); err != nil {
					b.Fatal(err)
				}
			}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := l.Allow(ctx, keys[i%len(keys)]); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			s := testenv.CommandStats(b, c)
			b.ReportMetric(s["evalsha"].UsecPerCall(), "redis-µs/op")
			c.FlushDB(ctx)
		})
	}
}
