package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestWindowThroughCaddy (DESIGN §5c "Customer-service window") at the HTTP boundary, one Caddy
// with the relay in window_guard enforce, the upstream's webhook intake and the management API,
// on a channel receiving for two days: a text to a customer who never wrote is refused with
// 131047 and never reaches the upstream while a template goes out; the customer's message,
// posted by the upstream, opens the window for the relay (by notification) and the API; a late,
// older message does not move it back. Another org's key reads none of it (404).
func TestWindowThroughCaddy(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}", testAppSecret, testVerifyToken)
	site := "handle_path " + proxyPrefix + "/* {\n wabarelay_proxy {\n window_guard enforce\n }\n}\n" +
		"handle /webhooks/upstream {\n wabarelay_inbound\n}\nhandle_path /v1/* {\n wabarelay_api\n}"
	origin := e.caddySite("", appExtra, e.fake.URL(), site)
	ch := e.channelOn(true, pnid)
	e.fix.Exec(t, `UPDATE channels SET connected_at = now() - interval '2 days', contacts_since = now() - interval '2 days' WHERE id = $1`, ch.ID)
	_, key := e.fix.APIKey(t, e.org)
	e.waitCacheFlushed()
	sends := origin + proxyPrefix + "/" + pnid + "/messages"
	const customer = "15550001111"
	text := `{"messaging_product":"whatsapp","to":"+1 555 000 1111","type":"text","text":{"body":"hi"}}`
	tmpl := `{"messaging_product":"whatsapp","to":"` + customer + `","type":"template","template":{"name":"hello_world","language":{"code":"en_US"}}}`

	r := call(t, "POST", sends, ch.ChannelToken, text)
	var env struct {
		Error struct {
			Message   string
			Type      string
			Code      int
			ErrorData struct {
				MessagingProduct string `json:"messaging_product"`
				Details          string
			} `json:"error_data"`
			FBTraceID string `json:"fbtrace_id"`
		}
	}
	if r.status != 400 || r.header.Get("Wabarelay-Window") != "closed" || json.Unmarshal(r.body, &env) != nil ||
		env.Error.Message != "(#131047) Re-engagement message" || env.Error.Code != 131047 || env.Error.Type != "OAuthException" ||
		env.Error.ErrorData.MessagingProduct != "whatsapp" || !strings.HasPrefix(env.Error.ErrorData.Details, "Message failed to send because more than 24 hours") ||
		env.Error.FBTraceID == "" {
		t.Fatalf("a text to a closed window: %d %v %s", r.status, r.header, r.body)
	}
	if n := len(e.fake.RequestsTo("POST", "/messages")); n != 0 {
		t.Fatalf("the refused text reached the upstream (%d sends)", n)
	}
	if r := call(t, "POST", sends, ch.ChannelToken, tmpl); r.status != 200 || r.header.Get("Wabarelay-Window") != "closed" {
		t.Fatalf("a template to a closed window: %d %s", r.status, r.body)
	}

	sent := time.Now().Add(-time.Hour).Truncate(time.Second)
	post := func(id string, at time.Time) {
		t.Helper()
		body := `{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","changes":[{"field":"messages","value":` +
			`{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550100","phone_number_id":"` + pnid + `"},` +
			`"contacts":[{"profile":{"name":"Ann"},"wa_id":"` + customer + `"}],` +
			`"messages":[{"from":"` + customer + `","id":"wamid.` + id + `","timestamp":"` + fmt.Sprint(at.Unix()) + `","type":"text","text":{"body":"hi"}}]}}]}]}`
		if status, b := signedPost(t, origin+"/webhooks/upstream", testAppSecret, body); status != 200 {
			t.Fatalf("upstream post: %d %s", status, b)
		}
	}
	post("new", sent)
	testenv.Eventually(t, testenv.Patience, func() bool {
		return call(t, "POST", sends, ch.ChannelToken, text).header.Get("Wabarelay-Window") == "open"
	}, "the relay never saw the window open")
	post("late", sent.Add(-30*time.Hour)) // an older message, delivered late
	contact := apiCall(t, "GET", origin+"/v1/channels/"+ch.ID.String()+"/contacts/+1%20555-000-1111", key, "")
	var c map[string]any
	if contact.status != 200 || json.Unmarshal(contact.body, &c) != nil || c["window"] != "open" || c["wa_id"] != customer ||
		c["last_inbound_at"] != sent.UTC().Format("2006-01-02T15:04:05.000Z07:00") {
		t.Fatalf("the API after a late message: %d %s", contact.status, contact.body)
	}
	if r := call(t, "POST", sends, ch.ChannelToken, text); r.status != 200 || r.header.Get("Wabarelay-Window") != "open" {
		t.Fatalf("a text to the open window after the late message: %d %s", r.status, r.body)
	}

	// Another org's key reads nothing of the channel: its health (the channel), the window, its
	// usage — 404 Channel not found, as for a channel that does not exist.
	_, other := e.fix.APIKey(t, e.fix.Org(t).ID)
	for _, path := range []string{"/v1/channels/" + ch.ID.String(), "/v1/channels/" + ch.ID.String() + "/contacts/" + customer,
		"/v1/usage?channel_id=" + ch.ID.String(), "/v1/usage?format=csv&channel_id=" + ch.ID.String()} {
		r := apiCall(t, "GET", origin+path, other, "")
		if r.status != 404 || string(r.body) != `{"error":"Channel not found"}`+"\n" {
			t.Fatalf("another org's GET %s: %d %s", path, r.status, r.body)
		}
		if r := apiCall(t, "GET", origin+path, key, ""); r.status != 200 {
			t.Fatalf("the org's own GET %s: %d %s", path, r.status, r.body)
		}
	}
}
