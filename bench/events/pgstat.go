package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pgStat reads the bench database's statements from pg_stat_statements (-pgstat): reset when a
// step's offered load starts and read when it ends, the window its CPU figures cover, so that a
// step reports the statements its load ran, per offered event. Execution time is wall time in
// the backend (waits on locks and on the WAL flush included), not CPU: it ranks the statements,
// the CPU table measures.
type pgStat struct {
	pool *pgxpool.Pool
	n    int // statements read per step
}

// statementStat is one statement's totals over a step's offered load.
type statementStat struct {
	query               string
	calls, rows         int64
	execMS, planMS      float64
	walBytes, blocksHit int64
}

// newPGStat creates the extension in the bench database (pool's) and checks that the server
// loads it.
func newPGStat(ctx context.Context, pool *pgxpool.Pool, n int) (*pgStat, error) {
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return nil, fmt.Errorf("-pgstat: %w", err)
	}
	s := &pgStat{pool: pool, n: n}
	if err := s.reset(ctx); err != nil {
		return nil, fmt.Errorf("-pgstat (the server must have pg_stat_statements in shared_preload_libraries): %w", err)
	}
	return s, nil
}

// reset forgets the bench database's statements (only its own: other databases' are kept).
func (s *pgStat) reset(ctx context.Context) error {
	if s == nil {
		return nil
	}
	_, err := s.pool.Exec(ctx, `SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)`)
	return err
}

// read returns the bench database's costliest statements since the last reset, by execution
// time.
func (s *pgStat) read(ctx context.Context) ([]statementStat, error) {
	if s == nil {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `
		SELECT query, calls, rows, total_exec_time, total_plan_time, wal_bytes::bigint, shared_blks_hit
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY total_exec_time DESC LIMIT $1`, s.n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []statementStat
	for rows.Next() {
		var st statementStat
		if err := rows.Scan(&st.query, &st.calls, &st.rows, &st.execMS, &st.planMS, &st.walBytes, &st.blocksHit); err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, rows.Err()
}

var spaces = regexp.MustCompile(`\s+`)

// statementLabel is the statement's text on one line, cut to its first 90 characters.
func statementLabel(q string) string {
	q = strings.TrimSpace(spaces.ReplaceAllString(q, " "))
	if len(q) > 90 {
		q = q[:90] + "…"
	}
	return "`" + strings.ReplaceAll(q, "|", `\|`) + "`"
}

// reportStatements prints each step's statements (-pgstat), per offered event.
func reportStatements(p func(string, ...any), rs []*stepResult) {
	for _, r := range rs {
		if len(r.statements) == 0 {
			continue
		}
		n := float64(max(r.offered, 1))
		p("\nPostgres statements of step %s's offered load (pg_stat_statements, the bench database; per offered event; execution is wall time in the backend, waits included):\n\n", r.label())
		p("| statement | calls | rows | exec µs | plan µs | WAL bytes | buffers hit |\n|:--|--:|--:|--:|--:|--:|--:|\n")
		var exec float64
		for _, st := range r.statements {
			exec += st.execMS
			p("| %s | %.2f | %.2f | %.1f | %.1f | %.0f | %.1f |\n", statementLabel(st.query), float64(st.calls)/n, float64(st.rows)/n,
				1000*st.execMS/n, 1000*st.planMS/n, float64(st.walBytes)/n, float64(st.blocksHit)/n)
		}
		p("| **these together** | | | **%.1f** | | | |\n", 1000*exec/n)
	}
}
