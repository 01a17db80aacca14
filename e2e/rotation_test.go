package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// rotationReceiver is an HTTPS receiver that verifies every delivery with one secret at a time
// (set), both schemes — X-Svc-Signature by the kit's independent verifier and webhook-signature
// by the Standard Webhooks reference library — and answers 401 when that secret does not
// verify, 200 otherwise. It also records, per delivery, which of the secrets it knows verify.
type rotationReceiver struct {
	*testenv.Receiver
	mu      sync.Mutex
	secret  string
	known   []string
	checked []map[string]bool // per delivery: secret → verified (both schemes)
}

func newRotationReceiver(t *testing.T) *rotationReceiver {
	rr := &rotationReceiver{}
	rr.Receiver = testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(_ int, w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rr.mu.Lock()
		defer rr.mu.Unlock()
		ok := map[string]bool{}
		for _, s := range rr.known {
			ok[s] = verifiesBoth(s, r.Header, body)
		}
		rr.checked = append(rr.checked, ok)
		if !ok[rr.secret] {
			w.WriteHeader(http.StatusUnauthorized)
		}
	}})
	return rr
}

// verifiesBoth reports whether secret verifies both signature schemes of a delivery.
func verifiesBoth(secret string, h http.Header, body []byte) bool {
	if _, err := testenv.VerifySignature(secret, h, body); err != nil {
		return false
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	return err == nil && wh.Verify(body, h) == nil
}

// set makes the receiver accept only secret from now on (and know it).
func (rr *rotationReceiver) set(secret string) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.secret = secret
	for _, s := range rr.known {
		if s == secret {
			return
		}
	}
	rr.known = append(rr.known, secret)
}

// last returns, for the latest delivery, which known secrets verified it.
func (rr *rotationReceiver) last() map[string]bool {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return rr.checked[len(rr.checked)-1]
}

// TestSecretRotationReceivers: through Caddy (inbound → dispatcher → HTTPS receiver, the
// rotation through the management API), a receiver that verifies with the OLD secret only,
// then one that verifies with the NEW secret only, accepts every delivery throughout the grace
// — both X-Svc-Signature and webhook-signature, the latter checked by the Standard Webhooks
// reference library —; after the grace the old secret no longer verifies (401, then accepted
// once the receiver uses the new one), and the new one alone signs. The grace and the retry
// delay pass as the test ages the queue.
func TestSecretRotationReceivers(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	_, apiKey := e.fix.APIKey(t, e.org)
	e.channelOn(true, pnid)
	rc := newRotationReceiver(t)
	wh, old := e.fix.Webhook(t, e.org, rc.URL+"/hook", &testenv.WebhookOpts{Name: "r"})
	rc.set(old)
	const grace, retryDelay = time.Hour, time.Hour // (pass only when the test ages the queue)
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n retry_delays %s %s %s\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, retryDelay, retryDelay, retryDelay, testenv.CAFile(t, rc.Certificate()))
	origin := e.caddyWith("", appExtra, "handle /webhooks/upstream {\n wabarelay_inbound\n}\nhandle_path /v1/* {\n wabarelay_api\n}")

	n := 0
	deliver := func(what string) map[string]bool {
		t.Helper()
		n++
		body := upstreamBatch(map[string][2][]string{pnid: {{fmt.Sprint("rot", n)}, nil}})
		if status, b := signedPost(t, origin+"/webhooks/upstream", testAppSecret, body); status != 200 {
			t.Fatalf("inbound: %d %s", status, b)
		}
		// delivered and recorded: nothing in flight whose lease an ageing of the queue would end
		testenv.Eventually(t, testenv.Patience, func() bool { return len(rc.PerEvent()) == n && e.inFlight() == 0 }, "%s: the delivery", what)
		return rc.last()
	}
	if ok := deliver("before the rotation"); !ok[old] {
		t.Fatal("before the rotation: the secret does not verify")
	}

	req, _ := http.NewRequest("POST", origin+"/v1/webhooks/"+wh.ID.String()+"/rotate_secret", strings.NewReader(fmt.Sprintf(`{"grace_seconds": %d}`, int(grace/time.Second))))
	req.Header.Set("X-Api-Key", apiKey)
	req.Header.Set("Content-Type", "application/json")
	r := do(t, req)
	var rotated struct {
		HMACSecret string `json:"hmac_secret"`
		Until      string `json:"previous_secret_expires_at"`
	}
	if err := json.Unmarshal(r.body, &rotated); r.status != 200 || err != nil || rotated.HMACSecret == "" {
		t.Fatalf("rotate: %d %s", r.status, r.body)
	}
	until, err := time.Parse(time.RFC3339, rotated.Until)
	if err != nil {
		t.Fatalf("previous_secret_expires_at %q: %v", rotated.Until, err)
	}
	fresh := rotated.HMACSecret
	rc.set(fresh) // known from now on

	// throughout the grace every delivery verifies with each secret: receivers that verify with
	// the old secret only and with the new one only (in turns) accept all of them; a delivery
	// every tenth of the grace, the queue aged by a tenth between them, the last in its last tenth
	const deliveries = 10
	var aged time.Duration // how far the queue has aged since the rotation
	for i := range deliveries {
		if i > 0 {
			e.fix.AgeQueue(t, grace/deliveries)
			aged += grace / deliveries
		}
		rc.set([]string{old, fresh}[i%2])
		if ok := deliver(fmt.Sprint("during the grace, delivery ", i)); !ok[old] || !ok[fresh] {
			t.Fatalf("during the grace (%v left): verified %v, want both secrets", time.Until(until)-aged, ok)
		}
	}
	t.Logf("%d deliveries during the grace, each verified by both secrets", deliveries)

	// after the grace: the old secret fails (401, retried after the retry delay), the new one
	// alone verifies
	rc.set(old)
	e.fix.AgeQueue(t, grace-aged+grace/deliveries)
	if n := e.countRows(`SELECT count(*) FROM webhooks WHERE previous_secret_expires_at > now()`); n != 0 {
		t.Fatalf("the grace has not ended after the queue aged past it")
	}
	n++
	body := upstreamBatch(map[string][2][]string{pnid: {{fmt.Sprint("rot", n)}, nil}})
	if status, b := signedPost(t, origin+"/webhooks/upstream", testAppSecret, body); status != 200 {
		t.Fatalf("inbound: %d %s", status, b)
	}
	testenv.Eventually(t, testenv.Patience, func() bool {
		return e.countRows(`SELECT count(*) FROM deliveries WHERE last_status_code = 401`) > 0
	}, "the old-only receiver to refuse a delivery after the grace")
	if ok := rc.last(); ok[old] || !ok[fresh] {
		t.Fatalf("after the grace: verified %v, want the new secret only", ok)
	}
	rc.set(fresh)
	if n := e.retriesScheduled(); n != 1 {
		t.Fatalf("%d retries scheduled after the refusal, want 1", n)
	}
	e.fix.AgeQueue(t, retryDelay)
	testenv.Eventually(t, testenv.Patience, func() bool { return e.undelivered() == 0 }, "the refused delivery accepted with the new secret")
	if ok := rc.last(); ok[old] || !ok[fresh] {
		t.Fatalf("after the grace: verified %v, want the new secret only", ok)
	}
}
