package managementapi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/managementapi"
)

var (
	msgWebhookLimit = fmt.Sprintf(managementapi.MsgWebhookLimit, managementapi.DefaultMaxWebhooksPerOrg)
	msgAPIKeyLimit  = fmt.Sprintf(managementapi.MsgAPIKeyLimit, managementapi.DefaultMaxAPIKeysPerOrg)
)

const hookBody = `{"name":"w","url":"https://crm.example.com/h","events":["messages"]}`

// fillWebhooks gives org n webhooks more, through the store (no cap).
func (e *env) fillWebhooks(org uuid.UUID, n int) {
	e.t.Helper()
	for i := 0; i < n; i++ {
		e.Webhook(e.t, org, "https://crm.example.com/h", &testenv.WebhookOpts{Name: fmt.Sprint("w", i)})
	}
}

// fillKeys gives org A n live keys more, through the store (no cap), and returns their ids.
func (e *env) fillKeys(n int) []string {
	e.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		k, _ := e.APIKey(e.t, e.orgA, &testenv.APIKeyOpts{Name: fmt.Sprint("k", i)})
		ids[i] = k.ID.String()
	}
	return ids
}

// TestWebhookCap: an org may have at most 100 webhooks by default: the 100th is created, the
// 101st is refused with 422 naming the limit, another org is not affected, and deleting one
// frees a slot.
func TestWebhookCap(t *testing.T) {
	e := newEnv(t)
	e.fillWebhooks(e.orgA, managementapi.DefaultMaxWebhooksPerOrg-1)
	last := e.createWebhook(e.keyA, hookBody) // the 100th
	expectError(t, e.do("POST", "/webhooks", e.keyA, hookBody), http.StatusUnprocessableEntity, msgWebhookLimit)
	if n := e.CountWhere(t, "webhooks", "org_id", e.orgA); n != managementapi.DefaultMaxWebhooksPerOrg {
		t.Fatalf("org A has %d webhooks", n)
	}
	e.createWebhook(e.keyB, hookBody) // the cap is per org
	if r := e.do("DELETE", "/webhooks/"+last.ID, e.keyA, ""); r.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	e.createWebhook(e.keyA, hookBody)
	expectError(t, e.do("POST", "/webhooks", e.keyA, hookBody), http.StatusUnprocessableEntity, msgWebhookLimit)
}

// TestWebhookCapConfigured: Options.MaxWebhooksPerOrg sets the cap and its message.
func TestWebhookCapConfigured(t *testing.T) {
	e := newEnv(t, func(o *managementapi.Options) { o.MaxWebhooksPerOrg = 2 })
	e.createWebhook(e.keyA, hookBody)
	e.createWebhook(e.keyA, hookBody)
	expectError(t, e.do("POST", "/webhooks", e.keyA, hookBody), http.StatusUnprocessableEntity,
		"Webhook limit reached: an organization may have at most 2 webhooks (wabarelay limits webhooks_per_org)")
}

// wideHandler returns a handler on e's database with a pool wide enough that every one of n
// concurrent requests holds a connection at once, so that their transactions really overlap.
func (e *env) wideHandler(n int) http.Handler {
	e.t.Helper()
	wide := testenv.NewStore(e.t, &testenv.StoreOpts{DSN: e.DSN, Key: e.Key, Pool: func(c *pgxpool.Config) { c.MaxConns = int32(n + 2) }})
	return managementapi.New(managementapi.Options{Store: wide.Store})
}

// parallel sends n identical requests at once and returns their statuses and bodies.
func parallel(h http.Handler, n int, method, path, key, body string) ([]int, []string) {
	statuses, bodies := make([]int, n), make([]string, n)
	var start, done sync.WaitGroup
	start.Add(1)
	for i := 0; i < n; i++ {
		done.Add(1)
		go func() {
			defer done.Done()
			r := httptest.NewRequest(method, path, strings.NewReader(body))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("X-Api-Key", key)
			rec := httptest.NewRecorder()
			start.Wait()
			h.ServeHTTP(rec, r)
			statuses[i], bodies[i] = rec.Code, rec.Body.String()
		}()
	}
	start.Done()
	done.Wait()
	return statuses, bodies
}

// createAtCap sends 20 identical creations (POST path with body, by key A) at once, with org A
// filled to cap-1 of table's rows, and checks that exactly one of them created a row (table then
// holds limit rows of org A) and that every other one was refused at the cap with msg.
func (e *env) createAtCap(path, body, table string, limit int, msg string) {
	e.t.Helper()
	const n = 20
	statuses, bodies := parallel(e.wideHandler(n), n, "POST", path, e.keyA, body)
	if got := e.CountWhere(e.t, table, "org_id", e.orgA); got != limit {
		e.t.Fatalf("org A has %d %s after %d concurrent creations at cap-1, want %d (statuses %v)", got, table, n, limit, statuses)
	}
	created := 0
	for i, s := range statuses {
		switch {
		case s == http.StatusCreated:
			created++
		case s != http.StatusUnprocessableEntity || !strings.Contains(bodies[i], msg):
			e.t.Fatalf("request %d: %d %s", i, s, bodies[i])
		}
	}
	if created != 1 {
		e.t.Fatalf("%d of %d concurrent creations at cap-1 succeeded, want 1", created, n)
	}
}

// TestWebhookCapConcurrent: 20 concurrent creations at cap-1 create one webhook, not 20.
func TestWebhookCapConcurrent(t *testing.T) {
	e := newEnv(t)
	e.fillWebhooks(e.orgA, managementapi.DefaultMaxWebhooksPerOrg-1)
	e.createAtCap("/webhooks", hookBody, "webhooks", managementapi.DefaultMaxWebhooksPerOrg, "Webhook limit reached")
}

// TestAPIKeyCap: an org may have at most 100 live API keys by default: the 100th is created
// through POST /api_keys, the 101st is refused with 422 naming the limit; a revoked key and an
// expired key each free a slot; the operator's store call (the CLI) is not capped.
func TestAPIKeyCap(t *testing.T) {
	e := newEnv(t)
	// org A has its test key; 98 more make 99 live keys, and an expired and a revoked key do not count
	ids := e.fillKeys(managementapi.DefaultMaxAPIKeysPerOrg - 2)
	past := time.Now().Add(-time.Minute)
	e.APIKey(t, e.orgA, &testenv.APIKeyOpts{Name: "old", ExpiresAt: &past})
	gone := e.createKey(e.keyA, `{"name":"gone"}`)
	if r := e.do("DELETE", "/api_keys/"+gone.ID, e.keyA, ""); r.status != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	e.createKey(e.keyA, `{"name":"100th"}`)
	expectError(t, e.do("POST", "/api_keys", e.keyA, `{"name":"101st"}`), http.StatusUnprocessableEntity, msgAPIKeyLimit)
	e.createKey(e.keyB, `{}`) // the cap is per org

	// revoking one frees a slot
	if r := e.do("DELETE", "/api_keys/"+ids[0], e.keyA, ""); r.status != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	e.createKey(e.keyA, `{}`)
	expectError(t, e.do("POST", "/api_keys", e.keyA, `{}`), http.StatusUnprocessableEntity, msgAPIKeyLimit)

	// a key reaching its expiry frees a slot
	e.Exec(t, `UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE id = $1`, ids[1])
	e.createKey(e.keyA, `{}`)
	expectError(t, e.do("POST", "/api_keys", e.keyA, `{}`), http.StatusUnprocessableEntity, msgAPIKeyLimit)

	// the operator is not capped
	e.APIKey(t, e.orgA, &testenv.APIKeyOpts{Name: "operator"}) // uncapped at the cap
}

// TestAPIKeyCapConcurrent: 20 concurrent POST /api_keys at cap-1 create one key, not 20.
func TestAPIKeyCapConcurrent(t *testing.T) {
	e := newEnv(t)
	e.fillKeys(managementapi.DefaultMaxAPIKeysPerOrg - 2) // + the test key: cap-1 live keys
	e.createAtCap("/api_keys", `{"name":"race"}`, "api_keys", managementapi.DefaultMaxAPIKeysPerOrg, "API key limit reached")
}

// TestShortLivedKeyCannotMintLongerLived: a key that expires can only create keys that expire
// no later than it does; "expires_in" is then required. A key without expiry creates any key.
func TestShortLivedKeyCannotMintLongerLived(t *testing.T) {
	e := newEnv(t)
	soon := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	_, short := e.APIKey(t, e.orgA, &testenv.APIKeyOpts{Name: "short", ExpiresAt: &soon})
	until := soon.Format(managementapi.TimeLayout)
	tooLong := `"expires_in" must not exceed the creating key's remaining lifetime: it expires at ` + until
	required := `"expires_in" is required: the creating key expires at ` + until + `, and a key cannot create a key that outlives it`
	for body, want := range map[string]string{
		`{}`:                                required,
		`{"expires_in":null}`:               required,
		`{"expires_in":"  "}`:               required,
		`{"expires_in":"2h"}`:               tooLong,
		`{"expires_in":"61m"}`:              tooLong,
		`{"expires_in":"90d"}`:              tooLong,
		`{"name":"x","expires_in":"8760h"}`: tooLong,
	} {
		expectError(t, e.do("POST", "/api_keys", short, body), http.StatusUnprocessableEntity, want)
	}
	before := e.CountWhere(t, "api_keys", "org_id", e.orgA)

	// within its lifetime: created, and the new key is bound the same way
	child := e.createKey(short, `{"name":"child","expires_in":"30m"}`)
	exp, err := time.Parse(time.RFC3339, *child.ExpiresAt)
	if err != nil || exp.After(soon) {
		t.Fatalf("child expires at %s, after its creator (%s)", *child.ExpiresAt, until)
	}
	expectError(t, e.do("POST", "/api_keys", *child.Key, `{"expires_in":"45m"}`), http.StatusUnprocessableEntity,
		`"expires_in" must not exceed the creating key's remaining lifetime: it expires at `+*child.ExpiresAt)
	if n := e.CountWhere(t, "api_keys", "org_id", e.orgA); n != before+1 {
		t.Fatalf("org A has %d keys, want %d: a refused key was stored", n, before+1)
	}

	// a key without expiry creates keys without expiry, and long-lived ones
	if perm := e.createKey(e.keyA, `{"name":"permanent"}`); perm.ExpiresAt != nil {
		t.Fatalf("permanent key expires at %s", *perm.ExpiresAt)
	}
	if long := e.createKey(e.keyA, `{"expires_in":"90d"}`); long.ExpiresAt == nil {
		t.Fatal("90d key without expiry")
	}
}

// TestParseLifetime: Go durations, plus d for days (as the CLI's --expires-in always took).
func TestParseLifetime(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"720h": 720 * time.Hour, "90m": 90 * time.Minute, "90d": 90 * 24 * time.Hour, "1.5d": 36 * time.Hour,
		"1d12h": 36 * time.Hour, "1h30m": 90 * time.Minute, "0d": 0,
	} {
		if got, err := managementapi.ParseLifetime(in); err != nil || got != want {
			t.Errorf("ParseLifetime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", ".d", "30", "P30D", "1dd", "30x", "1e3d", "9999999999999d", strings.Repeat("1", 65) + "d"} {
		if got, err := managementapi.ParseLifetime(in); err == nil {
			t.Errorf("ParseLifetime(%q) = %v, want an error", in, got)
		}
	}
}
