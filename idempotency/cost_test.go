package idempotency

import (
	"context"
	"strconv"
	"testing"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// BenchmarkCompleteCost measures what Redis itself spends per completion (INFO commandstats:
// the completion script's µs per EVALSHA, nested commands included), on a redis-server of its
// own with one pub/sub listener subscribed (an instance), nobody waiting: the relay's common
// case. Each iteration completes a key claimed before the timer started. Run with a fixed
// count, for example -benchtime 20000x.
func BenchmarkCompleteCost(b *testing.B) {
	srv := testenv.StartRedis(b)
	c := testenv.RedisClient(b, srv.URL())
	s := NewRedis(c, Options{Prefix: testPrefix()}, nil)
	b.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	fp := Fingerprint("POST", "/v1/123/messages", "", []byte(`{"to":"15551234567"}`))
	tokens := make([]string, b.N)
	for i := range tokens {
		res, err := s.Begin(ctx, "{ch}:"+strconv.Itoa(i), fp)
		if err != nil || res.Outcome != Acquired {
			b.Fatal(res, err)
		}
		tokens[i] = res.Token
	}
	if !testenv.Within(patience, s.subscribed.Load) {
		b.Fatal("the pub/sub listener did not subscribe")
	}
	resp := sampleResponse("cost")
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.Complete(ctx, "{ch}:"+strconv.Itoa(i), tokens[i], resp); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	st := testenv.CommandStats(b, c)
	b.ReportMetric(st["evalsha"].UsecPerCall(), "redis-µs/op")
	b.ReportMetric(float64(st["publish"].Calls)/float64(b.N), "publish/op")
}
