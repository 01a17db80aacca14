package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestRevokeOrgAPIKey: the org-scoped revoke refuses another org's key and unknown ids with
// ErrAPIKeyNotFound, is idempotent (the first revocation time stays), and the CLI's unscoped
// revoke still works on any org's key.
func TestRevokeOrgAPIKey(t *testing.T) {
	f := testenv.NewStore(t)
	s := f.Store
	ctx := context.Background()
	orgA, orgB := f.Org(t, &testenv.OrgOpts{Name: "a"}), f.Org(t, &testenv.OrgOpts{Name: "b"})
	k, key, err := s.CreateAPIKey(ctx, orgA.ID, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ org, id uuid.UUID }{{orgB.ID, k.ID}, {orgA.ID, uuid.New()}, {uuid.New(), k.ID}} {
		if _, err := s.RevokeOrgAPIKey(ctx, c.org, c.id); !errors.Is(err, store.ErrAPIKeyNotFound) {
			t.Fatalf("revoke %s in org %s: %v, want ErrAPIKeyNotFound", c.id, c.org, err)
		}
	}
	if _, err := s.AuthenticateAPIKey(ctx, key); err != nil {
		t.Fatalf("key revoked by a refused call: %v", err)
	}
	first, err := s.RevokeOrgAPIKey(ctx, orgA.ID, k.ID)
	if err != nil || first.RevokedAt == nil || first.ID != k.ID || first.OrgID != orgA.ID {
		t.Fatalf("revoke: %+v %v", first, err)
	}
	again, err := s.RevokeOrgAPIKey(ctx, orgA.ID, k.ID)
	if err != nil || again.RevokedAt == nil || !again.RevokedAt.Equal(*first.RevokedAt) {
		t.Fatalf("revoke again: %+v %v (first at %v)", again, err, first.RevokedAt)
	}
	if _, err := s.AuthenticateAPIKey(ctx, key); !errors.Is(err, store.ErrInvalidAPIKey) {
		t.Fatalf("revoked key: %v", err)
	}
	// revoked keys stay listed, in (created_at, id) order
	k2, _, _ := s.CreateAPIKey(ctx, orgA.ID, "b", nil)
	keys, err := s.ListAPIKeys(ctx, orgA.ID)
	if err != nil || len(keys) != 2 || keys[0].ID != k.ID || keys[0].RevokedAt == nil || keys[1].ID != k2.ID {
		t.Fatalf("list: %+v %v", keys, err)
	}
	// the unscoped revoke (CLI): any org, unknown id refused
	kb, _, _ := s.CreateAPIKey(ctx, orgB.ID, "b", nil)
	if r, err := s.RevokeAPIKey(ctx, kb.ID); err != nil || r.RevokedAt == nil || r.OrgID != orgB.ID {
		t.Fatalf("RevokeAPIKey: %+v %v", r, err)
	}
	if _, err := s.RevokeAPIKey(ctx, uuid.New()); !errors.Is(err, store.ErrAPIKeyNotFound) {
		t.Fatalf("RevokeAPIKey unknown: %v", err)
	}
}

// TestActiveAPIKey: a key looked up by id is refused like AuthenticateAPIKey refuses it (unknown
// or revoked, expired), and its use is recorded.
func TestActiveAPIKey(t *testing.T) {
	f := testenv.NewStore(t)
	s, pool := f.Store, f.Pool
	ctx := context.Background()
	org := f.Org(t)
	later := time.Now().Add(time.Hour)
	k, _, err := s.CreateAPIKey(ctx, org.ID, "k", &later)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.ActiveAPIKey(ctx, k.ID)
	if err != nil || got.ID != k.ID || got.OrgID != org.ID || got.Name != "k" {
		t.Fatalf("active: %+v %v", got, err)
	}
	var used *time.Time
	if err := pool.QueryRow(ctx, `SELECT last_used_at FROM api_keys WHERE id = $1`, k.ID).Scan(&used); err != nil || used == nil {
		t.Fatalf("use not recorded: %v %v", used, err)
	}
	if _, err := s.ActiveAPIKey(ctx, uuid.New()); !errors.Is(err, store.ErrInvalidAPIKey) {
		t.Fatalf("unknown: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE id = $1`, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ActiveAPIKey(ctx, k.ID); !errors.Is(err, store.ErrAPIKeyExpired) {
		t.Fatalf("expired: %v", err)
	}
	if _, err := s.RevokeAPIKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ActiveAPIKey(ctx, k.ID); !errors.Is(err, store.ErrInvalidAPIKey) {
		t.Fatalf("revoked: %v", err)
	}
}
