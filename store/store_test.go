package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

func TestAPIKeys(t *testing.T) {
	f := testenv.NewStore(t)
	s, pool := f.Store, f.Pool
	ctx := context.Background()
	org := f.Org(t)
	k, key, err := s.CreateAPIKey(ctx, org.ID, "ci", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(key) != 51 || key[:7] != "crt_pk_" || k.Prefix != key[:19] {
		t.Fatalf("key %q prefix %q", key, k.Prefix)
	}
	got, err := s.AuthenticateAPIKey(ctx, key)
	if err != nil || got.ID != k.ID || got.OrgID != org.ID {
		t.Fatalf("authenticate: %+v %v", got, err)
	}
	// same prefix, other secret
	if _, err := s.AuthenticateAPIKey(ctx, key[:19]+"0000000000000000000000000000000A"); !errors.Is(err, store.ErrInvalidAPIKey) {
		t.Fatalf("wrong secret: %v", err)
	}
	keys, err := s.ListAPIKeys(ctx, org.ID)
	if err != nil || len(keys) != 1 || keys[0].LastUsedAt == nil {
		t.Fatalf("list: %+v %v", keys, err)
	}
	if _, err := s.RevokeAPIKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AuthenticateAPIKey(ctx, key); !errors.Is(err, store.ErrInvalidAPIKey) {
		t.Fatalf("revoked: %v", err)
	}
	// a key with an expiry works until then, and not after (its expiry moved into the past
	// rather than waited for)
	later := time.Now().Add(time.Hour)
	k2, key2, _ := s.CreateAPIKey(ctx, org.ID, "", &later)
	if _, err := s.AuthenticateAPIKey(ctx, key2); err != nil {
		t.Fatalf("before expiry: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE id = $1`, k2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AuthenticateAPIKey(ctx, key2); !errors.Is(err, store.ErrAPIKeyExpired) {
		t.Fatalf("after expiry: %v", err)
	}
	// created already expired
	past := time.Now().Add(-time.Second)
	if _, key3, err := s.CreateAPIKey(ctx, org.ID, "", &past); err != nil {
		t.Fatal(err)
	} else if _, err := s.AuthenticateAPIKey(ctx, key3); !errors.Is(err, store.ErrAPIKeyExpired) {
		t.Fatalf("created expired: %v", err)
	}
	if _, _, err := s.CreateAPIKey(ctx, uuid.New(), "", nil); !errors.Is(err, store.ErrOrgNotFound) {
		t.Fatalf("unknown org: %v", err)
	}
}

// TestChannelByTokenAndDeactivate: lookup by token, operator deactivation, and concurrent
// deletes of a non-active channel.
func TestChannelByTokenAndDeactivate(t *testing.T) {
	f := testenv.NewStore(t)
	s := f.Store
	ctx := context.Background()
	org := f.Org(t)
	c := f.Channel(t, org.ID)
	got, err := s.ChannelByToken(ctx, c.ChannelToken)
	if err != nil || got.ID != c.ID {
		t.Fatalf("by token: %v", err)
	}
	if _, err := s.ChannelByToken(ctx, c.ChannelToken+"x"); !errors.Is(err, store.ErrChannelNotFound) {
		t.Fatalf("wrong token: %v", err)
	}
	d, err := s.DeactivateChannel(ctx, c.ID)
	if err != nil || d.Status != store.ChannelInactive || d.InactiveReason == nil || *d.InactiveReason != "operator" {
		t.Fatalf("deactivate: %+v %v", d, err)
	}
	// Four deletes at once: one deletes the channel, the others find nothing.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i] = s.DeleteChannel(ctx, org.ID, c.ID, false) }()
	}
	wg.Wait()
	deleted := 0
	for _, err := range errs {
		switch {
		case err == nil:
			deleted++
		case !errors.Is(err, store.ErrChannelNotFound):
			t.Errorf("concurrent delete: %v", err)
		}
	}
	if deleted != 1 {
		t.Errorf("%d of 4 concurrent deletes deleted the channel, want 1", deleted)
	}
	if _, err := s.GetChannel(ctx, org.ID, c.ID); !errors.Is(err, store.ErrChannelNotFound) {
		t.Fatalf("inactive channel not deleted: %v", err)
	}
}

// TestAdmitChannelObjectsHugeIDs: ids handed to a channel through relay answers are recorded
// when they are text of at most MaxObjectIDLen bytes; a longer one (the scope's primary key would
// refuse one of a few kilobytes) is skipped without failing the others.
func TestAdmitChannelObjectsHugeIDs(t *testing.T) {
	f := testenv.NewStore(t)
	s := f.Store
	ctx := context.Background()
	org := f.Org(t)
	c := f.Channel(t, org.ID)
	okID := hugeText(store.MaxObjectIDLen)
	ids := []string{"tpl-1", hugeText(store.MaxObjectIDLen + 1), hugeText(256 << 10), hugeText(1 << 20), okID}
	admitted, err := s.AdmitChannelObjects(ctx, c.ID, store.ObjectTemplate, ids)
	if err != nil {
		t.Fatalf("admit with huge ids: %v", err)
	}
	if len(admitted) != 2 || !(admitted[0] == "tpl-1" || admitted[1] == "tpl-1") || !(admitted[0] == okID || admitted[1] == okID) {
		t.Fatalf("admitted %d ids, want tpl-1 and the %d-byte id", len(admitted), store.MaxObjectIDLen)
	}
}
