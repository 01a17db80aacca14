package openapitest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/managementapi"
)

// recorder is a testing.TB that records Errorf calls instead of failing, so that tests can
// prove mismatches are reported.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) Error(args ...any) { r.errs = append(r.errs, fmt.Sprint(args...)) }

func newRecorder(t *testing.T) *recorder { return &recorder{TB: t} }

var jsonHeader = http.Header{"Content-Type": {"application/json"}}

const (
	channelID = "0193a5e2-7c4d-7f1e-8a2b-3c4d5e6f7a8b"
	webhookID = "0193a5f0-1b2c-7d3e-9f40-5a6b7c8d9e0f"
)

func channel() map[string]any {
	return map[string]any{
		"id":                       channelID,
		"name":                     "Support line",
		"status":                   "pending",
		"display_phone_number":     nil,
		"phone_number_id":          nil,
		"waba_id":                  nil,
		"channel_token":            "q3W9v1mZk0bX7cJ2yT5rN8aH4sE6dF1gL0pU3oI9wQz",
		"connect_url":              "https://relay.example.com/connect/q3W9v1mZk0bX7cJ2yT5rN8aH4sE6dF1gL0pU3oI9wQz",
		"connected_at":             nil,
		"token_expires_at":         "2026-11-29T10:04:05.123Z",
		"upstream_disconnected_at": nil,
		"created_at":               "2026-11-22T10:04:05.123Z",
		"health": map[string]any{"quality_rating": nil, "messaging_limit": nil, "throughput": nil,
			"name_status": nil, "checked_at": nil},
	}
}

func activeChannel() map[string]any {
	c := channel()
	c["status"] = "active"
	c["display_phone_number"] = "+1 555-010-4477"
	c["phone_number_id"] = "106540352242922"
	c["waba_id"] = "102290129340398"
	c["connected_at"] = "2026-11-22T11:30:12.456Z"
	c["token_expires_at"] = nil
	return c
}

func webhook() map[string]any {
	return map[string]any{
		"id":          webhookID,
		"name":        "CRM",
		"url":         "https://crm.example.com/hooks/whatsapp",
		"events":      []any{"messages", "message_status"},
		"status":      "active",
		"scope":       "org",
		"channel_ids": []any{},
		"created_at":  "2026-11-22T10:20:00.000Z",
		"ordering":    "none",
		// receiver health (DESIGN §5b Failing receivers)
		"health": "ok", "failing_since": nil, "paused_reason": nil,

		"previous_secret_expires_at": nil, // always present (secret rotation)
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func request(method, target string, body []byte) *http.Request {
	req := httptest.NewRequest(method, target, nil)
	req.Header.Set("x-api-key", "crt_pk_test")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// exchange describes one exchange to Check.
type exchange struct {
	method, target string
	reqBody        []byte
	status         int
	header         http.Header
	respBody       []byte
}

func (e exchange) check(v *Validator, t testing.TB) {
	v.Check(t, request(e.method, e.target, e.reqBody), e.reqBody, e.status, e.header, e.respBody)
}

func TestDocumentValidates(t *testing.T) {
	v := Load(t)
	if got := v.Doc().OpenAPI; got != "3.1.0" {
		t.Errorf("openapi = %q, want 3.1.0", got)
	}
}

// TestOperations: the management API's handler serves exactly the operations the document
// describes: its route table (managementapi.Routes, the patterns its ServeMux registers) against
// the document's paths.
func TestOperations(t *testing.T) {
	got := Load(t).Operations()
	want := slices.Sorted(slices.Values(managementapi.Routes()))
	if !slices.Equal(got, want) {
		t.Errorf("docs/openapi.yaml's operations =\n%s\nmanagementapi.Routes() =\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// passes runs e against the document and fails the test if any mismatch is reported.
func passes(t *testing.T, v *Validator, e exchange) {
	t.Helper()
	rec := newRecorder(t)
	e.check(v, rec)
	if len(rec.errs) != 0 {
		t.Errorf("%s %s → %d: want no mismatch, got:\n%s", e.method, e.target, e.status, strings.Join(rec.errs, "\n"))
	}
}

// fails runs e against the document and fails the test unless a mismatch containing want is
// reported.
func fails(t *testing.T, v *Validator, e exchange, want string) {
	t.Helper()
	rec := newRecorder(t)
	e.check(v, rec)
	if len(rec.errs) == 0 {
		t.Errorf("%s %s → %d: want a mismatch containing %q, got none", e.method, e.target, e.status, want)
		return
	}
	for _, msg := range rec.errs {
		if strings.Contains(msg, want) {
			return
		}
	}
	t.Errorf("%s %s → %d: want a mismatch containing %q, got:\n%s", e.method, e.target, e.status, want, strings.Join(rec.errs, "\n"))
}

func TestChannelResponses(t *testing.T) {
	v := Load(t)
	get := func(body []byte) exchange {
		return exchange{method: http.MethodGet, target: "/channels/" + channelID, status: 200, header: jsonHeader, respBody: body}
	}
	passes(t, v, get(mustJSON(t, channel())))
	passes(t, v, get(append(mustJSON(t, channel()), '\n'))) // as json.Encoder writes it
	passes(t, v, get(mustJSON(t, activeChannel())))
	disconnected := activeChannel()
	disconnected["upstream_disconnected_at"] = "2026-12-20T08:15:00.000Z"
	passes(t, v, get(mustJSON(t, disconnected)))

	// Path parameters are plain strings: a non-UUID id routes (the server answers 404).
	passes(t, v, exchange{method: http.MethodGet, target: "/channels/not-a-uuid", status: 404, header: jsonHeader,
		respBody: []byte(`{"error":"Channel not found"}`)})

	bad := map[string]func(c map[string]any){
		"missing waba_id":       func(c map[string]any) { delete(c, "waba_id") },
		"missing created_at":    func(c map[string]any) { delete(c, "created_at") },
		"extra field":           func(c map[string]any) { c["hmac_secret"] = "whsec_x" },
		"status foo":            func(c map[string]any) { c["status"] = "foo" },
		"waba_id number":        func(c map[string]any) { c["waba_id"] = 102290129340398 },
		"name null":             func(c map[string]any) { c["name"] = nil },
		"created_at null":       func(c map[string]any) { c["created_at"] = nil },
		"timestamp without ms":  func(c map[string]any) { c["created_at"] = "2026-11-22T10:04:05Z" },
		"timestamp not UTC":     func(c map[string]any) { c["token_expires_at"] = "2026-11-22T10:04:05.123+01:00" },
		"timestamp not a date":  func(c map[string]any) { c["connected_at"] = "yesterday" },
		"id not a UUID":         func(c map[string]any) { c["id"] = "42" },
		"connect_url not a URI": func(c map[string]any) { c["connect_url"] = "connect/abc" },
	}
	for name, mutate := range bad {
		t.Run(name, func(t *testing.T) {
			c := channel()
			mutate(c)
			fails(t, v, get(mustJSON(t, c)), "does not match the document")
		})
	}

	t.Run("wrong content type", func(t *testing.T) {
		fails(t, v, exchange{method: http.MethodGet, target: "/channels/" + channelID, status: 200,
			header: http.Header{"Content-Type": {"text/plain"}}, respBody: mustJSON(t, channel())}, "does not match the document")
	})
	t.Run("list", func(t *testing.T) {
		list := exchange{method: http.MethodGet, target: "/channels", status: 200, header: jsonHeader}
		list.respBody = mustJSON(t, []any{channel(), activeChannel()})
		passes(t, v, list)
		list.respBody = []byte(`[]`)
		passes(t, v, list)
		list.respBody = []byte(`null`)
		fails(t, v, list, "does not match the document")
		c := channel()
		delete(c, "connect_url")
		list.respBody = mustJSON(t, []any{activeChannel(), c})
		fails(t, v, list, "does not match the document")
	})
}

func TestUndocumentedStatus(t *testing.T) {
	v := Load(t)
	fails(t, v, exchange{method: http.MethodGet, target: "/channels/" + channelID, status: 500, header: jsonHeader,
		respBody: []byte(`{"error":"Internal server error"}`)}, "status 500 not documented for this operation")
	fails(t, v, exchange{method: http.MethodGet, target: "/channels/" + channelID, status: 201, header: jsonHeader,
		respBody: mustJSON(t, channel())}, "status 201 not documented for this operation")
	fails(t, v, exchange{method: http.MethodDelete, target: "/channels/" + channelID, status: 200},
		"status 200 not documented for this operation")
}

func TestRouting(t *testing.T) {
	v := Load(t)
	fails(t, v, exchange{method: http.MethodGet, target: "/nope", status: 200, header: jsonHeader, respBody: []byte(`{}`)},
		"no route in the spec for GET /nope")
	fails(t, v, exchange{method: http.MethodPut, target: "/channels/" + channelID, status: 200, header: jsonHeader,
		respBody: mustJSON(t, channel())}, "no route in the spec for PUT /channels/"+channelID)

	// The server's own answers to paths and methods outside the document.
	passes(t, v, exchange{method: http.MethodGet, target: "/nope", status: 404, header: jsonHeader,
		respBody: []byte(`{"error":"Not found"}`)})
	passes(t, v, exchange{method: http.MethodPut, target: "/channels", status: 405,
		header: http.Header{"Content-Type": {"application/json"}, "Allow": {"GET, POST"}}, respBody: []byte(`{"error":"Method not allowed"}`)})
	passes(t, v, exchange{method: http.MethodGet, target: "/nope", status: 401, header: jsonHeader,
		respBody: []byte(`{"error":"x-api-key header required"}`)})
	fails(t, v, exchange{method: http.MethodGet, target: "/nope", status: 404, header: jsonHeader,
		respBody: []byte(`{"message":"Not found"}`)}, "does not match the document")
	// 405 is only for methods a documented path lacks.
	fails(t, v, exchange{method: http.MethodGet, target: "/nope", status: 405, header: jsonHeader,
		respBody: []byte(`{"error":"Method not allowed"}`)}, "no route in the spec for GET /nope")
}

func TestHealth(t *testing.T) {
	v := Load(t)
	req := httptest.NewRequest(http.MethodGet, "/health", nil) // no API key
	rec := newRecorder(t)
	v.Check(rec, req, nil, 200, jsonHeader, []byte(`{"status":"ok"}`))
	v.Check(rec, req, nil, 503, jsonHeader, []byte(`{"error":"Postgres unavailable"}`))
	if len(rec.errs) != 0 {
		t.Errorf("want no mismatch, got:\n%s", strings.Join(rec.errs, "\n"))
	}
	fails(t, v, exchange{method: http.MethodGet, target: "/health", status: 200, header: jsonHeader,
		respBody: []byte(`{"status":"degraded"}`)}, "does not match the document")
}

func TestRequests(t *testing.T) {
	v := Load(t)
	created := mustJSON(t, channel())
	passes(t, v, exchange{method: http.MethodPost, target: "/channels", reqBody: []byte(`{"name":"Support line"}`),
		status: 201, header: jsonHeader, respBody: created})
	// Unknown request fields are allowed.
	passes(t, v, exchange{method: http.MethodPost, target: "/channels", reqBody: []byte(`{"name":"x","color":"red"}`),
		status: 201, header: jsonHeader, respBody: created})

	// Invalid requests answered with the documented errors are fine…
	for _, e := range []exchange{
		{method: http.MethodPost, target: "/channels", reqBody: []byte(`{}`), status: 422, respBody: []byte(`{"error":"\"name\" is required"}`)},
		{method: http.MethodPost, target: "/channels", reqBody: []byte(`{"name":`), status: 400, respBody: []byte(`{"error":"Invalid JSON body"}`)},
		{method: http.MethodPost, target: "/webhooks", reqBody: []byte(`{"name":"a","url":"http://x","events":["messages"]}`), status: 422,
			respBody: []byte(`{"error":"\"url\" must start with https://"}`)},
		{method: http.MethodDelete, target: "/channels/" + channelID + "?force=maybe", status: 422, respBody: []byte(`{"error":"\"force\" must be a boolean"}`)},
		{method: http.MethodPatch, target: "/webhooks/" + webhookID, reqBody: []byte(`{"status":"stopped"}`), status: 422,
			respBody: []byte(`{"error":"\"status\" must be one of: active, paused"}`)},
	} {
		e.header = jsonHeader
		passes(t, v, e)
	}
	// …but accepting them is a mismatch.
	fails(t, v, exchange{method: http.MethodPost, target: "/channels", reqBody: []byte(`{}`), status: 201, header: jsonHeader, respBody: created},
		"server answered 201 to a request the document says is invalid")
	fails(t, v, exchange{method: http.MethodDelete, target: "/channels/" + channelID + "?force=maybe", status: 204},
		"server answered 204 to a request the document says is invalid")

	// 415: the request's Content-Type is wrong.
	req := request(http.MethodPost, "/channels", nil)
	req.Header.Set("Content-Type", "text/plain")
	rec := newRecorder(t)
	v.Check(rec, req, []byte(`name=x`), 415, jsonHeader, []byte(`{"error":"Content-Type must be application/json"}`))
	if len(rec.errs) != 0 {
		t.Errorf("415: want no mismatch, got:\n%s", strings.Join(rec.errs, "\n"))
	}
}

func TestEmptyBodies(t *testing.T) {
	v := Load(t)
	passes(t, v, exchange{method: http.MethodDelete, target: "/channels/" + channelID + "?force=true", status: 204})
	passes(t, v, exchange{method: http.MethodDelete, target: "/channels/" + channelID + "?force=", status: 204})
	passes(t, v, exchange{method: http.MethodDelete, target: "/channels/" + channelID, status: 204})
	passes(t, v, exchange{method: http.MethodDelete, target: "/webhooks/" + webhookID + "/channels/" + channelID, status: 204})
	fails(t, v, exchange{method: http.MethodDelete, target: "/webhooks/" + webhookID, status: 204, header: jsonHeader,
		respBody: []byte(`{}`)}, "must have an empty body")
	fails(t, v, exchange{method: http.MethodDelete, target: "/channels/" + channelID, status: 409, header: jsonHeader},
		"does not match the document")
}

func TestRateLimitHeaders(t *testing.T) {
	v := Load(t)
	h := http.Header{
		"Content-Type":        {"application/json"},
		"Retry-After":         {"7"},
		"Ratelimit-Limit":     {"600"},
		"Ratelimit-Remaining": {"0"},
		"Ratelimit-Reset":     {"7"},
	}
	body := []byte(`{"error":"Rate limit exceeded"}`)
	passes(t, v, exchange{method: http.MethodGet, target: "/webhooks", status: 429, header: h, respBody: body})

	noRetry := h.Clone()
	noRetry.Del("Retry-After")
	fails(t, v, exchange{method: http.MethodGet, target: "/webhooks", status: 429, header: noRetry, respBody: body}, `"Retry-After" missing`)

	badRetry := h.Clone()
	badRetry.Set("Retry-After", "soon")
	fails(t, v, exchange{method: http.MethodGet, target: "/webhooks", status: 429, header: badRetry, respBody: body}, "Retry-After")

	// Optional on successes, but checked when present.
	ok := exchange{method: http.MethodGet, target: "/webhooks", status: 200, header: h.Clone(), respBody: []byte(`[]`)}
	ok.header.Del("Retry-After")
	passes(t, v, ok)
	ok.header.Set("RateLimit-Remaining", "-1")
	fails(t, v, ok, "RateLimit-Remaining")
}

func TestWebhookResponses(t *testing.T) {
	v := Load(t)
	get := func(w map[string]any) exchange {
		return exchange{method: http.MethodGet, target: "/webhooks/" + webhookID, status: 200, header: jsonHeader, respBody: mustJSON(t, w)}
	}
	passes(t, v, get(webhook()))
	scoped := webhook()
	scoped["scope"], scoped["channel_ids"], scoped["status"] = "channels", []any{channelID}, "paused"
	passes(t, v, get(scoped))
	scoped["channel_ids"] = []any{} // last channel removed: scope stays channels
	passes(t, v, get(scoped))
	scoped["health"], scoped["failing_since"], scoped["paused_reason"] = "failing", "2026-12-01T03:12:09.411Z", "failing"
	passes(t, v, get(scoped)) // paused after failing for disable_after

	bad := map[string]func(w map[string]any){
		"org scope with channel_ids": func(w map[string]any) { w["channel_ids"] = []any{channelID} },
		"channel_ids null":           func(w map[string]any) { w["channel_ids"] = nil },
		"no events":                  func(w map[string]any) { w["events"] = []any{} },
		"duplicate events":           func(w map[string]any) { w["events"] = []any{"messages", "messages"} },
		"unknown event":              func(w map[string]any) { w["events"] = []any{"template_status"} },
		"http url":                   func(w map[string]any) { w["url"] = "http://crm.example.com/hooks" },
		"hmac_secret outside create": func(w map[string]any) { w["hmac_secret"] = "whsec_abc" },
		"status foo":                 func(w map[string]any) { w["status"] = "foo" },
		"missing scope":              func(w map[string]any) { delete(w, "scope") },
		"health foo":                 func(w map[string]any) { w["health"] = "down" },
		"missing failing_since":      func(w map[string]any) { delete(w, "failing_since") },
		"paused_reason foo":          func(w map[string]any) { w["paused_reason"] = "operator" },
	}
	for name, mutate := range bad {
		t.Run(name, func(t *testing.T) {
			w := webhook()
			mutate(w)
			fails(t, v, get(w), "does not match the document")
		})
	}

	create := func(w map[string]any) exchange {
		return exchange{method: http.MethodPost, target: "/webhooks",
			reqBody: []byte(`{"name":"CRM","url":"https://crm.example.com/hooks/whatsapp","events":["messages","message_status"],"channel_ids":null}`),
			status:  201, header: jsonHeader, respBody: mustJSON(t, w)}
	}
	w := webhook()
	w["hmac_secret"] = "whsec_Jx3mQ9vTt2b0a7Yc4kR8pW1sN6eH5uF0dG2iL9oZ3qA="
	passes(t, v, create(w))
	w["hmac_secret"] = "secret"
	fails(t, v, create(w), "does not match the document")
	fails(t, v, create(webhook()), "does not match the document") // no hmac_secret

	assign := exchange{method: http.MethodPost, target: "/webhooks/" + webhookID + "/channels/" + channelID, status: 200, header: jsonHeader,
		respBody: []byte(`{"webhook_config_id":"` + webhookID + `","channel_id":"` + channelID + `"}`)}
	passes(t, v, assign)
	assign.respBody = []byte(`{"webhook_config_id":"` + webhookID + `"}`)
	fails(t, v, assign, "does not match the document")
	assign.status, assign.respBody = 404, []byte(`{"error":"Webhook not found"}`)
	passes(t, v, assign)
}
