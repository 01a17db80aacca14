package store

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// The history tables are partitioned by UTC day (migration 011; relay_log, migration 020; its
// counts, relay_counts and relay_minutes, migration 023). A partition is named
// <table>_pYYYYMMDD and holds [that day, the next day); the partition a migration made for the
// rows it copied (011, 023) has no lower bound but is named, and dropped, the same way.
var partitioned = []struct {
	table string
	// extra runs after the partition is created (%[1]s: the partition's name)
	extra string
	with  string
}{
	{table: "events", extra: `CREATE UNIQUE INDEX IF NOT EXISTS %[1]s_dedupe ON %[1]s (channel_id, dedupe_key)`},
	{table: "deliveries", with: " WITH (fillfactor = 80)"},
	{table: "delivery_attempts"},
	{table: "relay_log"},
	{table: "relay_counts"},  // migration 023
	{table: "relay_minutes"}, // migration 023
}

// partitionLockKey is the pg_advisory_xact_lock key serialising partition changes across
// instances.
const partitionLockKey int64 = 0x7762_7061_7274_0001 // "wbpart"

// PartitionsAhead is how many days after today EnsurePartitions creates by default.
const PartitionsAhead = 3

// partitionedTables returns the names of the partitioned history tables.
func partitionedTables() []string {
	names := make([]string, len(partitioned))
	for i, p := range partitioned {
		names[i] = p.table
	}
	return names
}

var partitionName = regexp.MustCompile(`^(events|deliveries|delivery_attempts|relay_log|relay_counts|relay_minutes)_p(\d{8})$`)

func day(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// EnsurePartitions creates the daily partitions of the history tables for every day from
// from's to to's (UTC), those missing only. Any instance may call it at any time: it runs
// under a transaction-scoped advisory lock, so concurrent calls do not race.
func (s *Store) EnsurePartitions(ctx context.Context, from, to time.Time) error {
	return ensurePartitions(ctx, s.pool, from, to)
}

type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

func ensurePartitions(ctx context.Context, db beginner, from, to time.Time) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("ensure partitions: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, partitionLockKey); err != nil {
		return fmt.Errorf("ensure partitions: lock: %w", err)
	}
	existing, err := listPartitions(ctx, tx)
	if err != nil {
		return fmt.Errorf("ensure partitions: %w", err)
	}
	// A database migrated to an older version (MigrateTo, tests) lacks the newer tables.
	rows, err := tx.Query(ctx, `SELECT t FROM unnest($1::text[]) t WHERE to_regclass(t) IS NOT NULL`, partitionedTables())
	if err != nil {
		return fmt.Errorf("ensure partitions: %w", err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("ensure partitions: %w", err)
	}
	// Days up to an open partition's (the migration's: no lower bound) are in it.
	covered := map[string]time.Time{}
	for _, e := range existing {
		if e.open && e.day.After(covered[e.table]) {
			covered[e.table] = e.day
		}
	}
	for d := day(from); !d.After(day(to)); d = d.AddDate(0, 0, 1) {
		suffix := d.Format("20060102")
		for _, p := range partitioned {
			name := p.table + "_p" + suffix
			if !slices.Contains(tables, p.table) || !d.After(covered[p.table]) || slices.ContainsFunc(existing, func(e partition) bool { return e.name == name }) {
				continue
			}
			stmt := fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')%s`,
				name, p.table, d.Format(time.RFC3339), d.AddDate(0, 0, 1).Format(time.RFC3339), p.with)
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("ensure partitions: %s: %w", name, err)
			}
			if p.extra != "" {
				if _, err := tx.Exec(ctx, fmt.Sprintf(p.extra, name)); err != nil {
					return fmt.Errorf("ensure partitions: %s: %w", name, err)
				}
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("ensure partitions: %w", err)
	}
	return nil
}

// partition is one daily partition of a history table.
type partition struct {
	table, name string
	day         time.Time // the day it holds (the migration's partition: and everything before)
	open        bool      // no lower bound (the partition migration 011 made for old rows)
}

func listPartitions(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) ([]partition, error) {
	rows, err := q.Query(ctx, `
		SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) LIKE '%FROM (MINVALUE)%'
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent IN (SELECT to_regclass(t) FROM unnest($1::text[]) t)`, partitionedTables())
	if err != nil {
		return nil, fmt.Errorf("list partitions: %w", err)
	}
	type row struct {
		name string
		open bool
	}
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.name, &x.open)
	})
	if err != nil {
		return nil, fmt.Errorf("list partitions: %w", err)
	}
	var ps []partition
	for _, f := range found {
		n := f.name
		m := partitionName.FindStringSubmatch(n)
		if m == nil {
			continue // not ours to manage
		}
		d, err := time.Parse("20060102", m[2])
		if err != nil {
			continue
		}
		ps = append(ps, partition{table: m[1], name: n, day: d, open: f.open})
	}
	return ps, nil
}

// DropPartitions drops the history partitions whose whole day ends at or before cutoff: events
// with their deliveries, attempts made on those days, and the relay log's days. A day that still has live deliveries
// (pending, in flight or held — a manual retry of an old delivery, a webhook paused past the
// hold limit not yet failed) keeps its events and deliveries partitions until they finish. It
// returns the partitions dropped and the days kept for live deliveries.
func (s *Store) DropPartitions(ctx context.Context, cutoff time.Time) (dropped []string, kept []time.Time, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("drop partitions: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, partitionLockKey); err != nil {
		return nil, nil, fmt.Errorf("drop partitions: lock: %w", err)
	}
	ps, err := listPartitions(ctx, tx)
	if err != nil {
		return nil, nil, fmt.Errorf("drop partitions: %w", err)
	}
	live := map[time.Time]bool{}
	for _, p := range ps {
		end := p.day.AddDate(0, 0, 1)
		if end.After(cutoff) {
			continue
		}
		if p.table == "events" || p.table == "deliveries" {
			busy, seen := live[p.day]
			if !seen {
				// The migration's partition has no lower bound: look at everything before end.
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM delivery_queue WHERE created_at < $1)`, end).Scan(&busy); err != nil {
					return nil, nil, fmt.Errorf("drop partitions: live deliveries: %w", err)
				}
				live[p.day] = busy
				if busy {
					kept = append(kept, p.day)
				}
			}
			if busy {
				continue
			}
		}
		if _, err := tx.Exec(ctx, `DROP TABLE `+p.name); err != nil {
			return nil, nil, fmt.Errorf("drop partitions: %s: %w", p.name, err)
		}
		dropped = append(dropped, p.name)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, fmt.Errorf("drop partitions: %w", err)
	}
	slices.Sort(dropped)
	return dropped, kept, nil
}
