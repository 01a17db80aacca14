package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// planGuardSQL sets, for the rest of its transaction, the settings under which a statement
// run by queryGeneric is planned: a generic plan (made once per connection and statement, and
// again whenever Postgres invalidates it, e.g. after an ANALYZE of one of its tables), and no
// plan shape that reads every matching row before it returns one — no sequential or bitmap
// scan, no hash or merge join —, so that a plan made while the tables were empty or unanalysed
// cannot read them whole once they are large, nor a webhook's whole backlog to answer an EXISTS
// or a LIMIT. What is left is index scans joined by nested loops, the shape the hot statements
// have on custom plans too; only their planning, per call before, is saved.
const planGuardSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
	set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
	set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`

// queryGeneric runs sql on a generic plan made under planGuardSQL. The guard and the statement
// go in one pipeline, one round trip and one implicit transaction (the guard's settings end with
// it), and the statement is prepared on the connection (the pool's statement cache; with a
// connection string that disables it, the statement is planned per call as before, under the
// same guard). In a transaction (db a pgx.Tx) the guard holds until it ends.
//
// For the hot statements of intake and delivery (bench/README.md, "Figures behind the defaults
// (inbound, delivery)"): the claims, the health sums, the intake's deliveries and the completions.
// Not for the statements that read a partitioned table by a day's bounds (the events insert,
// the payload and message look-ups), which stay planned per call: a generic plan prunes
// partitions only when it runs, and Postgres 15 locks every partition of its tables at every
// call. The completion, which updates one day of deliveries, was measured both ways: on its
// generic plan its run time did not grow, and its planning went. So was the events insert (the
// same section): generic, it cost a little less (its planning went, its run time grew a
// little), but the guard would then hold for the rest of the intake's transaction (the
// messages upsert); not done.
func queryGeneric(ctx context.Context, db batchSender, sql string, args ...any) (pgx.Rows, error) {
	return queryUnder(ctx, db, planGuardSQL, sql, args)
}

// queryUnder runs sql after guard (a statement of set_config calls local to the transaction),
// both in one pipeline.
func queryUnder(ctx context.Context, db batchSender, guard, sql string, args []any) (pgx.Rows, error) {
	br, err := sendUnder(ctx, db, guard, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close() // the statement's error is the one to report
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// execGeneric is queryGeneric for a statement whose rows are not read.
func execGeneric(ctx context.Context, db batchSender, sql string, args ...any) (pgconn.CommandTag, error) {
	br, err := sendUnder(ctx, db, planGuardSQL, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// sendUnder sends guard and sql as one batch and reads the guard's answer; the statement's is
// next in the returned results (closed already on an error).
func sendUnder(ctx context.Context, db batchSender, guard, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.Queue(guard)
	b.Queue(sql, args...)
	br := db.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close() // the guard's error is the one to report
		return nil, err
	}
	return br, nil
}

// batchSender is a pool, a connection or a transaction.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

var (
	_ batchSender = (*pgxpool.Pool)(nil)
	_ batchSender = pgx.Tx(nil)
)

// batchRows are the rows of a batch's last statement; closing them closes the batch, which
// reads its end (the implicit transaction's commit) and gives the connection back.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	err    error
	closed bool
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

var _ pgx.Rows = (*batchRows)(nil)
