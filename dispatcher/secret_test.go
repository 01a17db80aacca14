package dispatcher

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestUndecryptableSecretFails: a delivery whose webhook secret cannot be decrypted (the
// stored secret was sealed with another key) is handed back a few times, then fails for good
// with the reason in the delivery log — logged once, not every few seconds forever — and the
// receiver is never called.
func TestUndecryptableSecretFails(t *testing.T) {
	e := newEnv(t)
	e.useClock()
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	wid, _ := e.webhook(rc.URL + "/h")
	if _, err := e.pool.Exec(context.Background(),
		`UPDATE webhooks SET secret_enc = decode('00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff', 'hex') WHERE id = $1`, wid); err != nil {
		t.Fatal(err)
	}
	ids := e.events(1)
	core, logs := observer.New(zap.InfoLevel)
	runWithSecrets(t, e, rc, e.st.WebhookSecret, zap.New(core)) // as the app wires the store
	for k := range maxSecretFailures - 1 {
		e.handedBack(ids[0], k+1)
	}

	var status, lastErr string
	testenv.Eventually(t, 20*time.Second, func() bool {
		if err := e.pool.QueryRow(context.Background(), `SELECT status, coalesce(last_error, '') FROM deliveries WHERE event_id = $1`, ids[0]).Scan(&status, &lastErr); err != nil {
			t.Fatal(err)
		}
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
	e.useClock()
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
	e.handedBack(ids[0], 1)
	var status string
	testenv.Eventually(t, 20*time.Second, func() bool {
		if err := e.pool.QueryRow(context.Background(), `SELECT status FROM deliveries WHERE event_id = $1`, ids[0]).Scan(&status); err != nil {
			t.Fatal(err)
		}
		return status == "delivered"
	}, "delivery after a panic")
	if logs.FilterMessageSnippet("panicked").Len() != 1 {
		t.Fatalf("panic not logged once: %v", logs.All())
	}
}

// runWithSecrets runs a dispatcher reading secrets with secrets and logging to logger until
// the test ends.
func runWithSecrets(t *testing.T, e *env, rc *testenv.Receiver, secrets Secrets, logger *zap.Logger) {
	t.Helper()
	e.launch(secrets, e.config(rc), logger)
}

// handedBack waits until the event's delivery has been handed back without an attempt for the
// n-th time (its n-th claim ended), due the secret retry's delay later by the env's clock, and
// moves the clock on by that delay.
func (e *env) handedBack(eventID uuid.UUID, n int) {
	e.t.Helper()
	const delay = 5 * time.Second // (Config.secretRetry's default)
	var due time.Time
	testenv.Eventually(e.t, patience, func() bool {
		var status string
		var claim, attempts int
		err := e.pool.QueryRow(context.Background(), `SELECT status, claim_seq, attempts, next_attempt_at FROM delivery_queue WHERE event_id = $1`,
			eventID).Scan(&status, &claim, &attempts, &due)
		return err == nil && status == "pending" && claim == n && attempts == 0
	}, "hand-back %d", n)
	if want := e.clk.Now().Add(delay); !due.Equal(want) {
		e.t.Fatalf("handed back due at %v, want %v after %v", due, delay, e.clk.Now())
	}
	e.clk.Advance(delay)
}
