package store_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// BenchmarkWriteRelayLog measures one batch of the relay log's writer (1,000 calls, the
// default batch) on one connection: the Go side (ns, allocations) and the Postgres backend's
// CPU per call (pg-µs/call, from /proc: Postgres must run on this machine) and this process's
// (go-µs/call). Variants: calls
// without a wamid (relay_log only: refusals, errors) and sends with one (relay_log and the
// messages upsert). Run: go test -run '^$' -bench WriteRelayLog -benchmem ./store
func BenchmarkWriteRelayLog(b *testing.B) {
	const batch = 1000
	for _, withWAMID := range []bool{false, true} {
		name := "no-wamid"
		if withWAMID {
			name = "wamid"
		}
		b.Run(name, func(b *testing.B) {
			f := testenv.NewStore(b, &testenv.StoreOpts{Pool: func(c *pgxpool.Config) { c.MaxConns = 1 }})
			ctx := context.Background()
			var pid int
			if err := f.Pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				b.Fatal(err)
			}
			orgs, channels := make([]uuid.UUID, 100), make([]uuid.UUID, 100)
			for i := range orgs {
				orgs[i], channels[i] = uuid.New(), uuid.New()
			}
			calls := make([]store.RelayCall, batch)
			seq := 0
			fill := func() {
				now := time.Now()
				for i := range calls {
					seq++
					c := store.RelayCall{At: now, OrgID: orgs[seq%100], ChannelID: channels[seq%100], Status: 200, Outcome: "ok",
						Latency: 1500 * time.Microsecond, IdempotencyKey: "key-" + strconv.Itoa(seq), Recipient: "1555" + strconv.Itoa(1000000+seq)}
					if withWAMID {
						c.WAMID = "wamid.HBgLMTU1NTEyMzQ1NjcVAgARGBI" + strconv.Itoa(100000000+seq)
					} else {
						c.Status, c.Outcome, c.ErrorCode = 400, "upstream_4xx", 131047
					}
					calls[i] = c
				}
			}
			fill()
			if err := f.Store.WriteRelayLog(ctx, calls); err != nil { // warm: partitions, plans
				b.Fatal(err)
			}
			cpu0 := procCPU(b, pid)
			var self time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				fill()
				b.StartTimer()
				self0 := selfCPU()
				if err := f.Store.WriteRelayLog(ctx, calls); err != nil {
					b.Fatal(err)
				}
				self += selfCPU() - self0
			}
			b.StopTimer()
			b.ReportMetric(float64((procCPU(b, pid)-cpu0).Microseconds())/float64(b.N*batch), "pg-µs/call")
			b.ReportMetric(float64(self.Microseconds())/float64(b.N*batch), "go-µs/call")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/call")
		})
	}
}

// selfCPU is this process's user and system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is the user and system CPU time of process pid so far (Linux).
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Skipf("backend CPU: %v (Postgres not on this machine?)", err)
	}
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * (time.Second / 100) // USER_HZ
}
