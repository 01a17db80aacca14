package dispatcher

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// signatures counts the v1 entries of a delivery's X-Svc-Signature and webhook-signature.
func signatures(h map[string][]string) (svc, sw int) {
	get := func(k string) string {
		if v := h[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	return strings.Count(get("X-Svc-Signature"), ",v1="), len(strings.Fields(get("Webhook-Signature")))
}

// TestSignSeveralSecrets: Sign with older secrets adds one v1 entry per secret to both headers,
// the current secret's first, each verifying on its own (testenv.VerifySignature, an
// independent implementation); without them the headers are those of one secret.
func TestSignSeveralSecrets(t *testing.T) {
	cur, old := store.NewWebhookSecret(), store.NewWebhookSecret()
	id, at, body := uuid.New(), time.Unix(1700000000, 0), []byte(`{"type":"messages"}`)
	svc1, _, _, sig1 := Sign(cur, id, at, body)
	svc, wid, ts, sig := Sign(cur, id, at, body, old)
	if !strings.HasPrefix(svc, svc1+",v1=") || !strings.HasPrefix(sig, sig1+" v1,") {
		t.Fatalf("rotated headers %q %q do not start with the current secret's %q %q", svc, sig, svc1, sig1)
	}
	h := map[string][]string{"X-Svc-Signature": {svc}, "Webhook-Id": {wid}, "Webhook-Timestamp": {ts}, "Webhook-Signature": {sig}}
	if n, m := signatures(h); n != 2 || m != 2 {
		t.Fatalf("%d and %d signatures, want 2 and 2", n, m)
	}
	for _, s := range []string{cur, old} {
		if _, err := testenv.VerifySignature(s, h, body); err != nil {
			t.Errorf("does not verify with one of the secrets: %v", err)
		}
	}
	if _, err := testenv.VerifySignature(store.NewWebhookSecret(), h, body); err == nil {
		t.Error("verifies with a third secret")
	}
}

// TestRotationSignsWithBoth: after a rotation every attempt is signed with the new and the old
// secret — at once, although the old secret was cached — until the grace ends by the
// dispatcher's clock, to the microsecond (while cached too); a second rotation drops the older
// secret, and grace 0 signs with the new one only.
func TestRotationSignsWithBoth(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	clk := e.useClock()
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	wid, first := e.webhook(rc.URL + "/h")
	cfg := e.config(rc)
	cfg.PreviousSecrets = e.st.PreviousWebhookSecret
	// The test moves the clock 31 s in all: with the default 30 s lease, a delivery whose
	// outcome was not recorded yet (a loaded machine) was reclaimed and delivered again, and
	// that copy was taken for the next delivery. A claim outlives every move here.
	cfg.Lease = time.Hour
	e.start(cfg)

	n := 0
	next := func(want int, verify, refuse []string) {
		t.Helper()
		e.events(1)
		n++
		d := rc.WaitN(t, n)[n-1]
		if svc, sw := signatures(d.Header); svc != want || sw != want {
			t.Fatalf("delivery %d: %d and %d signatures, want %d: %v", n, svc, sw, want, d.Header)
		}
		for _, s := range verify {
			if _, err := testenv.VerifySignature(s, d.Header, d.Body); err != nil {
				t.Fatalf("delivery %d: %v", n, err)
			}
		}
		for _, s := range refuse {
			if _, err := testenv.VerifySignature(s, d.Header, d.Body); err == nil {
				t.Fatalf("delivery %d verifies with a secret that ended", n)
			}
		}
	}
	rotate := func(grace time.Duration) (string, time.Time) {
		t.Helper()
		w, s, err := e.st.RotateWebhookSecret(ctx, e.org, wid, grace)
		if err != nil {
			t.Fatal(err)
		}
		if w.PreviousSecretExpiresAt == nil {
			return s, time.Time{}
		}
		return s, *w.PreviousSecretExpiresAt
	}

	next(1, []string{first}, nil) // the first secret is cached now
	second, _ := rotate(time.Hour)
	next(2, []string{first, second}, nil)
	// a grace shorter than the secret cache's minute: it ends while the secrets are cached
	third, until := rotate(30 * time.Second)
	if want := clk.Now().Add(30 * time.Second); !until.Equal(want) {
		t.Fatalf("grace until %v, want %v (30 s after the clock's time)", until, want)
	}
	next(2, []string{second, third}, []string{first})
	clk.Set(until.Add(-time.Microsecond)) // the grace's last microsecond
	next(2, []string{second, third}, []string{first})
	clk.Set(until) // the grace is over
	next(1, []string{third}, []string{second})
	// The cache tells rotations apart by the end of their grace, which the claims carry: grace
	// 0 at the very microsecond the last grace ended (which only a stubbed clock makes likely)
	// would look like no rotation, so the next one comes a second later.
	clk.Advance(time.Second)
	fourth, _ := rotate(0)
	next(1, []string{fourth}, []string{third})
}
