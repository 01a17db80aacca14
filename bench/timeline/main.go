// Command timeline measures the message timeline's reads at scale: the store's ListMessages (a channel's recent messages, by status, by
// recipient, the dashboard's search, a page deep in the list) and MessageTimeline (one
// message's relay call, statuses and deliveries), with millions of sends in relay_log and the
// messages rows of their statuses.
//
//	go run ./bench/timeline                        # 10 million relay_log and messages rows
//	go run ./bench/timeline -rows 1000000 -runs 100 # a quicker look
//
// It creates a fresh database wabarelay_bench_timeline_<rand> on the Postgres named by -pg
// (durable: the server's fsync and synchronous_commit, printed), migrates it, and drops it at
// the end (also on Ctrl-C). Data (generate_series, committed in chunks of -chunk rows): one org
// with -channels channels, the first one big (85% of the rows, the others share the rest), one
// webhook; -rows sends in relay_log over the last 30 days (daily partitions made by the store; 200,000
// recipients; an idempotency key on every other one), and the messages rows their statuses
// made (10% sent, 25% delivered, 50% read, 5% failed; the other 10% never reported on, so
// accepted and in relay_log alone — far more than a healthy channel has), and
// for every -events-every-th message its three status events (sent, delivered, read) with one
// delivered delivery each (events and deliveries partitions made by the store). Then ANALYZE.
//
// Each query runs -runs times through the store's own methods (a different recipient, key or
// message each run, drawn from the data), one at a time on a warm cache; p50, p99 and max are
// printed. Then each runs once more on a connection with auto_explain (log_level notice,
// analyze, buffers), and the plan Postgres executed is printed: the plans of the very statements
// the store sends.
//
// The files: config.go (flags), load.go (the data and the queries), report.go (timings, plans).
package main

import (
	"context"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

func main() {
	c := parseFlags()
	ctx := benchkit.SignalContext()
	var cl benchkit.Cleanups
	err := run(ctx, &cl, c)
	cl.Run()
	if err != nil {
		benchkit.Fatalf("%v", err)
	}
}

func run(ctx context.Context, cl *benchkit.Cleanups, c config) error {
	dsn, st, pool, err := benchkit.DurableStore(ctx, c.pg, "wabarelay_bench_timeline_", cl)
	if err != nil {
		return err
	}
	w := &world{st: st, pool: pool}
	if err := w.fill(ctx, c.rows, c.chunk, c.channels, c.eventsEvery); err != nil {
		return err
	}
	qs, err := w.queries(ctx)
	if err != nil {
		return err
	}
	if err := measure(ctx, w.st, qs, c.runs); err != nil {
		return err
	}
	return w.explain(ctx, dsn, qs)
}
