package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestRotateWebhookSecret: a rotation replaces the current secret and keeps the old one as the
// previous secret until the grace ends (shown on the webhook, stored encrypted); a second
// rotation during the grace ends the older secret at once; grace 0 keeps none; a grace out of
// range, another org's webhook and an unknown one are refused; an expired grace leaves none.
func TestRotateWebhookSecret(t *testing.T) {
	ctx := context.Background()
	f := testenv.NewStore(t)
	org, other := f.Org(t), f.Org(t)
	w, first := f.Webhook(t, org.ID, "https://r.example/h")
	if w.PreviousSecretExpiresAt != nil {
		t.Fatalf("new webhook has a previous secret until %v", w.PreviousSecretExpiresAt)
	}
	if s, until, err := f.Store.PreviousWebhookSecret(ctx, w.ID); err != nil || s != "" || !until.IsZero() {
		t.Fatalf("previous secret of a new webhook: %q %v %v", s, until, err)
	}

	before := time.Now()
	rw, second, err := f.Store.RotateWebhookSecret(ctx, org.ID, w.ID, time.Hour)
	if err != nil || second == first || len(second) != len(first) || rw.ID != w.ID {
		t.Fatalf("rotate: %+v %q %v", rw, second, err)
	}
	if p := rw.PreviousSecretExpiresAt; p == nil || p.Before(before.Add(time.Hour-time.Minute)) || p.After(time.Now().Add(time.Hour+time.Minute)) {
		t.Fatalf("previous secret until %v, want in an hour", p)
	}
	if s, err := f.Store.WebhookSecret(ctx, w.ID); err != nil || s != second {
		t.Fatalf("current secret after rotation: %v", err)
	}
	if s, until, err := f.Store.PreviousWebhookSecret(ctx, w.ID); err != nil || s != first || !until.Equal(*rw.PreviousSecretExpiresAt) {
		t.Fatalf("previous secret: %q %v %v", s, until, err)
	}
	if g, err := f.Store.GetWebhook(ctx, org.ID, w.ID); err != nil || g.PreviousSecretExpiresAt == nil || !g.PreviousSecretExpiresAt.Equal(*rw.PreviousSecretExpiresAt) {
		t.Fatalf("get webhook: %+v %v", g, err)
	}
	// encrypted at rest, bound to its column and row
	if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM webhooks WHERE id = $1
		AND position($2::bytea IN previous_secret_enc) = 0 AND previous_secret_enc <> secret_enc`, w.ID, []byte(first)); n != 1 {
		t.Fatal("previous secret stored in the clear")
	}

	// a second rotation during the grace: the first secret ends at once
	_, third, err := f.Store.RotateWebhookSecret(ctx, org.ID, w.ID, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if s, _, err := f.Store.PreviousWebhookSecret(ctx, w.ID); err != nil || s != second {
		t.Fatalf("previous secret after a second rotation: %q (first %q) %v", s, first, err)
	}

	// grace 0: no previous secret at all
	rw, fourth, err := f.Store.RotateWebhookSecret(ctx, org.ID, w.ID, 0)
	if err != nil || rw.PreviousSecretExpiresAt != nil || fourth == third {
		t.Fatalf("grace 0: %+v %v", rw, err)
	}
	if s, _, err := f.Store.PreviousWebhookSecret(ctx, w.ID); err != nil || s != "" {
		t.Fatalf("previous secret after grace 0: %q %v", s, err)
	}
	if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM webhooks WHERE id = $1 AND previous_secret_enc IS NULL`, w.ID); n != 1 {
		t.Fatal("grace 0 kept the old secret")
	}

	// an expired grace leaves none
	if _, _, err := f.Store.RotateWebhookSecret(ctx, org.ID, w.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	f.Exec(t, `UPDATE webhooks SET previous_secret_expires_at = now() - interval '1 second' WHERE id = $1`, w.ID)
	if s, _, err := f.Store.PreviousWebhookSecret(ctx, w.ID); err != nil || s != "" {
		t.Fatalf("previous secret after its grace: %q %v", s, err)
	}
	if g, _ := f.Store.GetWebhook(ctx, org.ID, w.ID); g.PreviousSecretExpiresAt != nil {
		t.Fatalf("webhook shows an expired grace: %v", g.PreviousSecretExpiresAt)
	}

	for name, c := range map[string]struct {
		grace time.Duration
		want  error
	}{
		"negative grace": {-time.Second, store.ErrSecretGrace},
		"grace too long": {store.MaxSecretGrace + time.Second, store.ErrSecretGrace},
	} {
		if _, _, err := f.Store.RotateWebhookSecret(ctx, org.ID, w.ID, c.grace); !errors.Is(err, c.want) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, _, err := f.Store.RotateWebhookSecret(ctx, other.ID, w.ID, time.Hour); !errors.Is(err, store.ErrWebhookNotFound) {
		t.Errorf("another org's webhook: %v", err)
	}
	if _, _, err := f.Store.RotateWebhookSecret(ctx, org.ID, other.ID, time.Hour); !errors.Is(err, store.ErrWebhookNotFound) {
		t.Errorf("unknown webhook: %v", err)
	}
	if _, _, err := f.Store.RotateWebhookSecret(ctx, org.ID, w.ID, store.MaxSecretGrace); err != nil {
		t.Errorf("the longest grace: %v", err)
	}
}

// TestRekeyPreviousSecret: Rekey re-encrypts a rotated webhook's previous secret too; the new key
// alone then opens it.
func TestRekeyPreviousSecret(t *testing.T) {
	ctx := context.Background()
	w := newRekeyWorld(t, 1)
	id := anyKey(w.webhooks)
	_, secret, err := w.fix.Store.RotateWebhookSecret(ctx, w.org, id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	old := w.webhooks[id]
	w.webhooks[id] = secret
	res, err := w.fix.StoreWith(t, w.b, w.a).Rekey(ctx, store.RekeyOptions{})
	if err != nil || res.Rekeyed != w.values()+1 {
		t.Fatalf("rekey: %+v %v, want %d", res, err, w.values()+1)
	}
	w.check(t, w.b)
	if s, _, err := w.fix.StoreWith(t, w.b).PreviousWebhookSecret(ctx, id); err != nil || s != old {
		t.Fatalf("previous secret under the new key: %q %v", s, err)
	}
}

// TestRotationGraceByTheClock: a rotation's grace starts at the store's time and ends by it, to
// the microsecond, in the previous secret's read and in the webhook's reads; the clock is an
// hour ahead of the database's, so that a grace taken by the database's time shows.
func TestRotationGraceByTheClock(t *testing.T) {
	ctx := context.Background()
	f := testenv.NewStore(t)
	clk := clock.NewStub(time.Now().Add(time.Hour))
	f.Store.SetClock(clk)
	org := f.Org(t)
	w, first := f.Webhook(t, org.ID, "https://r.example/h")
	rw, _, err := f.Store.RotateWebhookSecret(ctx, org.ID, w.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	until := clk.Now().Add(time.Minute)
	if p := rw.PreviousSecretExpiresAt; p == nil || !p.Equal(until) {
		t.Fatalf("rotated: previous secret until %v, want %v", p, until)
	}
	check := func(at time.Time, signs bool) {
		t.Helper()
		clk.Set(at)
		s, got, err := f.Store.PreviousWebhookSecret(ctx, w.ID)
		if err != nil || (s == first) != signs || signs && !got.Equal(until) || !signs && (s != "" || !got.IsZero()) {
			t.Fatalf("at %v: previous secret %q until %v (%v); want it signing: %v", at, s, got, err, signs)
		}
		g, err := f.Store.GetWebhook(ctx, org.ID, w.ID)
		if err != nil || (g.PreviousSecretExpiresAt != nil) != signs {
			t.Fatalf("at %v: webhook shows the grace until %v (%v); want it shown: %v", at, g.PreviousSecretExpiresAt, err, signs)
		}
		ws, err := f.Store.ListWebhooks(ctx, org.ID)
		if err != nil || len(ws) != 1 || (ws[0].PreviousSecretExpiresAt != nil) != signs {
			t.Fatalf("at %v: list shows %+v (%v); want the grace shown: %v", at, ws, err, signs)
		}
	}
	check(until.Add(-time.Microsecond), true)
	check(until, false)
}
