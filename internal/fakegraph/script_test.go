package fakegraph

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// sendTemplate posts a hello_world template to the recipient.
func sendTemplate(t *testing.T, f *fixture, to string) resp {
	t.Helper()
	return call(t, "POST", f.base+"/"+pnid+"/messages", tok,
		`{"messaging_product":"whatsapp","to":"`+to+`","type":"template","template":{"name":"hello_world","language":{"code":"en_US"}}}`)
}

// TestScript: the scripted errors answer the next sends to that recipient only, in order, each
// with the upstream's envelope and status; then the sends succeed again. MessagesTo counts the
// sends per recipient, failed ones included.
func TestScript(t *testing.T) {
	f := setup(t)
	f.g.Script("+1 555-0142", 130429, 131056, 131047)

	if r := sendTemplate(t, f, "15550199"); r.status != 200 {
		t.Fatalf("another recipient: %d %s", r.status, r.raw)
	}
	type want struct {
		status, code, subcode int
		message, details      string
	}
	for i, w := range []want{
		{429, 130429, 2494055, "(#130429) Rate limit hit", "Message failed to send because there were too many messages sent from this phone number in a short period of time"},
		{429, 131056, 0, "(#131056) (Business Account, Consumer Account) pair rate limit hit", "Too many messages sent from the sender phone number to the same recipient phone number in a short period of time."},
		{400, 131047, 0, "(#131047) Re-engagement message", "Message failed to send because more than 24 hours have passed since the customer last replied to this number."},
	} {
		r := sendTemplate(t, f, "15550142")
		if r.status != w.status || r.errCode() != w.code || r.errField("message") != w.message || r.errField("type") != "OAuthException" {
			t.Fatalf("send %d: %d %s", i, r.status, r.raw)
		}
		var env struct {
			Error struct {
				Subcode   int `json:"error_subcode"`
				ErrorData struct {
					MessagingProduct string `json:"messaging_product"`
					Details          string `json:"details"`
				} `json:"error_data"`
				FBTraceID string `json:"fbtrace_id"`
			} `json:"error"`
		}
		if err := json.Unmarshal(r.raw, &env); err != nil {
			t.Fatal(err)
		}
		if env.Error.Subcode != w.subcode || env.Error.ErrorData.Details != w.details || env.Error.ErrorData.MessagingProduct != "whatsapp" {
			t.Errorf("send %d: %s", i, r.raw)
		}
		if env.Error.FBTraceID == "" || env.Error.FBTraceID != r.header.Get("X-Fb-Request-Id") {
			t.Errorf("send %d: fbtrace_id %q, x-fb-request-id %q", i, env.Error.FBTraceID, r.header.Get("X-Fb-Request-Id"))
		}
		if !strings.HasPrefix(r.header.Get("Www-Authenticate"), `OAuth "Facebook Platform" "invalid_request" "(#`) {
			t.Errorf("send %d: WWW-Authenticate %q", i, r.header.Get("Www-Authenticate"))
		}
	}
	if r := sendTemplate(t, f, "+15550142"); r.status != 200 {
		t.Fatalf("after the script: %d %s", r.status, r.raw)
	}
	if got := f.g.Scripted("15550142"); len(got) != 0 {
		t.Errorf("still scripted: %v", got)
	}
	if n := len(f.g.MessagesTo("+1 555 0142")); n != 4 {
		t.Errorf("MessagesTo 15550142: %d sends, want 4", n)
	}
	if n := len(f.g.MessagesTo("15550199")); n != 1 {
		t.Errorf("MessagesTo 15550199: %d sends, want 1", n)
	}

	// A request the fake rejects on validation does not use up the script.
	f.g.Script("15550143", 131026)
	if r := call(t, "POST", f.base+"/"+pnid+"/messages", tok,
		`{"messaging_product":"whatsapp","to":"15550143","type":"template","template":{"name":"nope","language":{"code":"en_US"}}}`); r.errCode() != 132001 {
		t.Fatalf("unknown template: %d %s", r.status, r.raw)
	}
	if r := sendTemplate(t, f, "15550143"); r.status != 400 || r.errCode() != 131026 {
		t.Fatalf("131026: %d %s", r.status, r.raw)
	}

	// ClearFailures drops what is still scripted.
	f.g.Script("15550144", 131000, 131000)
	f.g.ClearFailures()
	if r := sendTemplate(t, f, "15550144"); r.status != 200 {
		t.Fatalf("after ClearFailures: %d %s", r.status, r.raw)
	}
}

// TestScriptUnknownCodePanics: a code the fake cannot answer is a mistake in the test.
func TestScriptUnknownCodePanics(t *testing.T) {
	f := setup(t)
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	f.g.Script("15550142", 999999)
}

// TestScriptEndpoint: POST /_fake/script scripts the same as Script, with the demo options on,
// and answers 400 naming what is wrong.
func TestScriptEndpoint(t *testing.T) {
	f := setup(t, WithDemoSDK(0))
	r := call(t, "POST", f.root+"/_fake/script", "", `{"to":"+1 555 0142","errors":[130429,131047]}`)
	if r.status != 200 || r.body["to"] != "15550142" {
		t.Fatalf("script: %d %s", r.status, r.raw)
	}
	if got := f.g.Scripted("15550142"); !slices.Equal(got, []int{130429, 131047}) {
		t.Fatalf("scripted %v", got)
	}
	if r := sendTemplate(t, f, "15550142"); r.errCode() != 130429 {
		t.Fatalf("first send: %d %s", r.status, r.raw)
	}
	for _, c := range []struct{ body, msg string }{
		{`{"to":"15550142","errors":[1234]}`, "error 1234 cannot be scripted; known codes: 190, 130429"},
		{`{"to":"abc","errors":[130429]}`, `"to" must be a phone number`},
		{`{"to":"15550142","errors":[]}`, `"errors" must list`},
		{`{"to":"15550142","errs":[130429]}`, `unknown field "errs"`},
	} {
		r := call(t, "POST", f.root+"/_fake/script", "", c.body)
		if msg, _ := r.body["error"].(string); r.status != 400 || !strings.Contains(msg, c.msg) {
			t.Errorf("%s: %d %s", c.body, r.status, r.raw)
		}
	}
	if r := call(t, "GET", f.root+"/_fake/script", "", ""); r.status != 405 {
		t.Errorf("GET: %d", r.status)
	}
	if got := f.g.Scripted("15550142"); !slices.Equal(got, []int{131047}) {
		t.Errorf("scripted after the bad requests %v", got)
	}
}
