package managementapi_test

import (
	"encoding/json"
	"testing"
)

// TestWebhookOrdering: "ordering" on create (default none) and PATCH (alone or with status),
// in every WebhookConfig answer; a bad value is refused with the §5b message.
func TestWebhookOrdering(t *testing.T) {
	e := newEnv(t)
	type orderingJSON struct {
		Status   string `json:"status"`
		Ordering string `json:"ordering"`
	}
	decode := func(r response) orderingJSON {
		t.Helper()
		var o orderingJSON
		if r.status != 200 || json.Unmarshal([]byte(r.body), &o) != nil {
			t.Fatalf("%d %s", r.status, r.body)
		}
		return o
	}
	plain := e.createWebhook(e.keyA, `{"name":"P","url":"https://h.example.com","events":["messages"]}`)
	if o := decode(e.do("GET", "/webhooks/"+plain.ID, e.keyA, "")); o.Ordering != "none" {
		t.Fatalf("default ordering %q", o.Ordering)
	}
	ordered := created[orderingJSON](e, "/webhooks", e.keyA,
		`{"name":"O","url":"https://h.example.com","events":["messages"],"ordering":"conversation"}`)
	if ordered.Ordering != "conversation" {
		t.Fatalf("created ordering %q", ordered.Ordering)
	}
	if o := decode(e.do("PATCH", "/webhooks/"+plain.ID, e.keyA, `{"ordering":"conversation"}`)); o.Ordering != "conversation" || o.Status != "active" {
		t.Fatalf("PATCH ordering: %+v", o)
	}
	if o := decode(e.do("PATCH", "/webhooks/"+plain.ID, e.keyA, `{"status":"paused","ordering":"none"}`)); o.Ordering != "none" || o.Status != "paused" {
		t.Fatalf("PATCH both: %+v", o)
	}
	if o := decode(e.do("PATCH", "/webhooks/"+plain.ID, e.keyA, `{"status":"active"}`)); o.Ordering != "none" || o.Status != "active" {
		t.Fatalf("PATCH status keeps ordering: %+v", o)
	}
	const bad = `"ordering" must be one of: none, conversation`
	for _, body := range []string{`{"ordering":"fifo"}`, `{"ordering":""}`, `{"status":"active","ordering":"Conversation"}`} {
		expectError(t, e.do("PATCH", "/webhooks/"+plain.ID, e.keyA, body), 422, bad)
	}
	expectError(t, e.do("PATCH", "/webhooks/"+plain.ID, e.keyA, `{"ordering":1}`), 422, `"ordering" must be a string`)
	expectError(t, e.do("PATCH", "/webhooks/"+plain.ID, e.keyA, `{"status":"x","ordering":"none"}`), 422, `"status" must be one of: active, paused`)
	expectError(t, e.do("POST", "/webhooks", e.keyA, `{"name":"B","url":"https://h.example.com","events":["messages"],"ordering":"all"}`), 422, bad)
	// the org's other key cannot see it; an unknown webhook is not found
	expectError(t, e.do("PATCH", "/webhooks/"+plain.ID, e.keyB, `{"ordering":"none"}`), 404, "Webhook not found")
}
