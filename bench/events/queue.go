package main

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// queue reads the backlog and empties the tables between steps, on the schema it found at
// start: with the queue table delivery_queue (live deliveries: pending, in_flight, held) or,
// before it, with deliveries (every delivery; live ones pending or in_flight).
type queue struct {
	pool  *pgxpool.Pool
	table bool // delivery_queue exists
}

func newQueue(ctx context.Context, pool *pgxpool.Pool) (*queue, error) {
	q := &queue{pool: pool}
	if err := pool.QueryRow(ctx, `SELECT to_regclass('delivery_queue') IS NOT NULL`).Scan(&q.table); err != nil {
		return nil, fmt.Errorf("look for delivery_queue: %w", err)
	}
	return q, nil
}

func (q *queue) desc() string {
	if q.table {
		return "delivery_queue rows not held (status <> 'held')"
	}
	return "deliveries pending or in flight (no delivery_queue table: the schema before the queue)"
}

// pending returns the backlog, leaving out the deliveries of the webhooks exclude (-1 on error).
// Before the queue table, held deliveries are pending rows of a paused webhook: a step with a
// paused webhook excludes it.
func (q *queue) pending(ctx context.Context, exclude []uuid.UUID) int64 {
	var sql string
	var args []any
	switch {
	case q.table && len(exclude) == 0:
		sql = `SELECT count(*) FROM delivery_queue WHERE status <> 'held'`
	case q.table:
		sql, args = `SELECT count(*) FROM delivery_queue WHERE status <> 'held' AND webhook_id <> ALL ($1)`, []any{exclude}
	case len(exclude) == 0:
		sql = `
			SELECT (SELECT count(*) FROM deliveries WHERE status = 'pending' AND attempts = 0)
			     + (SELECT count(*) FROM deliveries WHERE status = 'pending' AND attempts > 0)
			     + (SELECT count(*) FROM deliveries WHERE status = 'in_flight')`
	default:
		sql, args = `SELECT count(*) FROM deliveries WHERE status IN ('pending', 'in_flight') AND webhook_id <> ALL ($1)`, []any{exclude}
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int64
	if err := q.pool.QueryRow(qctx, sql, args...).Scan(&n); err != nil {
		return -1
	}
	return n
}

type hookQueue struct{ total, held int64 }

// byHook returns the live deliveries per webhook (held: those in status held, queue table only).
func (q *queue) byHook(ctx context.Context) (map[uuid.UUID]hookQueue, error) {
	sql := `SELECT webhook_id, count(*), count(*) FILTER (WHERE status = 'held') FROM delivery_queue GROUP BY 1`
	if !q.table {
		sql = `SELECT webhook_id, count(*), 0 FROM deliveries WHERE status IN ('pending', 'in_flight') GROUP BY 1`
	}
	rows, err := q.pool.Query(ctx, sql)
	if err != nil {
		return nil, fmt.Errorf("backlog per webhook: %w", err)
	}
	out := map[uuid.UUID]hookQueue{}
	for rows.Next() {
		var id uuid.UUID
		var h hookQueue
		if err := rows.Scan(&id, &h.total, &h.held); err != nil {
			rows.Close()
			return nil, fmt.Errorf("backlog per webhook: %w", err)
		}
		out[id] = h
	}
	return out, rows.Err()
}

// truncate empties the events and their deliveries (the queue table too, when it exists).
func (q *queue) truncate(ctx context.Context) error {
	sql := `TRUNCATE delivery_attempts, deliveries, events`
	if q.table {
		sql = `TRUNCATE delivery_queue, delivery_attempts, deliveries, events`
	}
	if _, err := q.pool.Exec(ctx, sql); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	return nil
}
