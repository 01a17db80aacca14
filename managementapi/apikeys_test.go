package managementapi_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/ratelimit"
)

// apiKeyJSON is an API key as the API shows it; Key is set only by POST /api_keys.
type apiKeyJSON struct {
	ID         string  `json:"id"`
	Name       string  `json:"name"`
	Prefix     string  `json:"prefix"`
	CreatedAt  string  `json:"created_at"`
	ExpiresAt  *string `json:"expires_at"`
	RevokedAt  *string `json:"revoked_at"`
	LastUsedAt *string `json:"last_used_at"`
	Key        *string `json:"key"`
}

var keyRe = regexp.MustCompile(`^crt_pk_[0-9A-Za-z]{44}$`)

func (e *env) createKey(key, body string) apiKeyJSON {
	e.t.Helper()
	k := created[apiKeyJSON](e, "/api_keys", key, body)
	if k.Key == nil || !keyRe.MatchString(*k.Key) {
		e.t.Fatalf("created key = %+v", k)
	}
	return k
}

func (e *env) listKeys(key string) ([]apiKeyJSON, response) {
	e.t.Helper()
	r := e.do("GET", "/api_keys", key, "")
	if r.status != http.StatusOK {
		e.t.Fatalf("list api keys: %d %s", r.status, r.body)
	}
	var ks []apiKeyJSON
	r.json(e.t, &ks)
	return ks, r
}

// TestAPIKeyLifecycle: create (shown once), list (never the key), use, revoke (idempotent), and
// a key revoking itself.
func TestAPIKeyLifecycle(t *testing.T) {
	e := newEnv(t)
	before := time.Now()
	r := e.do("POST", "/api_keys", e.keyA, `{"name":"  Contractor  ","expires_in":"720h"}`)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	m := r.object(t)
	if len(m) != 8 || m["revoked_at"] != nil || m["last_used_at"] != nil {
		t.Fatalf("create = %s", r.body)
	}
	for _, f := range []string{"revoked_at", "last_used_at"} {
		if _, ok := m[f]; !ok {
			t.Fatalf("%s absent: %s", f, r.body)
		}
	}
	var made apiKeyJSON
	r.json(t, &made)
	if made.Name != "Contractor" || made.Key == nil || !keyRe.MatchString(*made.Key) || made.Prefix != (*made.Key)[:19] ||
		!tsRe.MatchString(made.CreatedAt) || made.ExpiresAt == nil || !tsRe.MatchString(*made.ExpiresAt) {
		t.Fatalf("create = %s", r.body)
	}
	exp, _ := time.Parse(time.RFC3339, *made.ExpiresAt)
	if d := exp.Sub(before); d < 720*time.Hour-time.Second || d > 720*time.Hour+5*time.Second {
		t.Fatalf("expires_at is %v after creation, want 720h", d)
	}
	plain := e.createKey(e.keyA, `{}`)
	if plain.Name != "" || plain.ExpiresAt != nil {
		t.Fatalf("key without fields = %+v", plain)
	}
	// an expired key stays listed
	past := time.Now().Add(-time.Minute)
	expired, _ := e.APIKey(t, e.orgA, &testenv.APIKeyOpts{Name: "old", ExpiresAt: &past})

	// the new key works; the list shows every key in creation order, with its use, never a key
	if r := e.do("GET", "/channels", *made.Key, ""); r.status != 200 {
		t.Fatalf("new key: %d %s", r.status, r.body)
	}
	list, lr := e.listKeys(*plain.Key)
	if len(list) != 4 || list[1].ID != made.ID || list[2].ID != plain.ID || list[3].ID != expired.ID.String() {
		t.Fatalf("list = %s", lr.body)
	}
	rows, err := e.Pool.Query(context.Background(), `SELECT id::text FROM api_keys WHERE org_id = $1 ORDER BY created_at, id`, e.orgA)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; rows.Next(); i++ {
		var id string
		if err := rows.Scan(&id); err != nil || list[i].ID != id {
			t.Fatalf("list not ordered by (created_at, id): %s", lr.body)
		}
	}
	rows.Close()
	if list[1].Prefix != made.Prefix || list[1].Name != "Contractor" || *list[1].ExpiresAt != *made.ExpiresAt ||
		list[1].CreatedAt != made.CreatedAt || list[1].LastUsedAt == nil || list[3].ExpiresAt == nil {
		t.Fatalf("list = %s", lr.body)
	}
	for _, k := range []string{e.keyA, *made.Key, *plain.Key} {
		if bytes.Contains(lr.body, []byte(k)) || bytes.Contains(lr.body, []byte(`"key"`)) {
			t.Fatalf("a key in the list: %s", lr.body)
		}
	}
	// only hashes are stored
	if inClear := testenv.QueryValue[int](t, e.Fixture, `SELECT count(*) FROM api_keys WHERE key_hash = $1 OR name = $2 OR prefix = $2`,
		[]byte(*made.Key), *made.Key); inClear != 0 {
		t.Fatalf("key stored in clear: %d", inClear)
	}

	// revoke: 204, the key stops working, the record stays with revoked_at; again: 204, same time
	r = e.do("DELETE", "/api_keys/"+made.ID, e.keyA, "")
	if r.status != 204 || len(r.body) != 0 {
		t.Fatalf("revoke = %d %q", r.status, r.body)
	}
	expectError(t, e.do("GET", "/channels", *made.Key, ""), 401, "Invalid or revoked API key")
	list, lr = e.listKeys(e.keyA)
	if len(list) != 4 || list[1].RevokedAt == nil || !tsRe.MatchString(*list[1].RevokedAt) || list[2].RevokedAt != nil {
		t.Fatalf("after revoke: %s", lr.body)
	}
	revokedAt := *list[1].RevokedAt
	if r := e.do("DELETE", "/api_keys/"+made.ID, *plain.Key, ""); r.status != 204 {
		t.Fatalf("revoke again = %d %s", r.status, r.body)
	}
	if list, _ = e.listKeys(e.keyA); *list[1].RevokedAt != revokedAt {
		t.Fatalf("revoked_at moved: %s → %s", revokedAt, *list[1].RevokedAt)
	}

	// a key may revoke itself; the call succeeds and the next one is refused
	if r := e.do("DELETE", "/api_keys/"+plain.ID, *plain.Key, ""); r.status != 204 {
		t.Fatalf("self-revoke = %d %s", r.status, r.body)
	}
	expectError(t, e.do("GET", "/api_keys", *plain.Key, ""), 401, "Invalid or revoked API key")
	expectError(t, e.do("DELETE", "/api_keys/"+plain.ID, *plain.Key, ""), 401, "Invalid or revoked API key")

	// unknown and malformed ids
	expectError(t, e.do("DELETE", "/api_keys/"+uuid.NewString(), e.keyA, ""), 404, "API key not found")
	expectError(t, e.do("DELETE", "/api_keys/not-a-uuid", e.keyA, ""), 404, "API key not found")
	expectError(t, e.do("DELETE", "/api_keys/"+strings.ToUpper(made.ID)+"0", e.keyA, ""), 404, "API key not found")
	expectError(t, e.do("DELETE", "/api_keys/", e.keyA, ""), 404, "API key not found")
	expectError(t, e.do("DELETE", "/api_keys/"+made.Prefix, e.keyA, ""), 404, "API key not found")
}

// TestAPIKeyOrgIsolation: org B cannot list, see or revoke org A's keys, and org A's keys are
// unchanged by its attempts.
func TestAPIKeyOrgIsolation(t *testing.T) {
	e := newEnv(t)
	a := e.createKey(e.keyA, `{"name":"A's"}`)
	e.createKey(e.keyB, `{"name":"B's"}`)
	snapshot := func() string {
		return testenv.QueryValue[string](t, e.Fixture, `SELECT json_agg(k ORDER BY id)::text FROM api_keys k WHERE org_id = $1`, e.orgA)
	}
	before := snapshot()
	listB, lr := e.listKeys(e.keyB)
	if len(listB) != 2 {
		t.Fatalf("org B lists %d keys: %s", len(listB), lr.body)
	}
	if bytes.Contains(lr.body, []byte(a.ID)) || bytes.Contains(lr.body, []byte(a.Prefix)) || bytes.Contains(lr.body, []byte(`"A's"`)) {
		t.Fatalf("org B's list shows org A's key: %s", lr.body)
	}
	idA := testenv.QueryValue[string](t, e.Fixture, `SELECT id::text FROM api_keys WHERE org_id = $1 AND name = 'test'`, e.orgA)
	for _, id := range []string{a.ID, idA} {
		expectError(t, e.do("DELETE", "/api_keys/"+id, e.keyB, ""), 404, "API key not found")
		expectError(t, e.do("GET", "/api_keys/"+id, e.keyB, ""), 405, "Method not allowed")
	}
	if after := snapshot(); after != before {
		t.Fatalf("org A's keys changed:\nbefore %s\nafter  %s", before, after)
	}
	for _, k := range []string{e.keyA, *a.Key} {
		if r := e.do("GET", "/channels", k, ""); r.status != 200 {
			t.Fatalf("org A's key after org B's attempts: %d %s", r.status, r.body)
		}
	}
	listA, _ := e.listKeys(e.keyA)
	if len(listA) != 2 || listA[1].ID != a.ID {
		t.Fatalf("org A's list: %+v", listA)
	}
}

func TestAPIKeyValidation(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		body   string
		status int
		msg    string
	}{
		{`{"name":42}`, 422, `"name" must be a string`},
		{`{"name":["a"]}`, 422, `"name" must be a string`},
		{`{"name":"` + strings.Repeat("n", 201) + `"}`, 422, `"name" must be at most 200 characters`},
		{`{"name":"a\u0000b"}`, 422, `"name" must be valid UTF-8 text without NUL characters`},
		{`{"name":"\ud800"}`, 201, ``}, // a lone surrogate decodes to U+FFFD: valid text
		{`{"expires_in":720}`, 422, `"expires_in" must be a string`},
		{`{"expires_in":true}`, 422, `"expires_in" must be a string`},
		{`{"expires_in":{"hours":1}}`, 422, `"expires_in" must be a string`},
		{`{"expires_in":"soon"}`, 422, `"expires_in" must be a duration such as 720h, 90m or 30d`},
		{`{"expires_in":"720"}`, 422, `"expires_in" must be a duration such as 720h, 90m or 30d`},
		{`{"expires_in":"30x"}`, 422, `"expires_in" must be a duration such as 720h, 90m or 30d`},
		{`{"expires_in":"0d"}`, 422, `"expires_in" must be positive`},
		{`{"expires_in":"P30D"}`, 422, `"expires_in" must be a duration such as 720h, 90m or 30d`},
		{`{"expires_in":"99999999999h"}`, 422, `"expires_in" must be a duration such as 720h, 90m or 30d`},
		{`{"expires_in":"0"}`, 422, `"expires_in" must be positive`},
		{`{"expires_in":"0s"}`, 422, `"expires_in" must be positive`},
		{`{"expires_in":"-1h"}`, 422, `"expires_in" must be positive`},
		{`{"expires_in":"1h\u0000"}`, 422, `"expires_in" must be valid UTF-8 text without NUL characters`},
		{`{"name":7,"expires_in":"-1h"}`, 422, `"name" must be a string`},
		{`{"name":`, 400, "Invalid JSON body"},
		{`not json`, 400, "Invalid JSON body"},
		{`[]`, 400, "Invalid JSON body"},
		{`null`, 400, "Invalid JSON body"},
		{`"name"`, 400, "Invalid JSON body"},
		{`{"name":"a"} {"name":"b"}`, 400, "Invalid JSON body"},
		// accepted: every field is optional, null is absent, blank expires_in is no expiry
		{`{}`, 201, ``},
		{`{"expires_in":"30d"}`, 201, ``},
		{`{"expires_in":"1d12h"}`, 201, ``},
		{`{"name":null,"expires_in":null}`, 201, ``},
		{`{"name":"   ","expires_in":"  "}`, 201, ``},
		{`{"expires_in":"1h30m","extra":[1]}`, 201, ``},
		{`{"name":"` + strings.Repeat("é", 200) + `"}`, 201, ``},
	}
	created := 0
	for _, tc := range cases {
		t.Run(tc.body, func(t *testing.T) {
			r := e.do("POST", "/api_keys", e.keyA, tc.body)
			if tc.status == 201 {
				if r.status != 201 {
					t.Fatalf("%d %s", r.status, r.body)
				}
				created++
				return
			}
			expectError(t, r, tc.status, tc.msg)
		})
	}
	// invalid UTF-8 is refused, not turned into U+FFFD (checked without the validator, which
	// cannot read such a body)
	req := e.newRequest("POST", "/api_keys", e.keyA, "{\"name\":\"a\xffb\"}")
	rec := httptest.NewRecorder()
	e.handler.ServeHTTP(rec, req)
	expectError(t, response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}, 422,
		`"name" must be valid UTF-8 text without NUL characters`)
	e.expectBodyRefused("/api_keys")
	// 2 setup keys + the accepted ones, nothing else
	if n := e.Count(t, "api_keys"); n != 2+created {
		t.Fatalf("%d api keys stored, want %d", n, 2+created)
	}

	// routing is the same as elsewhere
	r := e.do("PUT", "/api_keys", e.keyA, `{}`)
	expectError(t, r, 405, "Method not allowed")
	if allow := r.header.Get("Allow"); allow != "GET, POST" { // sorted: the same answer every time
		t.Fatalf("Allow = %q", allow)
	}
	r = e.do("PATCH", "/api_keys/"+uuid.NewString(), e.keyA, `{}`)
	expectError(t, r, 405, "Method not allowed")
	if allow := r.header.Get("Allow"); allow != "DELETE" {
		t.Fatalf("Allow = %q", allow)
	}
	expectError(t, e.do("DELETE", "/api_keys", e.keyA, ""), 405, "Method not allowed")
	expectError(t, e.do("GET", "/api_keys/a/b", e.keyA, ""), 404, "Not found")
	expectError(t, e.do("GET", "/api_keys", "", ""), 401, "x-api-key header required")
	expectError(t, e.do("POST", "/api_keys", "crt_pk_bad", `{}`), 401, "Invalid or revoked API key")
}

// TestAPIKeyRateLimit: the key operations count against the calling key's limit like every
// operation, and a refused call has no effect.
func TestAPIKeyRateLimit(t *testing.T) {
	lim := ratelimit.NewMemory(3, time.Minute)
	t.Cleanup(lim.Close)
	e := newEnv(t, func(o *managementapi.Options) { o.Limiter = lim })
	victim, _ := e.APIKey(t, e.orgA, &testenv.APIKeyOpts{Name: "victim"})
	steps := []struct{ method, path, body string }{
		{"POST", "/api_keys", `{"name":"one"}`},
		{"GET", "/api_keys", ""},
		{"DELETE", "/api_keys/" + victim.ID.String(), ""},
	}
	for i, s := range steps {
		r := e.do(s.method, s.path, e.keyA, s.body)
		if r.status >= 300 || r.header.Get("RateLimit-Limit") != "3" || r.header.Get("RateLimit-Remaining") != fmt.Sprint(2-i) ||
			r.header.Get("RateLimit-Reset") == "" {
			t.Fatalf("%s %s: %d %v", s.method, s.path, r.status, r.header)
		}
	}
	n := e.Count(t, "api_keys")
	other, _ := e.APIKey(t, e.orgA, &testenv.APIKeyOpts{Name: "other"})
	for _, s := range []struct{ method, path, body string }{
		{"POST", "/api_keys", `{"name":"two"}`},
		{"GET", "/api_keys", ""},
		{"DELETE", "/api_keys/" + other.ID.String(), ""},
	} {
		r := e.do(s.method, s.path, e.keyA, s.body)
		expectError(t, r, 429, "Rate limit exceeded")
		if r.header.Get("Retry-After") == "" {
			t.Fatalf("%s %s: 429 without Retry-After", s.method, s.path)
		}
	}
	if got := e.Count(t, "api_keys"); got != n+1 {
		t.Fatalf("a rate-limited create was executed: %d keys, want %d", got, n+1)
	}
	if k, err := e.Store.ActiveAPIKey(context.Background(), other.ID); err != nil || k.RevokedAt != nil {
		t.Fatalf("a rate-limited revoke was executed: %v", err)
	}
	// other keys have their own limit
	if r := e.do("GET", "/api_keys", e.keyB, ""); r.status != 200 {
		t.Fatalf("other key: %d", r.status)
	}
}
