package ratelimit

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// benchKeys spreads parallel calls over many keys, like many channels.
var benchKeys = func() []string {
	k := make([]string, 1024)
	for i := range k {
		k[i] = "chan-" + strconv.Itoa(i)
	}
	return k
}()

func benchmarkAllow(b *testing.B, newLimiter func(limit int, window time.Duration) Limiter) {
	for _, bc := range []struct {
		name   string
		limit  int
		window time.Duration
		keys   int
		par    int // goroutines per GOMAXPROCS
	}{
		{"accept", 1 << 30, time.Second, len(benchKeys), 1}, // every call accepted and stored
		{"reject", 100, time.Minute, 1, 1},                  // one hot key, all but 100 rejected
		{"mixed", 100, time.Minute, len(benchKeys), 1},      // product default over many keys
		{"mixed-par8", 100, time.Minute, len(benchKeys), 8}, // same, 8x the concurrent callers
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := newLimiter(bc.limit, bc.window)
			ctx := context.Background()
			var next atomic.Uint64
			b.SetParallelism(bc.par)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1) * 7919)
				for pb.Next() {
					i++
					if _, err := l.Allow(ctx, benchKeys[i%bc.keys]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

func BenchmarkRedisAllow(b *testing.B) {
	c := testenv.RedisClient(b, testenv.Redis(b))
	prefix := uniquePrefix(b, c)
	n := 0
	benchmarkAllow(b, func(limit int, window time.Duration) Limiter {
		n++
		return NewRedis(c, limit, window, prefix+strconv.Itoa(n)+":")
	})
}

func BenchmarkMemoryAllow(b *testing.B) {
	benchmarkAllow(b, func(limit int, window time.Duration) Limiter {
		m := NewMemory(limit, window)
		b.Cleanup(m.Close)
		return m
	})
}
