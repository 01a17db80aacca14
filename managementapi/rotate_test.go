package managementapi_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/store"
)

// TestRotateSecret: POST /webhooks/:id/rotate_secret answers 200 with the new hmac_secret (this
// once: GET and the list never show it) and previous_secret_expires_at — default a day ahead, as
// asked with grace_seconds, null with 0 —, which GET and the list show too (null when none);
// the old secret then signs beside the new one (store). Bad grace values are 422 with the exact
// message; another org's webhook and a malformed id 404; bodies are checked as elsewhere.
func TestRotateSecret(t *testing.T) {
	e := newEnv(t)
	w := e.createWebhook(e.keyA, `{"name":"All","url":"https://hooks.example.com/in","events":["messages"]}`)
	if r := e.do("GET", "/webhooks/"+w.ID, e.keyA, "").object(t); r["previous_secret_expires_at"] != nil {
		t.Fatalf("a new webhook shows a previous secret: %v", r)
	}
	path := "/webhooks/" + w.ID + "/rotate_secret"
	wid := uuid.MustParse(w.ID)

	rotate := func(body string, wantGrace time.Duration) map[string]any {
		t.Helper()
		before := time.Now().Add(-time.Second)
		r := e.do("POST", path, e.keyA, body) // "": no body at all, no Content-Type
		if r.status != 200 {
			t.Fatalf("rotate %q: %d %s", body, r.status, r.body)
		}
		m := r.object(t)
		secret, _ := m["hmac_secret"].(string)
		if !strings.HasPrefix(secret, "whsec_") || m["id"] != w.ID {
			t.Fatalf("rotate %q: %v", body, m)
		}
		if got, err := e.Store.WebhookSecret(context.Background(), wid); err != nil || got != secret {
			t.Fatalf("the answer's secret is not the webhook's: %v", err)
		}
		exp := m["previous_secret_expires_at"]
		if wantGrace == 0 {
			if exp != nil {
				t.Fatalf("grace 0: previous_secret_expires_at = %v", exp)
			}
			return m
		}
		at, err := time.Parse(time.RFC3339, exp.(string))
		if err != nil || at.Before(before.Add(wantGrace)) || at.After(time.Now().Add(wantGrace+time.Second)) {
			t.Fatalf("previous_secret_expires_at = %v, want about now + %v", exp, wantGrace)
		}
		return m
	}

	old := *w.HMACSecret
	m := rotate("", store.DefaultSecretGrace)
	if prev, _, err := e.Store.PreviousWebhookSecret(context.Background(), wid); err != nil || prev != old {
		t.Fatalf("the old secret does not sign on: %v", err)
	}
	for _, p := range []string{"/webhooks/" + w.ID, "/webhooks"} {
		r := e.do("GET", p, e.keyA, "")
		if bytes.Contains(r.body, []byte("hmac_secret")) || bytes.Contains(r.body, []byte(m["hmac_secret"].(string))) ||
			!bytes.Contains(r.body, []byte(`"previous_secret_expires_at":"`+m["previous_secret_expires_at"].(string)+`"`)) {
			t.Fatalf("GET %s: %s", p, r.body)
		}
	}
	rotate(`{}`, store.DefaultSecretGrace)
	rotate(`{"grace_seconds": null}`, store.DefaultSecretGrace)
	rotate(`{"grace_seconds": 3600}`, time.Hour)
	rotate(`{"grace_seconds": 604800}`, store.MaxSecretGrace)
	rotate(`{"grace_seconds": 0}`, 0)
	if r := e.do("GET", "/webhooks/"+w.ID, e.keyA, "").object(t); r["previous_secret_expires_at"] != nil {
		t.Fatalf("after grace 0: %v", r)
	}

	const msg = `"grace_seconds" must be an integer between 0 and 604800`
	for _, body := range []string{`{"grace_seconds": -1}`, `{"grace_seconds": 604801}`, `{"grace_seconds": 1.5}`,
		`{"grace_seconds": "3600"}`, `{"grace_seconds": true}`, `{"grace_seconds": 1e3}`, `{"grace_seconds": 99999999999999999999}`} {
		expectError(t, e.do("POST", path, e.keyA, body), 422, msg)
	}
	expectError(t, e.do("POST", path, e.keyA, `[1]`), 400, "Invalid JSON body")
	expectError(t, e.do("POST", path, e.keyA, `{"grace_seconds": 1`), 400, "Invalid JSON body")
	huge := `{"pad":"` + strings.Repeat("a", 1<<20) + `"}`
	expectError(t, e.do("POST", path, e.keyA, huge), 413, "Request body too large")

	// another org's webhook, an unknown one and a malformed id: 404, nothing rotated
	before, _ := e.Store.WebhookSecret(context.Background(), wid)
	expectError(t, e.do("POST", path, e.keyB, `{"grace_seconds": 60}`), 404, "Webhook not found")
	expectError(t, e.do("POST", "/webhooks/"+uuid.NewString()+"/rotate_secret", e.keyA, ""), 404, "Webhook not found")
	expectError(t, e.do("POST", "/webhooks/nope/rotate_secret", e.keyA, `{"grace_seconds": -1}`), 404, "Webhook not found")
	if after, _ := e.Store.WebhookSecret(context.Background(), wid); after != before {
		t.Fatal("a refused rotation changed the secret")
	}
	expectError(t, e.do("GET", path, e.keyA, ""), 405, "Method not allowed")
}
