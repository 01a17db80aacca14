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

	"github.com/wabarelay/wabarelay/inbound"
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
			f, pid := oneConnStore(b)
			ctx := context.Background()
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
				self0 := selfCPU(b)
				if err := f.Store.WriteRelayLog(ctx, calls); err != nil {
					b.Fatal(err)
				}
				self += selfCPU(b) - self0
			}
			b.StopTimer()
			b.ReportMetric(float64((procCPU(b, pid)-cpu0).Microseconds())/float64(b.N*batch), "pg-µs/call")
			b.ReportMetric(float64(self.Microseconds())/float64(b.N*batch), "go-µs/call")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/call")
		})
	}
}

// selfCPU is this process's user and system CPU time so far.
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// oneConnStore is a throwaway store on a pool of one connection, and that connection's backend
// pid (procCPU's: its CPU is the statements' of the benchmark).
func oneConnStore(b *testing.B) (f *testenv.Fixture, pid int) {
	f = testenv.NewStore(b, &testenv.StoreOpts{Pool: func(c *pgxpool.Config) { c.MaxConns = 1 }})
	if err := f.Pool.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	return f, pid
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

// BenchmarkFirstStatus measures what a message's first status costs the intake's transaction: a
// post of 10 "sent" statuses of new messages through StoreEvents (no webhook: no deliveries), on
// one connection; Postgres backend CPU per status (pg-µs/status). Variants: the sends' relay log
// rows already written (the usual order: the first status finds its call's time) and not (the
// status came first: the row is made waiting, relay_pending). Run:
// go test -run '^$' -bench FirstStatus ./store
func BenchmarkFirstStatus(b *testing.B) {
	const perPost = 10
	for _, logged := range []bool{true, false} {
		name := "call-logged"
		if !logged {
			name = "status-first"
		}
		b.Run(name, func(b *testing.B) {
			f, pid := oneConnStore(b)
			ctx := context.Background()
			org := f.Org(b).ID
			conn := f.Connection()
			ch := f.Channel(b, org, &testenv.ChannelOpts{Connection: conn})
			wamid := func(n int) string { return "wamid.HBgLMTU1NTEyMzQ1NjcVAgARGBI" + strconv.Itoa(100000000+n) }
			// log writes the relay calls of the messages from..to-1 (before the timed posts).
			log := func(from, to int) {
				if !logged {
					return
				}
				calls := make([]store.RelayCall, 0, 1000)
				for n := from; n < to; n++ {
					calls = append(calls, store.RelayCall{At: time.Now(), OrgID: org, ChannelID: ch.ID, Status: 200, Outcome: "ok", WAMID: wamid(n)})
					if len(calls) == cap(calls) || n == to-1 {
						if err := f.Store.WriteRelayLog(ctx, calls); err != nil {
							b.Fatal(err)
						}
						calls = calls[:0]
					}
				}
			}
			seq := 0
			post := func() {
				now := time.Now()
				var statuses []string
				for range perPost {
					statuses = append(statuses, fmt.Sprintf(`{"id":%q,"status":"sent","timestamp":"%d","recipient_id":"15551234567"}`, wamid(seq), now.Unix()))
					seq++
				}
				body := `{"object":"whatsapp_business_account","entry":[{"id":"waba","changes":[{"field":"messages","value":{
					"metadata":{"phone_number_id":"` + conn.PhoneNumberID + `"},"statuses":[` + strings.Join(statuses, ",") + `]}}]}]}`
				parsed, err := inbound.Parse([]byte(body))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := f.Store.StoreEvents(ctx, parsed.Items, store.Claim{}); err != nil {
					b.Fatal(err)
				}
			}
			const warm = 20 // posts: partitions, plans (past the custom-plan phase)
			log(0, (warm+b.N)*perPost)
			for range warm {
				post()
			}
			cpu0 := procCPU(b, pid)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				post()
			}
			b.StopTimer()
			pg := procCPU(b, pid) - cpu0
			b.ReportMetric(float64(pg.Microseconds())/float64(b.N*perPost), "pg-µs/status")
		})
	}
}
