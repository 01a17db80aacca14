package caddymodule

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestCLIRotateSecret: `caddy wabarelay webhook rotate-secret --id … [--grace …]` prints the
// webhook with its new secret once (the store's from then on) and when the old one stops
// signing (default a day, none with --grace 0s); it needs the encryption key, refuses a grace
// out of range and names an unknown webhook.
func TestCLIRotateSecret(t *testing.T) {
	f := testenv.NewStore(t)
	org := f.Org(t)
	wh, old := f.Webhook(t, org.ID, "https://r.example/h")
	t.Setenv("WABARELAY_DATABASE_URL", f.DSN)
	t.Setenv("WABARELAY_ENCRYPTION_KEY", f.KeyB64)

	check := func(args []string, grace time.Duration) string {
		t.Helper()
		before := time.Now().Add(-time.Second)
		out, err := runCLITest(t, append([]string{"webhook", "rotate-secret", "--id", wh.ID.String()}, args...)...)
		if err != nil || len(out) != 1 || out[0]["id"] != wh.ID.String() || out[0]["org_id"] != org.ID.String() {
			t.Fatalf("rotate-secret %v: %v %v", args, out, err)
		}
		secret, _ := out[0]["hmac_secret"].(string)
		if got, err := f.Store.WebhookSecret(t.Context(), wh.ID); err != nil || got != secret || secret == old {
			t.Fatalf("rotate-secret %v printed %q, the webhook has %q (%v)", args, secret, got, err)
		}
		exp, _ := out[0]["previous_secret_expires_at"].(string)
		if grace == 0 {
			if exp != "" {
				t.Fatalf("--grace 0s: previous_secret_expires_at %v", out[0]["previous_secret_expires_at"])
			}
			return secret
		}
		at, err := time.Parse(time.RFC3339, exp)
		if err != nil || at.Before(before.Add(grace)) || at.After(time.Now().Add(grace+time.Second)) {
			t.Fatalf("rotate-secret %v: previous_secret_expires_at %q, want about now + %v", args, exp, grace)
		}
		return secret
	}
	second := check(nil, store.DefaultSecretGrace)
	if prev, _, err := f.Store.PreviousWebhookSecret(t.Context(), wh.ID); err != nil || prev != old {
		t.Fatalf("the old secret does not sign on: %v", err)
	}
	check([]string{"--grace", "2h"}, 2*time.Hour)
	if prev, _, _ := f.Store.PreviousWebhookSecret(t.Context(), wh.ID); prev != second {
		t.Fatal("a second rotation kept the older secret")
	}
	check([]string{"--grace", "0s"}, 0)

	for _, g := range []string{"-1s", "169h", "soon"} {
		if _, err := runCLITest(t, "webhook", "rotate-secret", "--id", wh.ID.String(), "--grace", g); err == nil || !strings.Contains(err.Error(), "--grace") {
			t.Errorf("--grace %s: %v", g, err)
		}
	}
	if _, err := runCLITest(t, "webhook", "rotate-secret", "--id", uuid.NewString()); !errors.Is(err, store.ErrWebhookNotFound) {
		t.Errorf("unknown webhook: %v", err)
	}
	t.Setenv("WABARELAY_ENCRYPTION_KEY", "")
	if _, err := runCLITest(t, "webhook", "rotate-secret", "--id", wh.ID.String()); err == nil || !strings.Contains(err.Error(), "WABARELAY_ENCRYPTION_KEY") {
		t.Errorf("without a key: %v", err)
	}
}
