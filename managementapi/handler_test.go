package managementapi_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/wabarelay/wabarelay/internal/openapitest"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const connectBase = "https://relay.example.com"

// env is one test's API: a fresh database (the kit's fixture) with two orgs and their keys.
type env struct {
	*testenv.Fixture
	t       *testing.T
	handler http.Handler
	spec    *openapitest.Validator
	logs    *observer.ObservedLogs
	orgA    uuid.UUID
	orgB    uuid.UUID
	keyA    string
	keyB    string
}

type envOption func(*managementapi.Options)

func newEnv(t *testing.T, opts ...envOption) *env {
	t.Helper()
	return newEnvOn(t, testenv.NewStore(t), opts...)
}

// newEnvOn is newEnv on the fixture f (a database of a server the test stops, say).
func newEnvOn(t *testing.T, f *testenv.Fixture, opts ...envOption) *env {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	e := &env{Fixture: f, t: t, logs: logs, spec: openapitest.Load(t)}
	o := managementapi.Options{Store: f.Store, ConnectBase: connectBase, ConnectLinkTTL: 48 * time.Hour, Logger: zap.New(core)}
	for _, fn := range opts {
		fn(&o)
	}
	e.handler = managementapi.New(o)
	e.orgA, e.keyA = e.newOrg("Org A")
	e.orgB, e.keyB = e.newOrg("Org B")
	return e
}

func (e *env) newOrg(name string) (uuid.UUID, string) {
	e.t.Helper()
	org := e.Org(e.t, &testenv.OrgOpts{Name: name})
	_, key := e.APIKey(e.t, org.ID, &testenv.APIKeyOpts{Name: "test"})
	return org.ID, key
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("response %d is not JSON: %q", r.status, r.body)
	}
}

func (r response) object(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	r.json(t, &m)
	return m
}

// do runs one request through the handler and checks the exchange against the OpenAPI
// document. key "" sends no x-api-key header.
func (e *env) do(method, path, key, body string) response {
	e.t.Helper()
	return e.doRequest(e.newRequest(method, path, key, body), body)
}

func (e *env) newRequest(method, path, key, body string) *http.Request {
	var r *http.Request
	if body != "" {
		r = httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
	} else {
		r = httptest.NewRequest(method, path, nil)
	}
	if key != "" {
		r.Header.Set("X-Api-Key", key)
	}
	return r
}

func (e *env) doRequest(r *http.Request, body string) response {
	e.t.Helper()
	rec := httptest.NewRecorder()
	e.handler.ServeHTTP(rec, r)
	resp := response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
	if len(body) < 64<<10 { // the validator re-reads bodies; skip it for the huge-body cases
		e.spec.Check(e.t, r.Clone(context.Background()), []byte(body), resp.status, resp.header, resp.body)
	}
	return resp
}

// expectError asserts status and the exact {"error": msg} body.
func expectError(t *testing.T, r response, status int, msg string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d (body %s)", r.status, status, r.body)
	}
	var body map[string]any
	r.json(t, &body)
	if len(body) != 1 || body["error"] != msg {
		t.Fatalf("body = %s, want {\"error\":%q}", r.body, msg)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q", ct)
	}
}

// expectBodyRefused checks that POST path (by key A) refuses a missing body (400), a body over
// 1 MiB even when it would be valid JSON (413) and another content type (415).
func (e *env) expectBodyRefused(path string) {
	e.t.Helper()
	r := httptest.NewRequest("POST", path, nil)
	r.Header.Set("X-Api-Key", e.keyA)
	expectError(e.t, e.doRequest(r, ""), 400, "Invalid JSON body")
	huge := `{"name":"x","pad":"` + strings.Repeat("a", 1<<20) + `"}`
	expectError(e.t, e.do("POST", path, e.keyA, huge), 413, "Request body too large")
	r = httptest.NewRequest("POST", path, strings.NewReader("name=x"))
	r.Header.Set("X-Api-Key", e.keyA)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	expectError(e.t, e.doRequest(r, "name=x"), 415, "Content-Type must be application/json")
}

// created sends POST path with body by key, checks that it was answered 201 and returns the
// answer decoded.
func created[T any](e *env, path, key, body string) T {
	e.t.Helper()
	r := e.do("POST", path, key, body)
	if r.status != http.StatusCreated {
		e.t.Fatalf("POST %s: %d %s", path, r.status, r.body)
	}
	var v T
	r.json(e.t, &v)
	return v
}

func (e *env) createChannel(key, name string) managementapi.Channel {
	e.t.Helper()
	return created[managementapi.Channel](e, "/channels", key, fmt.Sprintf(`{"name":%q}`, name))
}

type webhookJSON struct {
	ID         string   `json:"id"`
	Name       string   `json:"name"`
	URL        string   `json:"url"`
	Events     []string `json:"events"`
	Status     string   `json:"status"`
	Scope      string   `json:"scope"`
	ChannelIDs []string `json:"channel_ids"`
	HMACSecret *string  `json:"hmac_secret"`
	CreatedAt  string   `json:"created_at"`
}

func (e *env) createWebhook(key, body string) webhookJSON {
	e.t.Helper()
	return created[webhookJSON](e, "/webhooks", key, body)
}

var tsRe = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)

func TestAuthentication(t *testing.T) {
	e := newEnv(t)
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	_, expired := e.APIKey(t, e.orgA, &testenv.APIKeyOpts{Name: "old", ExpiresAt: &past})
	rec, revoked := e.APIKey(t, e.orgA, &testenv.APIKeyOpts{Name: "gone"})
	if _, err := e.Store.RevokeAPIKey(context.Background(), rec.ID); err != nil {
		t.Fatal(err)
	}
	_, later := e.APIKey(t, e.orgA, &testenv.APIKeyOpts{Name: "later", ExpiresAt: &future})

	expectError(t, e.do("GET", "/channels", "", ""), 401, "x-api-key header required")
	for _, bad := range []string{
		"garbage", "crt_pk_", "crt_pk_" + strings.Repeat("A", 44), e.keyA + "x", e.keyA[:len(e.keyA)-1] + "!",
		"crt_pk_ünïcødé", strings.Repeat("k", 5000), "Bearer " + e.keyA,
		e.keyA[:len(e.keyA)-1] + string("0123456789"[(strings.IndexByte("0123456789", e.keyA[len(e.keyA)-1])+1)%10]),
	} {
		expectError(t, e.do("GET", "/channels", bad, ""), 401, "Invalid or revoked API key")
	}
	expectError(t, e.do("GET", "/channels", revoked, ""), 401, "Invalid or revoked API key")
	expectError(t, e.do("GET", "/channels", expired, ""), 401, "API key expired")
	for _, ok := range []string{e.keyA, later} {
		if r := e.do("GET", "/channels", ok, ""); r.status != 200 {
			t.Fatalf("valid key: %d %s", r.status, r.body)
		}
	}
	// auth runs before routing: unknown paths and wrong methods do not leak to anonymous callers
	expectError(t, e.do("GET", "/nope", "", ""), 401, "x-api-key header required")
	expectError(t, e.do("PUT", "/channels", "bad", ""), 401, "Invalid or revoked API key")

	// only the key's hash is stored, and no log line carries a key
	if n := testenv.QueryValue[int](t, e.Fixture, `SELECT count(*) FROM api_keys WHERE key_hash = $1 OR prefix = $2 OR name = $2`,
		[]byte(e.keyA), e.keyA); n != 0 {
		t.Fatalf("key stored in clear: n=%d", n)
	}
	for _, entry := range e.logs.All() {
		if b, _ := json.Marshal(entry.ContextMap()); bytes.Contains(b, []byte(e.keyA)) || strings.Contains(entry.Message, e.keyA) {
			t.Fatalf("key in log: %v", entry)
		}
	}
}

func TestChannelLifecycle(t *testing.T) {
	e := newEnv(t)
	before := time.Now()
	r := e.do("POST", "/channels", e.keyA, `{"name":"  Support line  "}`)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	m := r.object(t)
	for _, f := range []string{"display_phone_number", "phone_number_id", "waba_id", "connected_at", "upstream_disconnected_at"} {
		if v, ok := m[f]; !ok || v != nil {
			t.Fatalf("%s = %v (present %v), want null", f, v, ok)
		}
	}
	var c managementapi.Channel
	r.json(t, &c)
	if c.Name != "Support line" || c.Status != "pending" {
		t.Fatalf("channel = %+v", c)
	}
	if !regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`).MatchString(c.ChannelToken) {
		t.Fatalf("channel_token %q is not 43 URL-safe characters", c.ChannelToken)
	}
	if c.ConnectURL != connectBase+"/connect/"+c.ChannelToken {
		t.Fatalf("connect_url = %q", c.ConnectURL)
	}
	for _, f := range []string{"created_at", "token_expires_at"} {
		if !tsRe.MatchString(m[f].(string)) {
			t.Fatalf("%s = %q: not RFC 3339 UTC with milliseconds", f, m[f])
		}
	}
	exp, _ := time.Parse(time.RFC3339, m["token_expires_at"].(string))
	if d := exp.Sub(before); d < 48*time.Hour-time.Second || d > 48*time.Hour+5*time.Second {
		t.Fatalf("token_expires_at is %v after creation, want 48h", d)
	}

	second := e.createChannel(e.keyA, "Sales")
	var list []managementapi.Channel
	r = e.do("GET", "/channels", e.keyA, "")
	r.json(t, &list)
	if r.status != 200 || len(list) != 2 || list[0].ID != c.ID || list[1].ID != second.ID {
		t.Fatalf("list = %d %s", r.status, r.body)
	}
	var got managementapi.Channel
	r = e.do("GET", "/channels/"+c.ID.String(), e.keyA, "")
	r.json(t, &got)
	if r.status != 200 || got.ChannelToken != c.ChannelToken || got.ID != c.ID {
		t.Fatalf("get = %d %s", r.status, r.body)
	}
	// the channel token is stored encrypted and hashed, never in clear
	if clear := testenv.QueryValue[int](t, e.Fixture,
		`SELECT count(*) FROM channels WHERE position($1::bytea in channel_token_enc) > 0 OR channel_token_hash = $1::bytea`,
		[]byte(c.ChannelToken)); clear != 0 {
		t.Fatalf("channel token stored in clear: %d", clear)
	}

	r = e.do("DELETE", "/channels/"+c.ID.String(), e.keyA, "")
	if r.status != 204 || len(r.body) != 0 {
		t.Fatalf("delete = %d %q", r.status, r.body)
	}
	expectError(t, e.do("GET", "/channels/"+c.ID.String(), e.keyA, ""), 404, "Channel not found")
	expectError(t, e.do("DELETE", "/channels/"+c.ID.String(), e.keyA, ""), 404, "Channel not found")
	expectError(t, e.do("GET", "/channels/not-a-uuid", e.keyA, ""), 404, "Channel not found")
	expectError(t, e.do("DELETE", "/channels/"+uuid.NewString(), e.keyA, ""), 404, "Channel not found")
}

func TestConnectBaseFromRequest(t *testing.T) {
	e := newEnv(t, func(o *managementapi.Options) { o.ConnectBase = "" })
	r := httptest.NewRequest("POST", "https://api.example.org/channels", strings.NewReader(`{"name":"x"}`))
	r.Header.Set("X-Api-Key", e.keyA)
	r.Header.Set("Content-Type", "application/json")
	resp := e.doRequest(r, `{"name":"x"}`)
	var c managementapi.Channel
	resp.json(t, &c)
	if c.ConnectURL != "https://api.example.org/connect/"+c.ChannelToken {
		t.Fatalf("connect_url = %q", c.ConnectURL)
	}
}

func TestDeleteActiveChannel(t *testing.T) {
	e := newEnv(t)
	c := e.createChannel(e.keyA, "Live")
	e.Exec(t, `UPDATE channels SET status = 'active' WHERE id = $1`, c.ID)
	path := "/channels/" + c.ID.String()
	for _, q := range []string{"", "?force=false", "?force=0"} {
		r := e.do("DELETE", path+q, e.keyA, "")
		if r.status != 409 || !strings.HasPrefix(r.object(t)["error"].(string), "Channel is active. Use ?force=true") {
			t.Fatalf("DELETE%s = %d %s", q, r.status, r.body)
		}
	}
	expectError(t, e.do("DELETE", path+"?force=maybe", e.keyA, ""), 422, `"force" must be a boolean`)
	if e.Count(t, "channels") != 1 {
		t.Fatal("refused delete removed the channel")
	}
	if r := e.do("DELETE", path+"?force=true", e.keyA, ""); r.status != 204 {
		t.Fatalf("forced delete = %d %s", r.status, r.body)
	}
	if e.Count(t, "channels") != 0 {
		t.Fatal("channel still stored")
	}
}

func TestChannelValidation(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		body   string
		status int
		msg    string
	}{
		{`{}`, 422, `"name" is required`},
		{`{"name":""}`, 422, `"name" is required`},
		{`{"name":"   "}`, 422, `"name" is required`},
		{`{"name":null}`, 422, `"name" is required`},
		{`{"nome":"typo"}`, 422, `"name" is required`},
		{`{"name":42}`, 422, `"name" must be a string`},
		{`{"name":["a"]}`, 422, `"name" must be a string`},
		{`{"name":{"x":1}}`, 422, `"name" must be a string`},
		{`{"name":"` + strings.Repeat("n", 201) + `"}`, 422, `"name" must be at most 200 characters`},
		{`{"name":`, 400, "Invalid JSON body"},
		{`not json`, 400, "Invalid JSON body"},
		{`[]`, 400, "Invalid JSON body"},
		{`"name"`, 400, "Invalid JSON body"},
		{`null`, 400, "Invalid JSON body"},
		{`{"name":"a"} {"name":"b"}`, 400, "Invalid JSON body"},
		{`{"name":"a"}]`, 400, "Invalid JSON body"},
	}
	for _, tc := range cases {
		t.Run(tc.body, func(t *testing.T) {
			expectError(t, e.do("POST", "/channels", e.keyA, tc.body), tc.status, tc.msg)
		})
	}
	e.expectBodyRefused("/channels")
	if n := e.Count(t, "channels"); n != 0 {
		t.Fatalf("%d channels stored by invalid requests", n)
	}
	// exactly 200 characters (multi-byte) is fine; unknown fields are ignored
	if r := e.do("POST", "/channels", e.keyA, `{"name":"`+strings.Repeat("é", 200)+`","extra":[1,2]}`); r.status != 201 {
		t.Fatalf("200-char name: %d %s", r.status, r.body)
	}
}

func TestWebhookLifecycle(t *testing.T) {
	e := newEnv(t)
	w := e.createWebhook(e.keyA, `{"name":"All","url":"https://hooks.example.com/in","events":["messages","message_status","messages"]}`)
	if w.Scope != "org" || len(w.ChannelIDs) != 0 || w.ChannelIDs == nil || w.Status != "active" ||
		!slices.Equal(w.Events, []string{"messages", "message_status"}) || !tsRe.MatchString(w.CreatedAt) {
		t.Fatalf("webhook = %+v", w)
	}
	if w.HMACSecret == nil || !strings.HasPrefix(*w.HMACSecret, "whsec_") {
		t.Fatalf("hmac_secret = %v", w.HMACSecret)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(*w.HMACSecret, "whsec_"))
	if err != nil || len(raw) != 32 {
		t.Fatalf("hmac_secret is not whsec_ + base64 of 32 bytes: %v %d", err, len(raw))
	}
	// the secret is returned only at creation, stored encrypted, and decrypts back
	r := e.do("GET", "/webhooks/"+w.ID, e.keyA, "")
	if r.status != 200 || bytes.Contains(r.body, []byte("hmac_secret")) || bytes.Contains(r.body, []byte(*w.HMACSecret)) {
		t.Fatalf("get = %d %s", r.status, r.body)
	}
	r = e.do("GET", "/webhooks", e.keyA, "")
	if r.status != 200 || bytes.Contains(r.body, []byte("hmac_secret")) {
		t.Fatalf("list = %d %s", r.status, r.body)
	}
	if inClear := testenv.QueryValue[int](t, e.Fixture, `SELECT count(*) FROM webhooks WHERE position($1::bytea in secret_enc) > 0`,
		[]byte(*w.HMACSecret)); inClear != 0 {
		t.Fatalf("secret stored in clear: %d", inClear)
	}
	if got, err := e.Store.WebhookSecret(context.Background(), uuid.MustParse(w.ID)); err != nil || got != *w.HMACSecret {
		t.Fatalf("WebhookSecret = %v", err)
	}

	c1 := e.createChannel(e.keyA, "one")
	c2 := e.createChannel(e.keyA, "two")
	scoped := e.createWebhook(e.keyA, fmt.Sprintf(`{"name":"Scoped","url":"https://h.example.com/x?y=1","events":["message_status"],"channel_ids":[%q,%q,%q]}`,
		c2.ID, c1.ID, c2.ID))
	if scoped.Scope != "channels" || len(scoped.ChannelIDs) != 2 {
		t.Fatalf("scoped webhook = %+v", scoped)
	}
	var list []webhookJSON
	e.do("GET", "/webhooks", e.keyA, "").json(t, &list)
	if len(list) != 2 || list[0].ID != w.ID || list[1].ID != scoped.ID {
		t.Fatalf("list order: %+v", list)
	}
	// an explicit empty list means org scope, like an omitted one
	if emp := e.createWebhook(e.keyA, `{"name":"E","url":"https://h.example.com","events":["messages"],"channel_ids":[]}`); emp.Scope != "org" {
		t.Fatalf("empty channel_ids scope = %q", emp.Scope)
	}

	// PATCH
	for _, status := range []string{"paused", "paused", "active"} {
		var got webhookJSON
		r := e.do("PATCH", "/webhooks/"+w.ID, e.keyA, `{"status":"`+status+`"}`)
		r.json(t, &got)
		if r.status != 200 || got.Status != status || got.ID != w.ID || got.HMACSecret != nil {
			t.Fatalf("PATCH %s = %d %s", status, r.status, r.body)
		}
	}
	for body, msg := range map[string]string{
		`{"status":"stopped"}`: `"status" must be one of: active, paused`,
		`{"status":"ACTIVE"}`:  `"status" must be one of: active, paused`,
		`{"status":""}`:        `"status" must be one of: active, paused`,
		`{}`:                   `"status" is required`,
		`{"status":true}`:      `"status" must be a string`,
	} {
		expectError(t, e.do("PATCH", "/webhooks/"+w.ID, e.keyA, body), 422, msg)
	}
	expectError(t, e.do("PATCH", "/webhooks/"+w.ID, e.keyA, `{"status":`), 400, "Invalid JSON body")
	expectError(t, e.do("PATCH", "/webhooks/"+uuid.NewString(), e.keyA, `{"status":"paused"}`), 404, "Webhook not found")
	expectError(t, e.do("PATCH", "/webhooks/xyz", e.keyA, `{"status":"paused"}`), 404, "Webhook not found")

	// DELETE
	if r := e.do("DELETE", "/webhooks/"+scoped.ID, e.keyA, ""); r.status != 204 || len(r.body) != 0 {
		t.Fatalf("delete = %d %s", r.status, r.body)
	}
	expectError(t, e.do("GET", "/webhooks/"+scoped.ID, e.keyA, ""), 404, "Webhook not found")
	expectError(t, e.do("DELETE", "/webhooks/"+scoped.ID, e.keyA, ""), 404, "Webhook not found")
	if n := e.Count(t, "webhook_channels"); n != 0 {
		t.Fatalf("%d assignments left after webhook delete", n)
	}
}

// badEvents is the refusal of an unknown event kind (DESIGN §5b "Event kinds").
const badEvents = `"events" values must be one of: messages, message_status, channel_status, message_template_status_update, channel_health`

func TestWebhookValidation(t *testing.T) {
	e := newEnv(t)
	foreign := e.createChannel(e.keyB, "B's")
	mine := e.createChannel(e.keyA, "A's")
	ok := `"name":"n","url":"https://h.example.com","events":["messages"]`
	cases := []struct {
		body   string
		status int
		msg    string
	}{
		{`{"url":"https://h.example.com","events":["messages"]}`, 422, `"name" is required`},
		{`{"name":"n","events":["messages"]}`, 422, `"url" is required`},
		{`{"name":"n","url":"","events":["messages"]}`, 422, `"url" is required`},
		{`{"name":"n","url":"http://h.example.com","events":["messages"]}`, 422, `"url" must start with https://`},
		{`{"name":"n","url":"ftp://h.example.com","events":["messages"]}`, 422, `"url" must start with https://`},
		{`{"name":"n","url":"h.example.com","events":["messages"]}`, 422, `"url" must start with https://`},
		{`{"name":"n","url":"https://","events":["messages"]}`, 422, `"url" must be a valid URL`},
		{`{"name":"n","url":"https://user:pw@h.example.com","events":["messages"]}`, 422, `"url" must be a valid URL`},
		{`{"name":"n","url":"https://h.example.com/` + strings.Repeat("p", 2100) + `","events":["messages"]}`, 422, `"url" must be a valid URL`},
		{`{"name":"n","url":"https://h.example.com"}`, 422, `"events" is required`},
		{`{"name":"n","url":"https://h.example.com","events":[]}`, 422, `"events" is required`},
		{`{"name":"n","url":"https://h.example.com","events":["message"]}`, 422, badEvents},
		{`{"name":"n","url":"https://h.example.com","events":["messages","template_status"]}`, 422, badEvents},
		{`{"name":"n","url":"https://h.example.com","events":["channel_status","Channel_Status"]}`, 422, badEvents},
		{`{"name":"n","url":"https://h.example.com","events":"messages"}`, 422, `"events" must be an array of strings`},
		{`{"name":"n","url":"https://h.example.com","events":[1]}`, 422, `"events" must be an array of strings`},
		{`{"name":"n","url":"https://h.example.com","events":[null]}`, 422, `"events" must be an array of strings`},
		{`{"name":"n","url":42,"events":["messages"]}`, 422, `"url" must be a string`},
		{`{"name":false,"url":"https://h.example.com","events":["messages"]}`, 422, `"name" must be a string`},
		{`{` + ok + `,"channel_ids":"` + mine.ID.String() + `"}`, 422, `"channel_ids" must be an array of strings`},
		{`{` + ok + `,"channel_ids":[7]}`, 422, `"channel_ids" must be an array of strings`},
		{`{` + ok + `,"channel_ids":["` + foreign.ID.String() + `"]}`, 422, "One or more channel_ids not found in this org"},
		{`{` + ok + `,"channel_ids":["` + mine.ID.String() + `","` + foreign.ID.String() + `"]}`, 422, "One or more channel_ids not found in this org"},
		{`{` + ok + `,"channel_ids":["` + uuid.NewString() + `"]}`, 422, "One or more channel_ids not found in this org"},
		{`{` + ok + `,"channel_ids":["not-a-uuid"]}`, 422, "One or more channel_ids not found in this org"},
		{`{` + ok + `,}`, 400, "Invalid JSON body"},
	}
	for _, tc := range cases {
		t.Run(tc.msg, func(t *testing.T) {
			expectError(t, e.do("POST", "/webhooks", e.keyA, tc.body), tc.status, tc.msg)
		})
	}
	if n := e.Count(t, "webhooks"); n != 0 {
		t.Fatalf("%d webhooks stored by invalid requests", n)
	}
	// uppercase scheme is still https
	if r := e.do("POST", "/webhooks", e.keyA, `{"name":"n","url":"HTTPS://H.example.com/x","events":["messages"]}`); r.status != 201 {
		t.Fatalf("HTTPS:// = %d %s", r.status, r.body)
	}
	// every kind is accepted, duplicates kept once, in the order given
	r := e.do("POST", "/webhooks", e.keyA, `{"name":"k","url":"https://h.example.com/k","events":["message_template_status_update","channel_status","messages","message_status","channel_status"]}`)
	var w webhookJSON
	r.json(t, &w)
	if r.status != 201 || !slices.Equal(w.Events, []string{"message_template_status_update", "channel_status", "messages", "message_status"}) {
		t.Fatalf("all four kinds = %d %s", r.status, r.body)
	}
}

func TestAssignments(t *testing.T) {
	e := newEnv(t)
	c1 := e.createChannel(e.keyA, "one")
	c2 := e.createChannel(e.keyA, "two")
	scoped := e.createWebhook(e.keyA, fmt.Sprintf(`{"name":"S","url":"https://h.example.com","events":["messages"],"channel_ids":[%q]}`, c1.ID))
	org := e.createWebhook(e.keyA, `{"name":"O","url":"https://h.example.com","events":["messages"]}`)
	path := func(w string, c uuid.UUID) string { return "/webhooks/" + w + "/channels/" + c.String() }
	channelIDs := func(w string) []string {
		var got webhookJSON
		e.do("GET", "/webhooks/"+w, e.keyA, "").json(t, &got)
		return got.ChannelIDs
	}

	for i := 0; i < 2; i++ { // idempotent
		var a map[string]string
		r := e.do("POST", path(scoped.ID, c2.ID), e.keyA, "")
		r.json(t, &a)
		if r.status != 200 || a["webhook_config_id"] != scoped.ID || a["channel_id"] != c2.ID.String() || len(a) != 2 {
			t.Fatalf("assign #%d = %d %s", i, r.status, r.body)
		}
	}
	if got := channelIDs(scoped.ID); !slices.Equal(got, []string{c1.ID.String(), c2.ID.String()}) {
		t.Fatalf("channel_ids = %v", got)
	}
	// org scope: assignment succeeds and changes nothing
	if r := e.do("POST", path(org.ID, c1.ID), e.keyA, ""); r.status != 200 {
		t.Fatalf("assign on org scope = %d %s", r.status, r.body)
	}
	if got := channelIDs(org.ID); len(got) != 0 {
		t.Fatalf("org-scoped channel_ids = %v", got)
	}
	if r := e.do("DELETE", path(org.ID, c1.ID), e.keyA, ""); r.status != 204 {
		t.Fatalf("remove on org scope = %d", r.status)
	}

	// unknown ids
	expectError(t, e.do("POST", path(uuid.NewString(), c1.ID), e.keyA, ""), 404, "Webhook not found")
	expectError(t, e.do("POST", "/webhooks/x/channels/y", e.keyA, ""), 404, "Webhook not found")
	expectError(t, e.do("POST", path(scoped.ID, uuid.New()), e.keyA, ""), 404, "Channel not found")
	expectError(t, e.do("POST", "/webhooks/"+scoped.ID+"/channels/nope", e.keyA, ""), 404, "Channel not found")
	expectError(t, e.do("DELETE", path(uuid.NewString(), c1.ID), e.keyA, ""), 404, "Webhook not found")
	expectError(t, e.do("DELETE", path(scoped.ID, uuid.New()), e.keyA, ""), 404, "Channel not found")

	// removal, repeated removal, last channel removed keeps scope
	for i := 0; i < 2; i++ {
		if r := e.do("DELETE", path(scoped.ID, c2.ID), e.keyA, ""); r.status != 204 || len(r.body) != 0 {
			t.Fatalf("remove #%d = %d %s", i, r.status, r.body)
		}
	}
	if r := e.do("DELETE", path(scoped.ID, c1.ID), e.keyA, ""); r.status != 204 {
		t.Fatal("remove last")
	}
	var got webhookJSON
	e.do("GET", "/webhooks/"+scoped.ID, e.keyA, "").json(t, &got)
	if got.Scope != "channels" || len(got.ChannelIDs) != 0 {
		t.Fatalf("after removing the last channel: %+v", got)
	}
	// deleting a channel removes it from assignments
	e.do("POST", path(scoped.ID, c2.ID), e.keyA, "")
	if r := e.do("DELETE", "/channels/"+c2.ID.String(), e.keyA, ""); r.status != 204 {
		t.Fatal("delete channel")
	}
	if got := channelIDs(scoped.ID); len(got) != 0 {
		t.Fatalf("deleted channel still assigned: %v", got)
	}
}

// TestOrgIsolation: org B's key on org A's ids is told "not found", and org A's data is unchanged.
func TestOrgIsolation(t *testing.T) {
	e := newEnv(t)
	ch := e.createChannel(e.keyA, "A channel")
	wh := e.createWebhook(e.keyA, fmt.Sprintf(`{"name":"A hook","url":"https://h.example.com","events":["messages"],"channel_ids":[%q]}`, ch.ID))
	chB := e.createChannel(e.keyB, "B channel")
	whB := e.createWebhook(e.keyB, `{"name":"B hook","url":"https://h.example.com","events":["messages"]}`)
	snapshot := func() string {
		return testenv.QueryValue[string](t, e.Fixture, `SELECT
			(SELECT json_agg(c ORDER BY id)::text FROM channels c WHERE org_id = $1) ||
			(SELECT json_agg(w ORDER BY id)::text FROM webhooks w WHERE org_id = $1) ||
			(SELECT count(*)::text FROM webhook_channels)`, e.orgA)
	}
	before := snapshot()
	C, W := ch.ID.String(), wh.ID
	cases := []struct{ method, path, body, msg string }{
		{"GET", "/channels/" + C, "", "Channel not found"},
		{"DELETE", "/channels/" + C, "", "Channel not found"},
		{"DELETE", "/channels/" + C + "?force=true", "", "Channel not found"},
		{"GET", "/webhooks/" + W, "", "Webhook not found"},
		{"PATCH", "/webhooks/" + W, `{"status":"paused"}`, "Webhook not found"},
		{"DELETE", "/webhooks/" + W, "", "Webhook not found"},
		{"POST", "/webhooks/" + W + "/channels/" + C, "", "Webhook not found"},
		{"DELETE", "/webhooks/" + W + "/channels/" + C, "", "Webhook not found"},
		// B's webhook with A's channel, and A's webhook with B's channel
		{"POST", "/webhooks/" + whB.ID + "/channels/" + C, "", "Channel not found"},
		{"DELETE", "/webhooks/" + whB.ID + "/channels/" + C, "", "Channel not found"},
		{"POST", "/webhooks/" + W + "/channels/" + chB.ID.String(), "", "Webhook not found"},
	}
	for _, tc := range cases {
		expectError(t, e.do(tc.method, tc.path, e.keyB, tc.body), 404, tc.msg)
	}
	expectError(t, e.do("POST", "/webhooks", e.keyB, fmt.Sprintf(`{"name":"x","url":"https://h.example.com","events":["messages"],"channel_ids":[%q]}`, C)),
		422, "One or more channel_ids not found in this org")
	for _, p := range []string{"/channels", "/webhooks"} {
		r := e.do("GET", p, e.keyB, "")
		if bytes.Contains(r.body, []byte(C)) || bytes.Contains(r.body, []byte(W)) {
			t.Fatalf("org B's %s lists org A's resources: %s", p, r.body)
		}
	}
	if after := snapshot(); after != before {
		t.Fatalf("org A's data changed:\nbefore %s\nafter  %s", before, after)
	}
}

func TestRoutingErrors(t *testing.T) {
	e := newEnv(t)
	expectError(t, e.do("GET", "/nope", e.keyA, ""), 404, "Not found")
	expectError(t, e.do("GET", "/channels/a/b", e.keyA, ""), 404, "Not found")
	expectError(t, e.do("GET", "/", e.keyA, ""), 404, "Not found")
	r := e.do("PUT", "/channels", e.keyA, `{"name":"x"}`)
	expectError(t, r, 405, "Method not allowed")
	if allow := r.header.Get("Allow"); !strings.Contains(allow, "GET") || !strings.Contains(allow, "POST") {
		t.Fatalf("Allow = %q", allow)
	}
	expectError(t, e.do("PATCH", "/channels/"+uuid.NewString(), e.keyA, `{}`), 405, "Method not allowed")
	expectError(t, e.do("POST", "/health", "", ""), 405, "Method not allowed")
	expectError(t, e.do("GET", "/channels/", e.keyA, ""), 404, "Channel not found")
}

func TestHealth(t *testing.T) {
	e := newEnv(t)
	r := e.do("GET", "/health", "", "")
	if r.status != 200 || string(bytes.TrimSpace(r.body)) != `{"status":"ok"}` {
		t.Fatalf("health = %d %s", r.status, r.body)
	}
	down := newEnv(t, func(o *managementapi.Options) {
		o.Health = func(context.Context) error { return fmt.Errorf("Redis unavailable") }
	})
	expectError(t, down.do("GET", "/health", "", ""), 503, "Redis unavailable")
}

// TestPostgresDown: with the database gone, requests get 503 (retryable), never 500, and /health names it.
func TestPostgresDown(t *testing.T) {
	srv := testenv.StartPostgres(t)
	e := newEnvOn(t, testenv.NewStore(t, &testenv.StoreOpts{DSN: srv.CreateDB(t)}))
	defer func() {
		for _, l := range e.logs.All() {
			t.Log(l.Message, l.ContextMap())
		}
	}()
	if r := e.do("GET", "/channels", e.keyA, ""); r.status != 200 {
		t.Fatalf("before: %d %s", r.status, r.body)
	}
	srv.Stop(t)
	expectError(t, e.do("GET", "/channels", e.keyA, ""), 503, "Service unavailable")
	expectError(t, e.do("GET", "/health", "", ""), 503, "Postgres unavailable")
	srv.Start(t)
	testenv.Eventually(t, 30*time.Second, func() bool { return e.do("GET", "/channels", e.keyA, "").status == 200 },
		"GET /channels to recover after Postgres restarted")
}

func TestRateLimitMemory(t *testing.T) {
	lim := ratelimit.NewMemory(3, time.Minute)
	t.Cleanup(lim.Close)
	e := newEnv(t, func(o *managementapi.Options) { o.Limiter = lim })
	for i := 0; i < 3; i++ {
		r := e.do("GET", "/channels", e.keyA, "")
		if r.status != 200 || r.header.Get("RateLimit-Limit") != "3" || r.header.Get("RateLimit-Remaining") != fmt.Sprint(2-i) {
			t.Fatalf("request %d: %d %v", i, r.status, r.header)
		}
	}
	r := e.do("POST", "/channels", e.keyA, `{"name":"x"}`)
	expectError(t, r, 429, "Rate limit exceeded")
	if ra := r.header.Get("Retry-After"); ra == "" || ra == "0" || len(ra) > 2 {
		t.Fatalf("Retry-After = %q", ra)
	}
	if e.Count(t, "channels") != 0 {
		t.Fatal("a rate-limited request was executed")
	}
	// limits are per key
	if r := e.do("GET", "/channels", e.keyB, ""); r.status != 200 {
		t.Fatalf("other key limited: %d", r.status)
	}
	// unauthenticated requests are refused before they count
	expectError(t, e.do("GET", "/channels", "crt_pk_bad", ""), 401, "Invalid or revoked API key")
}

// TestRateLimitRedisShared: two handlers (two instances) sharing Redis enforce one limit per key.
func TestRateLimitRedisShared(t *testing.T) {
	rdb := testenv.RedisClient(t, testenv.Redis(t))
	prefix := "test:" + uuid.NewString() + ":"
	e := newEnv(t, func(o *managementapi.Options) { o.Limiter = ratelimit.NewRedis(rdb, 5, time.Minute, prefix) })
	other := managementapi.New(managementapi.Options{Store: e.Store, ConnectBase: connectBase,
		Limiter: ratelimit.NewRedis(rdb, 5, time.Minute, prefix)})
	allowed := 0
	for i := 0; i < 8; i++ {
		h := e.handler
		if i%2 == 1 {
			h = other
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, e.newRequest("GET", "/channels", e.keyA, ""))
		switch rec.Code {
		case 200:
			allowed++
		case 429:
			if rec.Header().Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
		default:
			t.Fatalf("status %d", rec.Code)
		}
	}
	if allowed != 5 {
		t.Fatalf("allowed %d of 8 across two instances, want 5", allowed)
	}
}

func TestReconnect(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.createChannel(e.keyA, "c")
	path := "/channels/" + c.ID.String() + "/reconnect"
	// a pending channel whose link is still open has nothing to reconnect
	expectError(t, e.do("POST", path, e.keyA, ""), 409, managementapi.MsgNotReconnectable)
	// expired link → reopened with a fresh expiry, same token
	e.Exec(t, `UPDATE channels SET token_expires_at = now() - interval '1 hour' WHERE id = $1`, c.ID)
	r := e.do("POST", path, e.keyA, "")
	var got managementapi.Channel
	r.json(t, &got)
	if r.status != 200 || got.ChannelToken != c.ChannelToken || got.TokenExpiresAt == nil ||
		time.Until(time.Time(*got.TokenExpiresAt)) < 47*time.Hour {
		t.Fatalf("reopen: %d %s", r.status, r.body)
	}
	// connected and healthy → 409; after the upstream token died → reopened
	if err := e.Store.ConnectChannel(ctx, c.ID, store.Connection{PhoneNumberID: "1", WabaID: "2", UpstreamToken: "t"}); err != nil {
		t.Fatal(err)
	}
	expectError(t, e.do("POST", path, e.keyA, ""), 409, managementapi.MsgNotReconnectable)
	if err := e.Store.MarkUpstreamDisconnected(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	r = e.do("POST", path, e.keyA, "")
	r.json(t, &got)
	if r.status != 200 || got.Status != "active" || got.UpstreamDisconnectedAt == nil || got.TokenExpiresAt == nil {
		t.Fatalf("reopen after 190: %d %s", r.status, r.body)
	}
	// operator-deactivated → 409 here
	if _, err := e.Store.DeactivateChannel(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	expectError(t, e.do("POST", path, e.keyA, ""), 409, managementapi.MsgOperatorDeactivated)
	// other org and unknown ids
	expectError(t, e.do("POST", path, e.keyB, ""), 404, "Channel not found")
	expectError(t, e.do("POST", "/channels/nope/reconnect", e.keyA, ""), 404, "Channel not found")
	expectError(t, e.do("GET", path, e.keyA, ""), 405, "Method not allowed")
}

// TestDeleteUnsubscribesLastChannelOfBusinessAccount: the upstream clean-up hook runs only when
// no other channel uses the business account.
func TestDeleteUnsubscribesLastChannelOfBusinessAccount(t *testing.T) {
	got := make(chan store.DeletedChannel, 4)
	e := newEnv(t, func(o *managementapi.Options) { o.AfterChannelDeleted = func(d store.DeletedChannel) { got <- d } })
	ctx := context.Background()
	a, b := e.createChannel(e.keyA, "a"), e.createChannel(e.keyA, "b")
	for i, c := range []managementapi.Channel{a, b} {
		if err := e.Store.ConnectChannel(ctx, c.ID, store.Connection{PhoneNumberID: fmt.Sprint(100 + i), WabaID: "W1", UpstreamToken: "tok" + fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if r := e.do("DELETE", "/channels/"+a.ID.String()+"?force=true", e.keyA, ""); r.status != 204 {
		t.Fatalf("delete a: %d", r.status)
	}
	if r := e.do("DELETE", "/channels/"+b.ID.String()+"?force=true", e.keyA, ""); r.status != 204 {
		t.Fatalf("delete b: %d", r.status)
	}
	testenv.Eventually(t, testenv.Patience, func() bool { return len(got) > 0 }, "the hook called for the last channel of the business account")
	if d := <-got; d.WabaID != "W1" || d.UpstreamToken != "tok1" {
		t.Fatalf("hook got %+v, want W1 with the last channel's token", d)
	}
	select {
	case d := <-got:
		t.Fatalf("hook called again: %+v", d)
	case <-time.After(100 * time.Millisecond):
	}
}

// deliveries gives key A's org a connected channel (phone number id pnid) and a webhook for its
// messages, and stores n incoming messages for it: n deliveries to the webhook.
func (e *env) deliveries(pnid string, n int) webhookJSON {
	e.t.Helper()
	ctx := context.Background()
	c := e.createChannel(e.keyA, "c")
	if err := e.Store.ConnectChannel(ctx, c.ID, store.Connection{PhoneNumberID: pnid, WabaID: "w", UpstreamToken: "t"}); err != nil {
		e.t.Fatal(err)
	}
	wh := e.createWebhook(e.keyA, `{"name":"W","url":"https://h.example.com","events":["messages"]}`)
	var items []store.IncomingItem
	for i := 0; i < n; i++ {
		items = append(items, store.IncomingItem{Type: "messages", PhoneNumberID: pnid, DedupeKey: fmt.Sprint("m:", i), Data: []byte(`{"message":{}}`)})
	}
	if _, err := e.Store.StoreEvents(ctx, items, store.Claim{}); err != nil {
		e.t.Fatal(err)
	}
	return wh
}

func TestDeliveryLog(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	wh := e.deliveries("555", 5)
	// two failed deliveries with attempts, the rest pending
	e.Exec(t, `WITH f AS (UPDATE deliveries SET status = 'failed', attempts = 4, last_status_code = 500, last_error = 'HTTP 500'
		           WHERE id IN (SELECT id FROM deliveries ORDER BY created_at, id LIMIT 2) RETURNING id)
		DELETE FROM delivery_queue q USING f WHERE q.delivery_id = f.id`)
	e.Exec(t, `INSERT INTO delivery_attempts (id, delivery_id, attempt, started_at, duration_ms, status_code, error, response_body)
		SELECT gen_random_uuid(), id, n, now(), 12, 500, 'HTTP 500', 'oops' FROM deliveries, generate_series(1, 4) n WHERE status = 'failed'`)
	base := "/webhooks/" + wh.ID + "/deliveries"

	var page []managementapi.Delivery
	all, _ := followPages[managementapi.Delivery](t, e, base+"?limit=2", base)
	if len(all) != 5 || all[0].Status != "failed" || len(all[0].AttemptLog) != 4 || all[4].Status != "pending" || all[4].NextAttemptAt == nil {
		t.Fatalf("deliveries: %+v", all)
	}
	r := e.do("GET", base+"?status=failed", e.keyA, "")
	r.json(t, &page)
	if len(page) != 2 {
		t.Fatalf("failed filter: %d", len(page))
	}
	expectError(t, e.do("GET", base+"?status=bogus", e.keyA, ""), 422, `"status" must be one of: pending, in_flight, delivered, failed`)
	expectError(t, e.do("GET", base+"?limit=0", e.keyA, ""), 422, `"limit" must be an integer from 1 to 100`)
	expectError(t, e.do("GET", base+"?cursor=x", e.keyA, ""), 422, `"cursor" is invalid`)
	expectError(t, e.do("GET", base, e.keyB, ""), 404, "Webhook not found")

	// retry a failed one; a pending one is refused
	failed, pending := all[0].ID.String(), all[4].ID.String()
	if r := e.do("POST", base+"/"+failed+"/retry", e.keyA, ""); r.status != 202 {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	expectError(t, e.do("POST", base+"/"+pending+"/retry", e.keyA, ""), 409, "Only failed deliveries can be retried")
	expectError(t, e.do("POST", base+"/"+uuid.NewString()+"/retry", e.keyA, ""), 404, "Delivery not found")
	expectError(t, e.do("POST", base+"/"+failed+"/retry", e.keyB, ""), 404, "Webhook not found")
	var st string
	var attempts int
	if err := e.Pool.QueryRow(ctx, `SELECT status, attempts FROM deliveries WHERE id = $1`, failed).Scan(&st, &attempts); err != nil {
		t.Fatal(err)
	}
	if st != "pending" || attempts != 0 {
		t.Fatalf("after retry: %s %d", st, attempts)
	}
	// recover: the other failed one
	r = e.do("POST", "/webhooks/"+wh.ID+"/recover", e.keyA, `{"since":"2000-01-01T00:00:00Z"}`)
	if r.status != 202 || !strings.Contains(string(r.body), `"requeued":1`) {
		t.Fatalf("recover: %d %s", r.status, r.body)
	}
	expectError(t, e.do("POST", "/webhooks/"+wh.ID+"/recover", e.keyA, `{}`), 422, `"since" is required`)
	expectError(t, e.do("POST", "/webhooks/"+wh.ID+"/recover", e.keyA, `{"since":"yesterday"}`), 422, `"since" must be an ISO 8601 timestamp with a time zone`)
	expectError(t, e.do("POST", "/webhooks/"+wh.ID+"/recover", e.keyB, `{"since":"2000-01-01T00:00:00Z"}`), 404, "Webhook not found")
}

// TestDeliveryLogSchedules: after a manual retry restarts a failed delivery's attempt count, its
// log lists the attempts in the order they were made, each with its schedule: the original
// schedule's attempts 1 and 2 (schedule 1), then the retry's attempt 1 (schedule 2).
func TestDeliveryLogSchedules(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	wh := e.deliveries("556", 1)
	q := store.NewQueue(e.Pool)
	started := time.Now()
	// fail makes the delivery's next attempt fail: again later (retry), or for good.
	fail := func(retry bool) {
		t.Helper()
		e.Exec(t, `UPDATE delivery_queue SET next_attempt_at = now()`)
		cl, err := q.Claim(ctx, store.QueueClaim{Instance: "i1", Lease: time.Minute, Limit: 10, PerWebhook: 10, PerOrg: 10})
		if err != nil || len(cl.Deliveries) != 1 {
			t.Fatalf("claim: %v %+v", err, cl)
		}
		started = started.Add(time.Second) // attempts a second apart, in order
		code, msg := 500, "http_500"
		out := store.Outcome{Delivery: cl.Deliveries[0], Started: started, Duration: 5 * time.Millisecond,
			StatusCode: &code, Error: &msg, RetryIn: -1}
		if retry {
			out.RetryIn = time.Hour
		}
		if n, err := q.Record(ctx, "i1", []store.Outcome{out}); err != nil || n != 1 {
			t.Fatalf("record: %d %v", n, err)
		}
	}
	fail(true)
	fail(false)
	base := "/webhooks/" + wh.ID + "/deliveries"
	var page []managementapi.Delivery
	e.do("GET", base, e.keyA, "").json(t, &page)
	if len(page) != 1 || page[0].Status != "failed" {
		t.Fatalf("before the retry: %+v", page)
	}
	if r := e.do("POST", base+"/"+page[0].ID.String()+"/retry", e.keyA, ""); r.status != 202 {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	fail(false)

	r := e.do("GET", base, e.keyA, "")
	r.json(t, &page)
	if len(page) != 1 || page[0].Status != "failed" {
		t.Fatalf("after the retry: %+v", page)
	}
	type step struct{ schedule, attempt int }
	var got []step
	for i, a := range page[0].AttemptLog {
		got = append(got, step{a.Schedule, a.Attempt})
		if i > 0 && time.Time(a.StartedAt).Before(time.Time(page[0].AttemptLog[i-1].StartedAt)) {
			t.Errorf("attempt %d started before the one listed above it: %+v", i, page[0].AttemptLog)
		}
	}
	if want := []step{{1, 1}, {1, 2}, {2, 1}}; !slices.Equal(got, want) {
		t.Fatalf("attempt log (schedule, attempt) = %v, want %v; body %s", got, want, r.body)
	}
}

// TestOddPaths: the router takes paths segment by segment as decoded, never cleaning or
// redirecting them, and serves HEAD on /health only.
func TestOddPaths(t *testing.T) {
	e := newEnv(t)
	id := uuid.NewString()
	for _, tc := range []struct {
		method, target string
		status         int
		msg, allow     string
	}{
		{"GET", "/channels/", 404, managementapi.MsgChannelNotFound, ""},
		{"GET", "/channels/..", 404, managementapi.MsgChannelNotFound, ""},
		{"GET", "/channels/.", 404, managementapi.MsgChannelNotFound, ""},
		{"GET", "/webhooks//deliveries", 404, "Webhook not found", ""},
		{"GET", "/channels/" + id + "%2Freconnect", 405, "Method not allowed", "POST"},
		{"GET", "/channels/../webhooks", 404, "Not found", ""},
		{"GET", "//channels", 404, "Not found", ""},
		{"GET", "/channels//", 404, "Not found", ""},
		{"HEAD", "/channels", 405, "Method not allowed", "GET, POST"},
		{"HEAD", "/nope", 404, "Not found", ""},
		{"PUT", "/webhooks/" + id, 405, "Method not allowed", "DELETE, GET, PATCH"},
		{"PUT", "/health", 405, "Method not allowed", "GET, HEAD"},
		{"HEAD", "/health", 200, "", ""},
	} {
		r := httptest.NewRequest(tc.method, "http://relay.example.com"+tc.target, nil)
		r.Header.Set("X-Api-Key", e.keyA)
		rec := httptest.NewRecorder()
		e.handler.ServeHTTP(rec, r)
		if rec.Code != tc.status || rec.Header().Get("Allow") != tc.allow || rec.Header().Get("Location") != "" {
			t.Errorf("%s %s: %d Allow %q Location %q %s, want %d Allow %q", tc.method, tc.target, rec.Code,
				rec.Header().Get("Allow"), rec.Header().Get("Location"), rec.Body, tc.status, tc.allow)
			continue
		}
		if tc.msg != "" && strings.TrimSpace(rec.Body.String()) != `{"error":"`+tc.msg+`"}` {
			t.Errorf("%s %s: body %s, want %q", tc.method, tc.target, rec.Body, tc.msg)
		}
	}
}

// followPages GETs first with key A and every next page its Link header names (relative to
// base), at most 6 pages, and returns all the items and the Link headers in order.
func followPages[T any](t *testing.T, e *env, first, base string) ([]T, []string) {
	t.Helper()
	var all []T
	var links []string
	next := first
	for pages := 0; next != ""; pages++ {
		r := e.do("GET", next, e.keyA, "")
		if r.status != 200 || pages > 5 {
			t.Fatalf("page %d: %d %s", pages, r.status, r.body)
		}
		var page []T
		r.json(t, &page)
		all = append(all, page...)
		next = ""
		if link := r.header.Get("Link"); link != "" {
			links = append(links, link)
			next = base + strings.TrimSuffix(strings.TrimPrefix(link, "<"), `>; rel="next"`)
		}
	}
	return all, links
}
