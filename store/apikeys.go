package store

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// API keys look like crt_pk_<12 lookup chars><32 secret chars>, all base62. The first
// len(APIKeyPrefix)+12 characters are the key's public prefix: stored in clear, shown to
// operators, used as the lookup index. Only the SHA-256 of the whole key is stored; it is
// compared in constant time.
const (
	APIKeyPrefix     = "crt_pk_"
	apiKeyLookupLen  = 12
	apiKeySecretLen  = 32
	apiKeyLen        = len(APIKeyPrefix) + apiKeyLookupLen + apiKeySecretLen
	apiKeyDisplayLen = len(APIKeyPrefix) + apiKeyLookupLen
)

// APIKey is an API key record. The key itself is never stored.
type APIKey struct {
	ID         uuid.UUID  `json:"id"`
	OrgID      uuid.UUID  `json:"org_id"`
	Name       string     `json:"name"`
	Prefix     string     `json:"prefix"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
}

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// randomBase62 returns n uniformly random base62 characters.
func randomBase62(n int) string {
	var sb strings.Builder
	sb.Grow(n)
	for sb.Len() < n {
		for _, b := range randomBytes(n) {
			if b >= 248 { // 248 = 4*62: reject to keep the distribution uniform
				continue
			}
			sb.WriteByte(base62[b%62])
			if sb.Len() == n {
				break
			}
		}
	}
	return sb.String()
}

func hashKey(key string) []byte {
	sum := sha256.Sum256([]byte(key))
	return sum[:]
}

// ErrAPIKeyLimit is returned by CreateAPIKeyCapped when the org already has the most live keys
// it may have.
var ErrAPIKeyLimit = errors.New("api key limit reached")

// CreateAPIKey creates a key for org and returns the record and the key, which is not kept
// anywhere and cannot be shown again. expiresAt may be nil (no expiry). It applies no cap (the
// operator's CLI); see CreateAPIKeyCapped.
func (s *Store) CreateAPIKey(ctx context.Context, orgID uuid.UUID, name string, expiresAt *time.Time) (APIKey, string, error) {
	return s.CreateAPIKeyCapped(ctx, orgID, name, expiresAt, 0)
}

// CreateAPIKeyCapped is CreateAPIKey with a cap: when maxLive is positive and the org already
// has maxLive live keys (neither revoked nor past their expiry), nothing is created and the
// error is ErrAPIKeyLimit. The cap holds under concurrent creations. 0 means no cap.
func (s *Store) CreateAPIKeyCapped(ctx context.Context, orgID uuid.UUID, name string, expiresAt *time.Time, maxLive int) (APIKey, string, error) {
	key := APIKeyPrefix + randomBase62(apiKeyLookupLen+apiKeySecretLen)
	k := APIKey{ID: newID(), OrgID: orgID, Name: name, Prefix: key[:apiKeyDisplayLen], ExpiresAt: expiresAt}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if maxLive > 0 {
			if err := lockOrg(ctx, tx, orgID); err != nil {
				return err
			}
			var n int
			if err := tx.QueryRow(ctx, `
				SELECT count(*) FROM api_keys
				WHERE org_id = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $2)`,
				orgID, s.now()).Scan(&n); err != nil {
				return err
			}
			if n >= maxLive {
				return ErrAPIKeyLimit
			}
		}
		return tx.QueryRow(ctx, `
			INSERT INTO api_keys (id, org_id, name, prefix, key_hash, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING created_at`,
			k.ID, k.OrgID, k.Name, k.Prefix, hashKey(key), k.ExpiresAt).Scan(&k.CreatedAt)
	})
	switch {
	case errors.Is(err, ErrAPIKeyLimit), errors.Is(err, ErrOrgNotFound):
		return APIKey{}, "", err
	case isForeignKeyViolation(err):
		return APIKey{}, "", ErrOrgNotFound
	case err != nil:
		return APIKey{}, "", fmt.Errorf("create api key: %w", err)
	}
	return k, key, nil
}

const apiKeyColumns = `id, org_id, name, prefix, created_at, expires_at, revoked_at, last_used_at`

func scanAPIKey(row pgx.Row, extra ...any) (APIKey, error) {
	var k APIKey
	dest := append([]any{&k.ID, &k.OrgID, &k.Name, &k.Prefix, &k.CreatedAt, &k.ExpiresAt, &k.RevokedAt, &k.LastUsedAt}, extra...)
	err := row.Scan(dest...)
	return k, err
}

// ListAPIKeys returns all the org's keys, revoked and expired ones included, ordered by
// (created_at, id).
func (s *Store) ListAPIKeys(ctx context.Context, orgID uuid.UUID) ([]APIKey, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+apiKeyColumns+` FROM api_keys WHERE org_id = $1 ORDER BY created_at, id`, orgID)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (APIKey, error) { return scanAPIKey(r) })
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	return keys, nil
}

// RevokeAPIKey revokes a key of any org (the operator's CLI). Revoking a revoked key keeps its
// first revocation time.
func (s *Store) RevokeAPIKey(ctx context.Context, id uuid.UUID) (APIKey, error) {
	return s.revokeAPIKey(ctx, nil, id)
}

// RevokeOrgAPIKey revokes a key of org. A key of another org, or none, gives ErrAPIKeyNotFound.
// Revoking a revoked key succeeds and keeps its first revocation time.
func (s *Store) RevokeOrgAPIKey(ctx context.Context, orgID, id uuid.UUID) (APIKey, error) {
	return s.revokeAPIKey(ctx, &orgID, id)
}

// revokeAPIKey revokes key id, of org orgID when it is not nil.
func (s *Store) revokeAPIKey(ctx context.Context, orgID *uuid.UUID, id uuid.UUID) (APIKey, error) {
	k, err := scanAPIKey(s.pool.QueryRow(ctx, `
		UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now())
		WHERE id = $1 AND ($2::uuid IS NULL OR org_id = $2)
		RETURNING `+apiKeyColumns, id, orgID))
	if errors.Is(err, pgx.ErrNoRows) {
		return APIKey{}, ErrAPIKeyNotFound
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("revoke api key: %w", err)
	}
	return k, nil
}

// ActiveAPIKey returns the record of key id while the key may be used: an unknown or revoked key
// gives ErrInvalidAPIKey, a key past its expiry ErrAPIKeyExpired, as AuthenticateAPIKey does for
// the key itself, and the use is recorded the same way. It is the check to make on every request
// of a session tied to a key id (the dashboard's, through managementapi.Service).
func (s *Store) ActiveAPIKey(ctx context.Context, id uuid.UUID) (APIKey, error) {
	k, err := scanAPIKey(s.pool.QueryRow(ctx, `SELECT `+apiKeyColumns+` FROM api_keys WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return APIKey{}, ErrInvalidAPIKey
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("get api key: %w", err)
	}
	if k.RevokedAt != nil {
		return APIKey{}, ErrInvalidAPIKey
	}
	return s.useAPIKey(ctx, k)
}

// dummyHash is compared against when no key has the given prefix, so that unknown and wrong
// keys cost the same.
var dummyHash = hashKey(APIKeyPrefix + strings.Repeat("0", apiKeyLookupLen+apiKeySecretLen))

// AuthenticateAPIKey returns the record of a valid key. A malformed, unknown, wrong or revoked
// key gives ErrInvalidAPIKey; a key past its expiry gives ErrAPIKeyExpired. Only errors from
// Postgres itself are returned otherwise.
func (s *Store) AuthenticateAPIKey(ctx context.Context, key string) (APIKey, error) {
	if len(key) != apiKeyLen || !strings.HasPrefix(key, APIKeyPrefix) {
		return APIKey{}, ErrInvalidAPIKey
	}
	for i := len(APIKeyPrefix); i < len(key); i++ {
		if strings.IndexByte(base62, key[i]) < 0 {
			return APIKey{}, ErrInvalidAPIKey
		}
	}
	var stored []byte
	k, err := scanAPIKey(s.pool.QueryRow(ctx,
		`SELECT `+apiKeyColumns+`, key_hash FROM api_keys WHERE prefix = $1`, key[:apiKeyDisplayLen]), &stored)
	if errors.Is(err, pgx.ErrNoRows) {
		subtle.ConstantTimeCompare(hashKey(key), dummyHash)
		return APIKey{}, ErrInvalidAPIKey
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("authenticate api key: %w", err)
	}
	if subtle.ConstantTimeCompare(hashKey(key), stored) != 1 || k.RevokedAt != nil {
		return APIKey{}, ErrInvalidAPIKey
	}
	return s.useAPIKey(ctx, k)
}

// useAPIKey checks the expiry of the unrevoked key k and records its use.
func (s *Store) useAPIKey(ctx context.Context, k APIKey) (APIKey, error) {
	now := s.now()
	if k.ExpiresAt != nil && !now.Before(*k.ExpiresAt) {
		return APIKey{}, ErrAPIKeyExpired
	}
	// Record use at most once a minute per key, to keep the hot path read-only.
	if k.LastUsedAt == nil || now.Sub(*k.LastUsedAt) > time.Minute {
		if _, err := s.pool.Exec(ctx, `UPDATE api_keys SET last_used_at = now() WHERE id = $1`, k.ID); err != nil {
			return APIKey{}, fmt.Errorf("record api key use: %w", err)
		}
	}
	return k, nil
}
