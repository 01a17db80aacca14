package store

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ErrNoSession is returned by DashboardSession for a token that names no live session: unknown,
// signed out, expired, or belonging to a key that was revoked or has expired.
var ErrNoSession = errors.New("no such dashboard session")

// DashboardSession is a signed-in dashboard user: the API key that signed in, until ExpiresAt.
type DashboardSession struct {
	Key       APIKey
	ExpiresAt time.Time
}

// newSessionToken returns 32 random bytes, base64url: a cookie value.
func newSessionToken() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported systems
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// MaxDashboardSessions is the most sessions one API key holds: a sign-in beyond it ends the
// key's oldest session (its cookie then names no session). Each sign-in costs a request of the
// key's management rate limit too (the dashboard charges it), so a key cannot fill the table.
const MaxDashboardSessions = 20

// CreateDashboardSession starts a session for an authenticated key, lasting ttl (never past
// the key's own expiry), and ends the key's oldest sessions beyond MaxDashboardSessions. It
// returns the cookie token (stored only as its SHA-256) and the session. Expired sessions of
// every key are removed on the way. A key's sign-ins are serialized (its row is locked), so its
// sessions never exceed the bound, and each is stamped with the clock time it was made under
// that lock, so the oldest is the one ended.
func (s *Store) CreateDashboardSession(ctx context.Context, key APIKey, ttl time.Duration) (string, DashboardSession, error) {
	token := newSessionToken()
	expires := s.now().Add(ttl)
	if key.ExpiresAt != nil && key.ExpiresAt.Before(expires) {
		expires = *key.ExpiresAt
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM dashboard_sessions WHERE expires_at < now()`); err != nil {
		return "", DashboardSession{}, fmt.Errorf("prune dashboard sessions: %w", err)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM api_keys WHERE id = $1 FOR NO KEY UPDATE`, key.ID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrInvalidAPIKey // deleted since it authenticated
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO dashboard_sessions (token_hash, api_key_id, created_at, expires_at)
			VALUES ($1, $2, clock_timestamp(), $3)`, TokenHash(token), key.ID, expires); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `
			DELETE FROM dashboard_sessions WHERE token_hash IN (
				SELECT token_hash FROM dashboard_sessions WHERE api_key_id = $1
				ORDER BY created_at DESC, token_hash OFFSET $2)`, key.ID, MaxDashboardSessions)
		return err
	})
	if errors.Is(err, ErrInvalidAPIKey) {
		return "", DashboardSession{}, err
	}
	if err != nil {
		return "", DashboardSession{}, fmt.Errorf("create dashboard session: %w", err)
	}
	return token, DashboardSession{Key: key, ExpiresAt: expires}, nil
}

// DashboardSession returns the live session of a cookie token. The key must still be valid:
// a revoked or expired key ends its sessions at once. Garbage costs no query.
func (s *Store) DashboardSession(ctx context.Context, token string) (DashboardSession, error) {
	if !ValidChannelToken(token) { // same shape: 32 random bytes, base64url
		return DashboardSession{}, ErrNoSession
	}
	var ds DashboardSession
	k, err := scanAPIKey(s.pool.QueryRow(ctx, `
		SELECT `+apiKeyColumns+`, session_expires FROM (
			SELECT k.*, s.expires_at AS session_expires
			FROM dashboard_sessions s JOIN api_keys k ON k.id = s.api_key_id
			WHERE s.token_hash = $1 AND s.expires_at > now()
			  AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())) x`, TokenHash(token)),
		&ds.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return DashboardSession{}, ErrNoSession
	}
	if err != nil {
		return DashboardSession{}, fmt.Errorf("dashboard session: %w", err)
	}
	ds.Key = k
	return ds, nil
}

// DeleteDashboardSession ends a session (sign-out). An unknown token is not an error.
func (s *Store) DeleteDashboardSession(ctx context.Context, token string) error {
	if !ValidChannelToken(token) {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM dashboard_sessions WHERE token_hash = $1`, TokenHash(token)); err != nil {
		return fmt.Errorf("delete dashboard session: %w", err)
	}
	return nil
}

// DeliveryBucket is one bucket of time of a webhook's delivery attempts: how many succeeded and
// failed, and their latency.
type DeliveryBucket struct {
	// Start is the bucket's start (UTC).
	Start     time.Time
	Succeeded int // 2xx
	Failed    int // any other status, or no answer (timeout, connection error)
	// P50MS and P99MS are the attempts' latency percentiles, in milliseconds.
	P50MS, P99MS float64
}

// DeliveryChart returns, for one of the org's webhooks, its attempts since `since` counted per
// bucket of time (aligned on the Unix epoch) by outcome, with their latency p50 and p99: only
// buckets with attempts, in time order. One query: it reads the webhook's deliveries created from
// an hour before since (retries follow their first attempt by at most the retry schedule)
// through their (webhook_id, created_at) index, and their attempts.
func (s *Store) DeliveryChart(ctx context.Context, orgID, webhookID uuid.UUID, since time.Time, bucket time.Duration) ([]DeliveryBucket, error) {
	if _, err := s.GetWebhook(ctx, orgID, webhookID); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `
		SELECT to_timestamp(floor(extract(epoch FROM a.started_at) / $3) * $3),
		       count(*) FILTER (WHERE a.status_code BETWEEN 200 AND 299),
		       count(*) FILTER (WHERE a.status_code IS NULL OR a.status_code NOT BETWEEN 200 AND 299),
		       percentile_cont(0.5) WITHIN GROUP (ORDER BY a.duration_ms),
		       percentile_cont(0.99) WITHIN GROUP (ORDER BY a.duration_ms)
		FROM deliveries d JOIN delivery_attempts a ON a.delivery_id = d.id
		WHERE d.webhook_id = $1 AND d.created_at >= $2::timestamptz - interval '1 hour' AND a.started_at >= $2
		GROUP BY 1 ORDER BY 1`, webhookID, since, bucket.Seconds())
	if err != nil {
		return nil, fmt.Errorf("delivery chart: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeliveryBucket, error) {
		var b DeliveryBucket
		err := r.Scan(&b.Start, &b.Succeeded, &b.Failed, &b.P50MS, &b.P99MS)
		b.Start = b.Start.UTC()
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("delivery chart: %w", err)
	}
	return out, nil
}
