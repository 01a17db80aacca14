// Package store is wabarelay's Postgres data layer: embedded schema migrations and the queries
// behind organizations, API keys, channels and webhook configs. Secrets (channel tokens, upstream
// tokens, webhook signing secrets) are encrypted with a secretbox.Box before they are written;
// API keys are stored only as hashes.
//
// Every method that takes an org id scopes its query to that org: a row of another org is
// reported as ErrNotFound (or the resource-specific not-found error), never revealed.
package store

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/secretbox"
)

// Errors returned by Store methods. Callers map them to API responses.
var (
	ErrOrgNotFound      = errors.New("org not found")
	ErrChannelNotFound  = errors.New("channel not found")
	ErrWebhookNotFound  = errors.New("webhook not found")
	ErrAPIKeyNotFound   = errors.New("api key not found")
	ErrChannelActive    = errors.New("channel is active")
	ErrChannelsNotInOrg = errors.New("one or more channel ids not found in this org")
	ErrInvalidAPIKey    = errors.New("invalid or revoked api key")
	ErrAPIKeyExpired    = errors.New("api key expired")
)

// Store runs queries on a pgx pool. It is safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	box   *secretbox.Box
	clock clock.Clock
}

// New returns a Store on pool that encrypts secrets with box.
func New(pool *pgxpool.Pool, box *secretbox.Box) *Store {
	return &Store{pool: pool, box: box}
}

// SetClock sets the time the store decides by (nil, the default: the real time, the
// database's own in its statements; see package clock). Tests set a clock.Stub; call it before
// the store is used concurrently.
func (s *Store) SetClock(c clock.Clock) { s.clock = c }

// now returns the store's time in Go.
func (s *Store) now() time.Time { return clock.Now(s.clock) }

// nowArg returns the store's time as a statement's now argument (nil: the database's now()).
func (s *Store) nowArg() *time.Time { return clock.Param(s.clock) }

// nowSQL is the SQL of the store's time held by the statement's parameter n (nowArg).
func nowSQL(n int) string { return fmt.Sprintf("coalesce($%d::timestamptz, now())", n) }

// Pool returns the underlying pool (for other packages' queries in the same database).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Box returns the secret box used for encryption at rest.
func (s *Store) Box() *secretbox.Box { return s.box }

// Ping checks that Postgres answers.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.pool.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("ping postgres: %w", err)
	}
	return nil
}

func newID() uuid.UUID {
	id, err := uuid.NewV7()
	if err != nil {
		// NewV7 fails only if the system random source fails.
		panic(err)
	}
	return id
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}

// isForeignKeyViolation reports a 23503 error from Postgres.
func isForeignKeyViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23503"
}

// inTx runs fn in a transaction, committing when it returns nil.
func (s *Store) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, fn)
}
