package relaylog

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/relay"
	"github.com/wabarelay/wabarelay/store"
)

// discardSink takes every batch at once.
type discardSink struct{}

func (discardSink) WriteRelayLog(context.Context, []store.RelayCall) error { return nil }

func (discardSink) SettleMessages(context.Context) error { return nil }

// BenchmarkRecord measures what a call costs the process for its log: Record from 64
// goroutines (the relay's handlers), each pausing 1 ms between calls as handlers do between
// sends (so the writer waits for calls, as it does at any real rate, rather than finding them
// back to back), with the writer running on a sink that takes every batch at once. cpu-ns/op
// is the whole process's CPU per call (the writer's hand-off included); the "none" variant is
// the same loop without Record: the pacing's own cost, to subtract. ns/op is the pacing.
// Run: go test -run '^$' -bench Record -benchtime 20000x ./relaylog
func BenchmarkRecord(b *testing.B) {
	for _, record := range []bool{true, false} {
		name := "record"
		if !record {
			name = "none"
		}
		b.Run(name, func(b *testing.B) {
			w := New(discardSink{}, Config{PerChannel: 1 << 30}, nil, nil) // (every call a row: the buffer's path)
			w.Start()
			defer w.Stop()
			c := relay.Call{At: time.Now(), OrgID: uuid.New(), ChannelID: uuid.New(), Status: 200, Outcome: relay.OutcomeOK,
				Latency: time.Millisecond, IdempotencyKey: "key-1", Recipient: "15551234567", WAMID: "wamid.HBgLMTU1NTEyMzQ1NjcVAgARGBI"}
			b.SetParallelism(32) // 32 × GOMAXPROCS goroutines
			b.ReportAllocs()
			cpu0 := processCPU()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if record {
						w.Record(c)
					}
					time.Sleep(time.Millisecond)
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			if d := w.Dropped(); d > 0 {
				b.Fatalf("%d of %d calls dropped", d, b.N)
			}
		})
	}
}

// processCPU is this process's user and system CPU time so far, in ns.
func processCPU() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru) // cannot fail for RUSAGE_SELF
	return ru.Utime.Nano() + ru.Stime.Nano()
}
