package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/store"
)

// measure runs each query runs times, one at a time, and prints p50, p99 and max.
func measure(ctx context.Context, st *store.Store, qs []query, runs int) error {
	fmt.Printf("\n%-28s %10s %10s %10s   (%d runs each)\n", "query", "p50 ms", "p99 ms", "max ms", runs)
	for _, q := range qs {
		d := make([]time.Duration, runs)
		for i := range runs {
			start := time.Now()
			if err := q.run(ctx, st, i); err != nil {
				return fmt.Errorf("%s: %w", q.name, err)
			}
			d[i] = time.Since(start)
		}
		slices.Sort(d)
		fmt.Printf("%-28s %10.3f %10.3f %10.3f\n", q.name, benchkit.MS(d[runs/2]), benchkit.MS(d[runs*99/100]), benchkit.MS(d[runs-1]))
	}
	return nil
}

// explain runs each query once more on a pool whose sessions log every statement's executed
// plan (auto_explain) as a notice, and prints the plans.
func (w *world) explain(ctx context.Context, dsn string, qs []query) error {
	pool, plans, err := benchkit.ExplainPool(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	st := store.New(pool, nil)
	for _, q := range qs {
		plans() // (forgets the previous query's)
		if err := q.run(ctx, st, 7); err != nil {
			return fmt.Errorf("%s: %w", q.name, err)
		}
		fmt.Printf("\n=== %s: EXPLAIN (ANALYZE, BUFFERS)\n%s\n", q.name, strings.Join(plans(), "\n"))
	}
	return nil
}
