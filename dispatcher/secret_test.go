package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/wabarelay/wabarelay/internal/testenv"

	"github.com/wabarelay/wabarelay/secretbox"
)

// TestUndecryptableSecretFails: a delivery whose webhook secret cannot be decrypted (the
// stored secret was sealed with another key) is handed back a few times, then fails for good
// with the reason in the delivery log — logged once, not every few seconds forever — and the
// receiver is never called.
func TestUndecryptableSecretFails(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	wid, _ := e.webhook(rc.URL + "/h")
	if _, err := e.pool.Exec(context.Background(),
		`UPDATE webhooks SET secret_enc = decode('00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff', 'hex') WHERE id = $1`, wid); err != nil {
		t.Fatal(err)
	}
	ids := e.events(1)
	core, logs := observer.New(zap.InfoLevel)
	secrets := func(ctx context.Context, id uuid.UUID) (string, error) { // as the app wires the store
		s, err := e.st.WebhookSecret(ctx, id)
		if errors.Is(err, secretbox.ErrOpen) {
			err = fmt.Errorf("%w: %w", ErrSecretUnusable, err)
		}
		return s, err
	}
	runWithSecrets(t, e, rc, secrets, zap.New(core))

	var status, lastErr string
	testenv.Eventually(t, 20*time.Second, func() bool {
		e.pool.QueryRow(context.Background(), `SELECT status, coalesce(last_error, '') FROM deliveries WHERE event_id = $1`, ids[0]).Scan(&status, &lastErr)
		return status == "failed"
	}, "the delivery to fail")
	if !strings.Contains(lastErr, "cannot be decrypted") {
		t.Fatalf("last_error = %q", lastErr)
	}
	if n := logs.FilterMessageSnippet("cannot be decrypted").Len(); n != 1 {
		t.Fatalf("logged %d times, want once", n)
	}
	if len(rc.Deliveries()) != 0 {
		t.Fatal("the receiver was called without a signature")
	}
}

// TestAttemptPanicSurvived: a panic inside an attempt (here: in the secret lookup) is logged,
// the delivery is handed back, and the dispatcher goes on delivering.
func TestAttemptPanicSurvived(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	e.webhook(rc.URL + "/h")
	ids := e.events(1)
	core, logs := observer.New(zap.InfoLevel)
	var calls atomic.Int64
	secrets := func(ctx context.Context, id uuid.UUID) (string, error) {
		if calls.Add(1) == 1 {
			panic("secret store exploded")
		}
		return e.st.WebhookSecret(ctx, id)
	}
	runWithSecrets(t, e, rc, secrets, zap.New(core))
	var status string
	testenv.Eventually(t, 20*time.Second, func() bool {
		e.pool.QueryRow(context.Background(), `SELECT status FROM deliveries WHERE event_id = $1`, ids[0]).Scan(&status)
		return status == "delivered"
	}, "delivery after a panic")
	if logs.FilterMessageSnippet("panicked").Len() != 1 {
		t.Fatalf("panic not logged once: %v", logs.All())
	}
}

// runWithSecrets runs a dispatcher reading secrets with secrets and logging to logger, with
// quick secret retries, until the test ends.
func runWithSecrets(t *testing.T, e *env, rc *testenv.Receiver, secrets Secrets, logger *zap.Logger) {
	t.Helper()
	cfg := e.config(rc)
	cfg.secretRetry = 20 * time.Millisecond
	e.launch(secrets, cfg, logger)
}
