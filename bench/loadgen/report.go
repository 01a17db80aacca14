package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

// result is what the measured step saw.
type result struct {
	caddyBin, loadAvg          string
	receiverPID                int
	counts                     *counts
	acks                       []time.Duration // every accepted post's ack time
	loadTime                   time.Duration
	accepted, offered          int64
	delivered, dups            int64 // distinct events received, receipts beyond the first of one
	duringLoad, drainRate      float64
	quarterBacklog, endBacklog int64
	cpu, cpuAll                map[string]time.Duration // over the load; over load and drain
}

// sustained: every post accepted, the backlog at the end at most that at a quarter plus a
// quarter second's worth, and deliveries/s during the load at least 95% of the offered rate.
func (r *result) sustained(c config) bool {
	return r.counts.skipped.Load() == 0 && r.counts.failed.Load() == 0 && r.accepted == r.offered &&
		r.endBacklog <= r.quarterBacklog+int64(c.rate/4) && r.duringLoad >= 0.95*float64(c.rate)
}

// report prints the step's table and the CPU time per event.
func report(c config, r *result) {
	p := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	p("\n## loadgen\n\n```sh\n%s\n```\n", benchkit.CommandLine("loadgen"))
	p("Caddy %s (wabarelay_inbound, product delivery defaults, retry_delays 1s 2s 5s), %d channels, 1 org-scoped webhook to a receiver in its own process (pid %d, HTTPS, 204). Posts of %d items (%.0f%% statuses), signed, open loop at %d events/s for %s. Load average at start %s.\n",
		r.caddyBin, c.channels, r.receiverPID, c.perPost, 100*c.statuses, c.rate, c.duration, r.loadAvg)
	acks := r.acks
	slices.Sort(acks)
	q := func(f float64) float64 {
		if len(acks) == 0 {
			return 0
		}
		return benchkit.MS(acks[min(len(acks)-1, int(f*float64(len(acks))))])
	}
	p("| offered events/s | accepted / offered | skipped / failed posts | ack p50 / p99 ms | deliveries/s during load | draining | backlog ¼ → end | delivered / dup / lost | sustained |")
	p("|--:|--:|--:|--:|--:|--:|--:|--:|:-:|")
	p("| %d | %d / %d | %d / %d | %.1f / %.1f | %.0f | %.0f | %d → %d | %d / %d / %d | %v |",
		c.rate, r.accepted, r.offered, r.counts.skipped.Load(), r.counts.failed.Load(), q(0.5), q(0.99), r.duringLoad, r.drainRate,
		r.quarterBacklog, r.endBacklog, r.delivered, r.dups, max(r.accepted-r.delivered, 0), r.sustained(c))
	names := []string{"caddy", benchkit.PGBackends, benchkit.PGOther, "receiver", "loadgen"}
	var total time.Duration
	row := "|"
	for _, n := range names {
		total += r.cpu[n]
		row += fmt.Sprintf(" %.0f |", float64(r.cpu[n].Microseconds())/float64(r.offered))
	}
	var totalAll time.Duration
	rowAll := "| load and drain, per accepted event |"
	for _, n := range names {
		totalAll += r.cpuAll[n]
		rowAll += fmt.Sprintf(" %.0f |", float64(r.cpuAll[n].Microseconds())/float64(max(r.accepted, 1)))
	}
	p("\nCPU µs per event (machine busy during the load %.0f%%):\n", 100*total.Seconds()/(2*r.loadTime.Seconds()))
	p("| window | %s | total |", strings.Join(names, " | "))
	p("|:--|%s--:|", strings.Repeat("--:|", len(names)))
	p("| load, per offered event |%s %.0f |", row[1:], float64(total.Microseconds())/float64(r.offered))
	p("%s %.0f |", rowAll, float64(totalAll.Microseconds())/float64(max(r.accepted, 1)))
}
