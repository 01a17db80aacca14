// Command usage measures the usage query (GET /usage, DESIGN §5c "Usage by pricing category") of
// one org sending 10 million messages a month.
//
//	go run ./bench/usage                      # 10 million messages a month, 40 channels, 25 countries
//	go run ./bench/usage -messages 1000000    # a smaller org
//
// It creates a fresh database wabarelay_bench_usage_<rand> on the Postgres named by -pg (durable:
// the server's fsync and synchronous_commit, printed), migrates it, and drops it at the end (also
// on Ctrl-C). Data, written with set-based SQL (what the intake's deltas and the maintenance
// loop's folds would have left): the measured org with -channels channels (the first ones
// busiest: channel n has weight 1/n^0.8), -months months of daily rollup rows (usage_daily) whose
// messages add up to about -messages a month — spread over 8 pricing category and type pairs
// (marketing, utility, utility in the service window, service, authentication,
// authentication-international, free entry points, marketing_lite), over -countries countries
// (each channel sends -home, 90%, to its home country, the rest to the others by a Zipf law of
// exponent -zipf, 2) and over
// the days (±30% from day to day); a bucket whose share rounds to 0 messages on a day is absent,
// as it would be. Then -deltas rows not folded yet (usage_deltas) on today and yesterday, some
// of them moves (-1 from one bucket, +1 to another); and -other-orgs orgs with the same rollup in
// the same tables. Then VACUUM ANALYZE (what autovacuum does on a live database).
//
// Each query runs -runs times, one at a time on a warm cache, and p50, p99 and max are printed:
// the Service's Usage (the store's one statement, its rows priced with a rate card of every
// country and category), and the same through the management API's HTTP handler in JSON and in
// CSV (an API key authenticated by its own query first, the answer encoded). The default window
// (the last 30 days) of the whole org, and of one channel. Then the plan Postgres executed for
// the org's query (auto_explain).
//
// The files: config.go (flags), main.go (the run), load.go (the data and the queries).
package main

import (
	"context"
	"os"
	"runtime/pprof"

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
	dsn, st, pool, err := benchkit.DurableStore(ctx, c.pg, "wabarelay_bench_usage_", cl)
	if err != nil {
		return err
	}
	w := &world{st: st, pool: pool}
	if err := w.fill(ctx, c); err != nil {
		return err
	}
	qs, err := w.queries(ctx, c)
	if err != nil {
		return err
	}
	if c.cpuprofile != "" {
		f, err := os.Create(c.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close() //nolint:errcheck // (written and stopped before; a close error loses nothing more)
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	err = measure(ctx, qs, c.runs)
	pprof.StopCPUProfile() // (nothing when not started)
	if err != nil {
		return err
	}
	return w.explain(ctx, dsn)
}
