package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/store"
)

// AgeQueue makes d pass, for the delivery queue's decisions, on the fixture's database: for
// tests of processes that decide by the database's clock (a Caddy child), which a test cannot
// set the way it sets a clock.Stub in process. Every time that such a decision compares with
// now() moves d into the past, in one transaction: when a delivery or its retry falls due
// (delivery_queue.next_attempt_at), when a lease ends (locked_until), when a failing webhook's
// next probe is due and since when it fails (webhooks.next_probe_at, failing_since: the
// disable_after pause counts from it), and when a secret rotation's grace ends
// (previous_secret_expires_at). Then a notification on the deliveries channel wakes every
// dispatcher listening, instead of its next poll.
//
// Creation times are not moved: the history is partitioned by them, and max_hold and the
// retention count from them (tests of those set the store's clock and run the maintenance).
// Nor is anything a process keeps in memory: a dispatcher's hold of a webhook that reached the
// failure threshold on it ends after at most a second of real time. A lease of a running
// instance ends too when d exceeds what is left of it, and that attempt's outcome is then not
// recorded, as after a real wait that long.
func (f *Fixture) AgeQueue(t testing.TB, d time.Duration) {
	t.Helper()
	ms := d.Milliseconds()
	err := pgx.BeginFunc(context.Background(), f.Pool, func(tx pgx.Tx) error {
		ctx := context.Background()
		if _, err := tx.Exec(ctx, `
			UPDATE delivery_queue SET next_attempt_at = next_attempt_at - $1 * interval '1 millisecond',
			       locked_until = locked_until - $1 * interval '1 millisecond'`, ms); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
			UPDATE webhooks SET next_probe_at = next_probe_at - $1 * interval '1 millisecond',
			       failing_since = failing_since - $1 * interval '1 millisecond',
			       previous_secret_expires_at = previous_secret_expires_at - $1 * interval '1 millisecond'
			WHERE next_probe_at IS NOT NULL OR failing_since IS NOT NULL OR previous_secret_expires_at IS NOT NULL`, ms); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, store.DeliveriesNotifyChannel)
		return err
	})
	if err != nil {
		t.Fatalf("testenv: ageing the delivery queue by %v: %v", d, err)
	}
}

// DueHealthReads makes the number health reads that account webhooks asked for fall due now
// (channel_health.prompt_due_at, store.HealthPromptDelay after the first webhook), on the
// database of pool: for tests of a Caddy child, whose health worker then reads within its poll
// (health.DefaultPoll) instead of after the delay. Only the due time moves: the webhooks that
// came before still join the one read.
func DueHealthReads(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(),
		`UPDATE channel_health SET prompt_due_at = now() WHERE prompt_due_at > now()`); err != nil {
		t.Fatalf("testenv: health reads due now: %v", err)
	}
}
