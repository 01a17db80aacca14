package admission

import (
	"context"
	"crypto/rand"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/ratelimit"
)

// BenchmarkRelayRedisCPU measures the CPU that the Redis side of relay requests costs, as the
// relay makes them: 64 concurrent workers over 10,000 channels, each request a keyed send
// (admission's limit + claim, then the completion of the answer, as the relay stores it) or,
// in the nokey case, the limit alone. It reports, per request, redis-server's CPU (INFO cpu,
// on a server of its own), this process's CPU (the client side: go-redis and the batching;
// getrusage), the completion scripts' and all scripts' µs per call (INFO commandstats) and the
// scripts per read of Redis (INFO stats). Run with a fixed count, for example -benchtime
// 40000x.
func BenchmarkRelayRedisCPU(b *testing.B) {
	for _, keyed := range []bool{true, false} {
		name := "key"
		if !keyed {
			name = "nokey"
		}
		b.Run(name, func(b *testing.B) {
			srv := testenv.StartRedis(b)
			stats := testenv.RedisClient(b, srv.URL())
			client := testenv.RedisClient(b, srv.URL(), func(o *redis.Options) { o.Protocol = 2 })
			prefix := "wabarelay:cost:" + rand.Text() + ":"
			idem := idempotency.NewRedis(client, idempotency.Options{Prefix: prefix}, nil)
			b.Cleanup(func() { _ = idem.Close() })
			adm := NewRedis(client, ratelimit.NewRedis(client, 100, time.Minute, prefix+"rl:"), idem, nil, nil)
			channels := make([]uuid.UUID, 10000)
			for i := range channels {
				channels[i] = uuid.New()
			}
			ctx := context.Background()
			fp := idempotency.Fingerprint("POST", "/v1/1/messages", "", []byte(`{"to":"1"}`))
			resp := idempotency.Response{Status: 200, Body: []byte(`{"messaging_product":"whatsapp","messages":[{"id":"wamid.x"}]}`)}
			// The listener subscribed, the scripts loaded: as a running relay.
			if _, res, err := adm.Claim(ctx, channels[0], "warm", fp); err != nil {
				b.Fatal(err)
			} else if err := adm.Complete(ctx, channels[0], "warm", res.Token, resp); err != nil {
				b.Fatal(err)
			}
			if _, err := adm.Allow(ctx, channels[0]); err != nil {
				b.Fatal(err)
			}
			stats.ConfigResetStat(ctx)
			cpu0, self0 := redisCPU(b, stats), selfCPU()
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						ch := channels[i%int64(len(channels))]
						if !keyed {
							if _, err := adm.Allow(ctx, ch); err != nil {
								b.Error(err)
								return
							}
							continue
						}
						key := "k" + strconv.FormatInt(i, 10)
						d, res, err := adm.Claim(ctx, ch, key, fp)
						if err != nil || !d.Allowed || res.Outcome != idempotency.Acquired {
							b.Error(d, res, err)
							return
						}
						if err := adm.Complete(ctx, ch, key, res.Token, resp); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric((redisCPU(b, stats)-cpu0)/n*1e6, "redis-cpu-µs/op")
			b.ReportMetric((selfCPU()-self0)/n*1e6, "client-cpu-µs/op")
			st := testenv.CommandStats(b, stats)
			b.ReportMetric(st["evalsha"].UsecPerCall(), "evalsha-µs/call")
			info := stats.Info(ctx, "stats").Val()
			if reads := infoInt(info, "total_reads_processed"); reads > 0 {
				b.ReportMetric(float64(st["evalsha"].Calls+st["eval"].Calls)/float64(reads), "scripts/read")
			}
		})
	}
}

// redisCPU is the server's used_cpu_sys + used_cpu_user in seconds.
func redisCPU(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, k := range []string{"used_cpu_sys", "used_cpu_user"} {
		sum += float64(infoInt(strings.ReplaceAll(info, ".", ""), k)) / 1e6
	}
	return sum
}

// infoInt reads an integer field of an INFO reply (redisCPU drops the decimal point of the
// six-decimal CPU seconds to read microseconds).
func infoInt(info, field string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// selfCPU is this process's user + system CPU in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru) // cannot fail for RUSAGE_SELF
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// BenchmarkRedisFloor puts the limit's script beside what any script of its shape costs Redis:
// each case sends b.N calls from 4 connections in pipelines of 16 (as redis-benchmark -c 4
// -P 16) over 10,000 keys to a redis-server of its own, and reports redis-server's CPU per call
// (INFO cpu: command dispatch, replies and socket I/O included) and µs per call inside it (INFO
// commandstats, the case's command):
//
//   - log: the limit's script (ratelimit.SlidingLogLua, 100 per minute);
//   - minimal: a script making only the log's four commands (TIME, GETRANGE, APPEND, PEXPIRE)
//     on the same keys, with none of its decisions;
//   - empty: a script that returns at once (an EVALSHA's own cost);
//   - set: a plain SET, no script.
//
// Run with a fixed count, for example -benchtime 200000x.
func BenchmarkRedisFloor(b *testing.B) {
	limit := ratelimit.SlidingLogLua + `return sliding_log(KEYS[1], ARGV[1], ARGV[2], ARGV[3])`
	for _, bc := range []struct{ name, lua string }{
		{"log", limit},
		{"minimal", `local t = redis.call('TIME')
local s = redis.pcall('GETRANGE', KEYS[1], -808, -1)
redis.call('APPEND', KEYS[1], '01234567')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, 1, 0, 0}`},
		{"empty", `return {1, 1, 0, 0}`},
		{"set", ""},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv := testenv.StartRedis(b)
			stats := testenv.RedisClient(b, srv.URL())
			client := testenv.RedisClient(b, srv.URL(), func(o *redis.Options) { o.PoolSize = 4 })
			ctx := context.Background()
			var sha string
			cmd := "set"
			if bc.lua != "" {
				cmd = "evalsha"
				var err error
				if sha, err = client.ScriptLoad(ctx, bc.lua).Result(); err != nil {
					b.Fatal(err)
				}
			}
			stats.ConfigResetStat(ctx)
			cpu0 := redisCPU(b, stats)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						from := next.Add(16) - 16
						if from >= int64(b.N) {
							return
						}
						p := client.Pipeline()
						for i := from; i < min(from+16, int64(b.N)); i++ {
							key := "floor:{" + strconv.FormatInt(i%10000, 10) + "}"
							if sha == "" {
								p.Set(ctx, key, "1", time.Minute)
							} else {
								p.EvalSha(ctx, sha, []string{key}, 100, 60_000_000, 60_000)
							}
						}
						if _, err := p.Exec(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric((redisCPU(b, stats)-cpu0)/float64(b.N)*1e6, "redis-cpu-µs/op")
			b.ReportMetric(testenv.CommandStats(b, stats)[cmd].UsecPerCall(), cmd+"-µs/call")
		})
	}
}
