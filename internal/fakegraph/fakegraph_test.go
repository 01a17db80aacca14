package fakegraph

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	pnid  = "106540352242922"
	waba  = "102290129340398"
	tok   = "EAAtest-token"
	appID = "1234567890"
	appSK = "app-secret"
)

type fixture struct {
	g    *Server
	base string // base URL including the version, e.g. http://127.0.0.1:1234/v26.0
	root string // base URL without the version
}

func setup(t testing.TB, opts ...Option) *fixture {
	t.Helper()
	g := New(append([]Option{WithAppID(appID), WithAppSecret(appSK)}, opts...)...)
	root := g.Start()
	t.Cleanup(g.Close)
	g.AddNumber(pnid, waba, "+1 555-0100", "Lucky Shrub")
	g.AddToken(tok, []string{pnid}, []string{waba})
	g.AddTemplates(waba,
		Template{ID: "1192339204654487", Name: "hello_world", Language: "en_US", Status: "APPROVED", Category: "UTILITY",
			Components: []any{map[string]any{"type": "HEADER", "format": "TEXT", "text": "Hello World"},
				map[string]any{"type": "BODY", "text": "Welcome and congratulations!!"}}},
		Template{Name: "order_update", Language: "en_US", Status: "APPROVED", Category: "UTILITY",
			Components: []any{map[string]any{"type": "BODY", "text": "Hi {{1}}, your order {{2}} shipped. {{1}}!"}}},
		Template{Name: "promo", Language: "en_US", Status: "PENDING", Category: "MARKETING"},
		Template{Name: "paused_one", Language: "en_US", Status: "PAUSED", Category: "MARKETING"},
	)
	return &fixture{g: g, base: root + "/v26.0", root: root}
}

type resp struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

func (r resp) errCode() int {
	e, _ := r.body["error"].(map[string]any)
	c, _ := e["code"].(float64)
	return int(c)
}

func (r resp) errField(k string) any {
	e, _ := r.body["error"].(map[string]any)
	return e[k]
}

func call(t testing.TB, method, u, token, body string) resp {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := resp{status: res.StatusCode, header: res.Header, raw: raw}
	if len(raw) > 0 && raw[0] == '{' {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			t.Fatalf("bad JSON %q: %v", raw, err)
		}
	}
	return r
}

// expectError checks a Graph error envelope.
func expectError(t *testing.T, r resp, status, code, subcode int, message string) {
	t.Helper()
	if r.status != status {
		t.Errorf("status = %d, want %d; body %s", r.status, status, r.raw)
	}
	if r.errCode() != code {
		t.Errorf("code = %d, want %d; body %s", r.errCode(), code, r.raw)
	}
	sc, _ := r.errField("error_subcode").(float64)
	if int(sc) != subcode {
		t.Errorf("error_subcode = %v, want %d", r.errField("error_subcode"), subcode)
	}
	if message != "" && r.errField("message") != message {
		t.Errorf("message = %q, want %q", r.errField("message"), message)
	}
	trace, _ := r.errField("fbtrace_id").(string)
	if trace == "" || trace != r.header.Get("X-Fb-Request-Id") {
		t.Errorf("fbtrace_id %q should be set and equal x-fb-request-id %q", trace, r.header.Get("X-Fb-Request-Id"))
	}
	if typ, _ := r.errField("type").(string); typ == "" {
		t.Errorf("type missing: %s", r.raw)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("content-type %q", ct)
	}
	if wa := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(wa, `OAuth "Facebook Platform" "`) {
		t.Errorf("WWW-Authenticate = %q", wa)
	}
}

const textBody = `{"messaging_product":"whatsapp","recipient_type":"individual","to":"+16505551234","type":"text","text":{"preview_url":false,"body":"hello"}}`

func TestSendTextSuccessShape(t *testing.T) {
	f := setup(t)
	r := call(t, "POST", f.base+"/"+pnid+"/messages", tok, textBody)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.raw)
	}
	var got struct {
		MessagingProduct string `json:"messaging_product"`
		Contacts         []map[string]string
		Messages         []map[string]string
	}
	dec := json.NewDecoder(bytes.NewReader(r.raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("shape: %v: %s", err, r.raw)
	}
	if got.MessagingProduct != "whatsapp" || len(got.Contacts) != 1 || len(got.Messages) != 1 {
		t.Fatalf("unexpected body %s", r.raw)
	}
	if c := got.Contacts[0]; c["input"] != "+16505551234" || c["wa_id"] != "16505551234" || len(c) != 2 {
		t.Errorf("contacts = %v", c)
	}
	if m := got.Messages[0]; !strings.HasPrefix(m["id"], "wamid.HBg") || len(m) != 1 {
		t.Errorf("messages = %v (text sends carry no message_status)", m)
	}
	for h, want := range map[string]string{
		"Content-Type":                "application/json; charset=UTF-8",
		"Facebook-Api-Version":        "v26.0",
		"Access-Control-Allow-Origin": "*",
		"Cache-Control":               "private, no-cache, no-store, must-revalidate",
	} {
		if r.header.Get(h) != want {
			t.Errorf("%s = %q, want %q", h, r.header.Get(h), want)
		}
	}
	for _, h := range []string{"X-Fb-Trace-Id", "X-Fb-Request-Id", "X-Fb-Rev", "X-Fb-Debug", "Strict-Transport-Security"} {
		if r.header.Get(h) == "" {
			t.Errorf("header %s missing", h)
		}
	}
	var usage map[string][]map[string]any
	if err := json.Unmarshal([]byte(r.header.Get("X-Business-Use-Case-Usage")), &usage); err != nil || usage[waba] == nil {
		t.Errorf("x-business-use-case-usage = %q", r.header.Get("X-Business-Use-Case-Usage"))
	}

	// Without "+" and with type omitted (defaults to text).
	r = call(t, "POST", f.base+"/"+pnid+"/messages", tok, `{"messaging_product":"whatsapp","to":"16505551234","text":{"body":"x"}}`)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.raw)
	}
	// Business-scoped user id (§1.4).
	r = call(t, "POST", f.base+"/"+pnid+"/messages", tok, `{"messaging_product":"whatsapp","to":"user.abc123","type":"text","text":{"body":"x"}}`)
	c := r.body["contacts"].([]any)[0].(map[string]any)
	if c["wa_id"] != "" || c["user_id"] != "user.abc123" {
		t.Errorf("BSUID contact = %v", c)
	}
}

func TestWAMIDsUnique(t *testing.T) {
	f := setup(t)
	seen := map[string]bool{}
	for range 300 {
		r := call(t, "POST", f.base+"/"+pnid+"/messages", tok, textBody)
		id := r.body["messages"].([]any)[0].(map[string]any)["id"].(string)
		if seen[id] {
			t.Fatalf("duplicate wamid %s", id)
		}
		seen[id] = true
	}
}

func TestSendTemplate(t *testing.T) {
	f := setup(t)
	u := f.base + "/" + pnid + "/messages"
	tpl := func(name, lang, comps string) string {
		s := `{"messaging_product":"whatsapp","to":"16505551234","type":"template","template":{"name":"` + name + `","language":{"code":"` + lang + `"}`
		if comps != "" {
			s += `,"components":` + comps
		}
		return s + `}}`
	}

	r := call(t, "POST", u, tok, tpl("hello_world", "en_US", ""))
	if r.status != 200 {
		t.Fatalf("hello_world: %d %s", r.status, r.raw)
	}
	if m := r.body["messages"].([]any)[0].(map[string]any); m["message_status"] != "accepted" {
		t.Errorf("template send should carry message_status accepted: %s", r.raw)
	}

	two := `[{"type":"body","parameters":[{"type":"text","text":"Ana"},{"type":"text","text":"A-1"}]}]`
	if r := call(t, "POST", u, tok, tpl("order_update", "en_US", two)); r.status != 200 {
		t.Fatalf("order_update: %d %s", r.status, r.raw)
	}

	r = call(t, "POST", u, tok, tpl("nope", "en_US", ""))
	expectError(t, r, 404, 132001, 0, "(#132001) Template name does not exist in the translation")
	if d := r.errField("error_data").(map[string]any); d["details"] != "template name (nope) does not exist in en_US" || d["messaging_product"] != "whatsapp" {
		t.Errorf("error_data = %v", d)
	}
	expectError(t, call(t, "POST", u, tok, tpl("hello_world", "pt_BR", "")), 404, 132001, 0, "")
	expectError(t, call(t, "POST", u, tok, tpl("promo", "en_US", "")), 404, 132001, 0, "")
	expectError(t, call(t, "POST", u, tok, tpl("paused_one", "en_US", "")), 400, 132015, 0, "(#132015) Template is paused")

	one := `[{"type":"body","parameters":[{"type":"text","text":"Ana"}]}]`
	r = call(t, "POST", u, tok, tpl("order_update", "en_US", one))
	expectError(t, r, 400, 132000, 0, "(#132000) Number of parameters does not match the expected number of params")
	if d := r.errField("error_data").(map[string]any); d["details"] != "body: number of localizable_params (1) does not match the expected number of params (2)" {
		t.Errorf("details = %v", d["details"])
	}
	expectError(t, call(t, "POST", u, tok, tpl("order_update", "en_US", "")), 400, 132000, 0, "")
	expectError(t, call(t, "POST", u, tok, tpl("hello_world", "en_US", one)), 400, 132000, 0, "")

	// Template of another WABA is not visible to this number.
	f.g.AddNumber("999", "888", "+1 555-0199", "Other")
	f.g.AddToken("other", []string{"999"}, nil)
	expectError(t, call(t, "POST", f.base+"/999/messages", "other", tpl("hello_world", "en_US", "")), 404, 132001, 0, "")
}

func TestSendValidation(t *testing.T) {
	f := setup(t)
	u := f.base + "/" + pnid + "/messages"
	cases := []struct {
		name, body string
		code       int
		msg        string
	}{
		{"idempotency_key", `{"messaging_product":"whatsapp","to":"16505551234","type":"text","text":{"body":"x"},"idempotency_key":"k1"}`,
			100, `(#100) Unexpected key "idempotency_key".`},
		{"unknown top-level", `{"messaging_product":"whatsapp","to":"1","type":"text","text":{"body":"x"},"foo":1}`,
			100, `(#100) Unexpected key "foo".`},
		{"missing messaging_product", `{"to":"16505551234","type":"text","text":{"body":"x"}}`,
			100, "(#100) The parameter messaging_product is required."},
		{"not JSON", `messaging_product=whatsapp`, 100, "(#100) The parameter messaging_product is required."},
		{"wrong messaging_product", `{"messaging_product":"sms","to":"1","text":{"body":"x"}}`,
			100, `(#100) Param messaging_product must be one of {WHATSAPP} - got "sms".`},
		{"missing to", `{"messaging_product":"whatsapp","type":"text","text":{"body":"x"}}`,
			100, "(#100) The parameter to is required."},
		{"bad type", `{"messaging_product":"whatsapp","to":"1","type":"fax"}`,
			100, `(#100) Param type must be one of {AUDIO, BUTTON, CONTACTS, DOCUMENT, IMAGE, INTERACTIVE, LOCATION, REACTION, STICKER, TEMPLATE, TEXT, VIDEO} - got "fax".`},
		{"missing text body", `{"messaging_product":"whatsapp","to":"1","type":"text","text":{}}`,
			100, "(#100) The parameter text.body is required."},
		{"text too long", `{"messaging_product":"whatsapp","to":"1","type":"text","text":{"body":"` + strings.Repeat("é", 4097) + `"}}`,
			100, "(#100) Param text['body'] must be at most 4096 characters long."},
		{"unknown key in text", `{"messaging_product":"whatsapp","to":"1","type":"text","text":{"body":"x","caption":"y"}}`,
			100, `(#100) Unexpected key "caption" on param "text".`},
		{"unknown key in language", `{"messaging_product":"whatsapp","to":"1","type":"template","template":{"name":"hello_world","language":{"code":"en_US","policystring":"deterministic"}}}`,
			100, `(#100) Unexpected key "policystring" on param "template['language']".`},
		{"template name missing", `{"messaging_product":"whatsapp","to":"1","type":"template","template":{"language":{"code":"en_US"}}}`,
			100, "(#100) The parameter template['name'] is required."},
		{"language code missing", `{"messaging_product":"whatsapp","to":"1","type":"template","template":{"name":"hello_world","language":{}}}`,
			100, "(#100) The parameter template['language']['code'] is required."},
		{"empty text parameter", `{"messaging_product":"whatsapp","to":"1","type":"template","template":{"name":"order_update","language":{"code":"en_US"},"components":[{"type":"body","parameters":[{"type":"text","text":""},{"type":"text","text":"b"}]}]}}`,
			100, "(#100) Invalid parameter"},
		{"image without object", `{"messaging_product":"whatsapp","to":"1","type":"image"}`,
			100, "(#100) The parameter image is required."},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			expectError(t, call(t, "POST", u, tok, c.body), 400, c.code, 0, c.msg)
		})
	}
	// The text-too-long check counts characters, not bytes.
	if r := call(t, "POST", u, tok, `{"messaging_product":"whatsapp","to":"1","text":{"body":"`+strings.Repeat("é", 4096)+`"}}`); r.status != 200 {
		t.Errorf("4096 characters should pass: %d %s", r.status, r.raw)
	}
	// Other types pass with their object.
	if r := call(t, "POST", u, tok, `{"messaging_product":"whatsapp","to":"1","type":"image","image":{"link":"https://x/y.png"}}`); r.status != 200 {
		t.Errorf("image: %d %s", r.status, r.raw)
	}
	// Mark as read.
	r := call(t, "POST", u, tok, `{"messaging_product":"whatsapp","status":"read","message_id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQUYzMjEzNDM2RTZGQ0MzMDJBRgA="}`)
	if r.status != 200 || string(r.raw) != `{"success":true}` {
		t.Errorf("mark read: %d %s", r.status, r.raw)
	}
	// Unregistered number.
	f.g.SetRegistered(pnid, false)
	expectError(t, call(t, "POST", u, tok, textBody), 400, 133010, 0, "(#133010) Account not registered")
}

// The relay must strip idempotency_key: the fake rejects it exactly like any unknown key, and
// the same body without it succeeds.
func TestIdempotencyKeyRejected(t *testing.T) {
	f := setup(t)
	u := f.base + "/" + pnid + "/messages"
	r := call(t, "POST", u, tok, `{"idempotency_key":"abc","messaging_product":"whatsapp","to":"16505551234","type":"text","text":{"body":"hi"}}`)
	expectError(t, r, 400, 100, 0, `(#100) Unexpected key "idempotency_key".`)
	if got := r.header.Get("WWW-Authenticate"); got != `OAuth "Facebook Platform" "invalid_request" "(#100) Unexpected key \"idempotency_key\"."` {
		t.Errorf("WWW-Authenticate = %s", got)
	}
	if r := call(t, "POST", u, tok, `{"messaging_product":"whatsapp","to":"16505551234","type":"text","text":{"body":"hi"}}`); r.status != 200 {
		t.Errorf("without the key: %d", r.status)
	}
}

func TestAuthErrors(t *testing.T) {
	f := setup(t)
	u := f.base + "/" + pnid + "/messages"

	r := call(t, "POST", u, "", textBody)
	expectError(t, r, 401, 104, 0, "An access token is required to request this resource.")

	r = call(t, "POST", u, "garbage", textBody)
	expectError(t, r, 401, 190, 0, "Invalid OAuth access token - Cannot parse access token")
	if got := r.header.Get("WWW-Authenticate"); got != `OAuth "Facebook Platform" "invalid_token" "Invalid OAuth access token - Cannot parse access token"` {
		t.Errorf("WWW-Authenticate = %q", got)
	}
	if r.errField("type") != "OAuthException" {
		t.Errorf("type = %v", r.errField("type"))
	}

	// The token in the query string works like the header.
	if r := call(t, "POST", u+"?access_token="+tok, "", textBody); r.status != 200 {
		t.Errorf("access_token query: %d %s", r.status, r.raw)
	}

	f.g.AddToken("t2", []string{pnid}, nil)
	f.g.RevokeToken("t2")
	r = call(t, "POST", u, "t2", textBody)
	expectError(t, r, 401, 190, 460, "")
	if !strings.Contains(r.header.Get("WWW-Authenticate"), `"invalid_token"`) {
		t.Errorf("WWW-Authenticate = %q", r.header.Get("WWW-Authenticate"))
	}
	// Revocation applies to every endpoint.
	expectError(t, call(t, "GET", f.base+"/"+waba+"/message_templates", "t2", ""), 401, 190, 460, "")

	f.g.AddToken("t3", []string{pnid}, nil)
	f.g.ExpireToken("t3")
	r = call(t, "POST", u, "t3", textBody)
	expectError(t, r, 401, 190, 463, "")
	if msg, _ := r.errField("message").(string); !strings.HasPrefix(msg, "Error validating access token: Session has expired on ") {
		t.Errorf("message = %q", msg)
	}
	// Re-adding revives.
	f.g.AddToken("t3", []string{pnid}, nil)
	if r := call(t, "POST", u, "t3", textBody); r.status != 200 {
		t.Errorf("re-added token: %d", r.status)
	}
}

func TestRoutingErrors(t *testing.T) {
	f := setup(t)
	// Wrong or missing version segment: checked before the token.
	// An unknown version is taken as a node id (Graph answers /v99.0/me with "Unknown path
	// components: /me").
	r := call(t, "POST", f.root+"/v99.0/"+pnid+"/messages", "", textBody)
	expectError(t, r, 400, 2500, 0, "Unknown path components: /"+pnid+"/messages")
	r = call(t, "POST", f.root+"/"+pnid+"/messages", tok, textBody)
	expectError(t, r, 400, 2500, 0, "Unknown path components: /messages")
	// Extra versions can be allowed.
	g2 := New(WithExtraVersions("v25.0"))
	g2.AddNumber(pnid, waba, "+1", "x")
	g2.AddToken(tok, []string{pnid}, nil)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/v25.0/"+pnid+"/messages", strings.NewReader(textBody))
	req.Header.Set("Authorization", "Bearer "+tok)
	g2.ServeHTTP(rec, req)
	if rec.Code != 200 || rec.Header().Get("Facebook-Api-Version") != "v25.0" {
		t.Errorf("extra version: %d %s", rec.Code, rec.Header().Get("Facebook-Api-Version"))
	}

	// Unknown object.
	r = call(t, "POST", f.base+"/123456/messages", tok, textBody)
	expectError(t, r, 400, 100, 33, "Unsupported post request. Object with ID '123456' does not exist, cannot be loaded due to missing permissions, or does not support this operation. Please read the Graph API documentation at https://developers.facebook.com/docs/graph-api")
	if r.errField("type") != "GraphMethodException" {
		t.Errorf("type = %v", r.errField("type"))
	}
	// Graph escapes "/" in JSON strings.
	if !bytes.Contains(r.raw, []byte(`https:\/\/developers.facebook.com\/docs\/graph-api`)) {
		t.Errorf("slashes not escaped: %s", r.raw)
	}
	// Unsupported method on a known edge.
	expectError(t, call(t, "GET", f.base+"/"+pnid+"/messages", tok, ""), 400, 100, 33, "")
	// Unknown edge.
	expectError(t, call(t, "GET", f.base+"/"+pnid+"/bogus", tok, ""), 400, 100, 0,
		"(#100) Tried accessing nonexisting field (bogus) on node type (WhatsAppBusinessPhoneNumber)")
	expectError(t, call(t, "GET", f.base+"/"+waba+"/message_templates/x", tok, ""), 400, 2500, 0, "Unknown path components: /x")
}

func TestPermissions(t *testing.T) {
	f := setup(t)
	f.g.AddNumber("555", "777", "+1 555-0155", "Elsewhere")
	f.g.AddTemplates("777", Template{Name: "hello_world", Language: "en_US", Status: "APPROVED"})

	r := call(t, "POST", f.base+"/555/messages", tok, textBody)
	expectError(t, r, 403, 10, 0, "(#10) Application does not have permission for this action")
	if !strings.Contains(r.header.Get("WWW-Authenticate"), `"insufficient_scope"`) {
		t.Errorf("WWW-Authenticate = %q", r.header.Get("WWW-Authenticate"))
	}
	expectError(t, call(t, "GET", f.base+"/777/message_templates", tok, ""), 403, 200, 0, "(#200) Permissions error")
	expectError(t, call(t, "POST", f.base+"/777/subscribed_apps", tok, ""), 403, 200, 0, "")
	expectError(t, call(t, "POST", f.base+"/555/register", tok, `{"messaging_product":"whatsapp","pin":"123456"}`), 403, 200, 0, "")
	expectError(t, call(t, "GET", f.base+"/555", tok, ""), 403, 200, 0, "")

	// A WABA grant covers that WABA's numbers.
	f.g.AddToken("wabatok", nil, []string{"777"})
	if r := call(t, "POST", f.base+"/555/messages", "wabatok", textBody); r.status != 200 {
		t.Errorf("WABA grant: %d %s", r.status, r.raw)
	}
	// "*" grants everything.
	f.g.AddToken("root", []string{"*"}, nil)
	if r := call(t, "GET", f.base+"/777/message_templates", "root", ""); r.status != 200 {
		t.Errorf("wildcard: %d %s", r.status, r.raw)
	}
}

func TestTemplatesListFieldsAndFilters(t *testing.T) {
	f := setup(t)
	u := f.base + "/" + waba + "/message_templates"

	r := call(t, "GET", u+"?fields=name,category,status&limit=5", tok, "")
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.raw)
	}
	data := r.body["data"].([]any)
	if len(data) != 4 {
		t.Fatalf("len = %d", len(data))
	}
	first := data[0].(map[string]any)
	if len(first) != 4 || first["name"] != "hello_world" || first["category"] != "UTILITY" || first["status"] != "APPROVED" || first["id"] != "1192339204654487" {
		t.Errorf("first = %v", first)
	}
	// Requested order, id last (as in §2.2).
	if !bytes.HasPrefix(r.raw, []byte(`{"data":[{"name":"hello_world","category":"UTILITY","status":"APPROVED","id":"1192339204654487"}`)) {
		t.Errorf("order: %s", r.raw)
	}
	if _, has := r.body["paging"].(map[string]any)["next"]; has {
		t.Errorf("single page must not have next: %s", r.raw)
	}

	// Default fields include components and language.
	r = call(t, "GET", u+"?name=hello_world", tok, "")
	data = r.body["data"].([]any)
	if len(data) != 1 {
		t.Fatalf("name filter: %s", r.raw)
	}
	d := data[0].(map[string]any)
	for _, k := range []string{"name", "parameter_format", "components", "language", "status", "category", "id"} {
		if _, ok := d[k]; !ok {
			t.Errorf("default field %s missing: %v", k, d)
		}
	}
	comps := d["components"].([]any)
	if comps[1].(map[string]any)["text"] != "Welcome and congratulations!!" {
		t.Errorf("components = %v", comps)
	}

	r = call(t, "GET", u+"?status=approved&fields=name", tok, "")
	if n := len(r.body["data"].([]any)); n != 2 {
		t.Errorf("status filter: %d %s", n, r.raw)
	}
	r = call(t, "GET", u+"?status=PENDING,PAUSED&fields=name", tok, "")
	if n := len(r.body["data"].([]any)); n != 2 {
		t.Errorf("status list filter: %d %s", n, r.raw)
	}
	expectError(t, call(t, "GET", u+"?status=bogus", tok, ""), 400, 100, 0, "")
	r = call(t, "GET", u+"?category=marketing&fields=name&summary=total_count", tok, "")
	if n := len(r.body["data"].([]any)); n != 2 || r.body["summary"].(map[string]any)["total_count"] != 2.0 {
		t.Errorf("category filter: %s", r.raw)
	}
	expectError(t, call(t, "GET", u+"?fields=name,wat", tok, ""), 400, 100, 0,
		"(#100) Tried accessing nonexisting field (wat) on node type (WhatsAppBusinessHSM)")

	// Single template node.
	r = call(t, "GET", f.base+"/1192339204654487?fields=name", tok, "")
	if r.status != 200 || string(r.raw) != `{"name":"hello_world","id":"1192339204654487"}` {
		t.Errorf("template node: %d %s", r.status, r.raw)
	}
	// Empty WABA.
	f.g.AddToken("t4", nil, []string{"empty"})
	r = call(t, "GET", f.base+"/empty/message_templates", "t4", "")
	if r.status != 200 || string(r.raw) != `{"data":[]}` {
		t.Errorf("empty: %s", r.raw)
	}
}

// Walks all pages through paging.next, proving the caller's token is embedded in the links and
// that following them (with no Authorization header) works.
func TestTemplatesPagingWalk(t *testing.T) {
	f := setup(t)
	var more []Template
	for i := range 60 {
		more = append(more, Template{Name: fmt.Sprintf("t_%02d", i), Language: "en_US", Status: "APPROVED", Category: "UTILITY"})
	}
	f.g.AddTemplates(waba, more...)
	const total = 64

	next := f.base + "/" + waba + "/message_templates?fields=name,status&limit=25"
	var names []string
	pages := 0
	token := tok
	for next != "" {
		r := call(t, "GET", next, token, "")
		token = "" // later pages authenticate with the token inside the link only
		if r.status != 200 {
			t.Fatalf("page %d: %d %s", pages, r.status, r.raw)
		}
		pages++
		for _, d := range r.body["data"].([]any) {
			m := d.(map[string]any)
			if len(m) != 3 {
				t.Fatalf("fields not honoured: %v", m)
			}
			names = append(names, m["name"].(string))
		}
		paging := r.body["paging"].(map[string]any)
		cur := paging["cursors"].(map[string]any)
		if pages == 1 && (cur["before"] != "MAZDZD" || cur["after"] != "MjQZD") {
			t.Errorf("cursors = %v, want Graph-style MAZDZD/MjQZD", cur)
		}
		if pages == 1 {
			if _, has := paging["previous"]; has {
				t.Errorf("first page has previous")
			}
		} else if _, has := paging["previous"]; !has {
			t.Errorf("page %d lacks previous", pages)
		}
		next, _ = paging["next"].(string)
		if next != "" {
			if !bytes.Contains(r.raw, []byte(`"next":"http:\/\/127.0.0.1`)) || !bytes.Contains(r.raw, []byte(`&pretty=0&`)) {
				t.Errorf("next link should be an absolute URL, escaped like Graph (\\/ but raw &): %s", r.raw)
			}
			lu, err := url.Parse(next)
			if err != nil {
				t.Fatal(err)
			}
			if lu.Query().Get("access_token") != tok {
				t.Fatalf("next link must embed the caller's token: %s", next)
			}
			if !strings.HasPrefix(next, f.base+"/"+waba+"/message_templates?access_token=") {
				t.Errorf("next = %s", next)
			}
			if lu.Query().Get("fields") != "name,status" || lu.Query().Get("limit") != "25" {
				t.Errorf("next link lost parameters: %s", next)
			}
		}
	}
	if pages != 3 || len(names) != total {
		t.Fatalf("pages = %d, names = %d", pages, len(names))
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			t.Fatalf("duplicate %s", n)
		}
		seen[n] = true
	}
	if names[0] != "hello_world" || names[total-1] != "t_59" {
		t.Errorf("order: first %s last %s", names[0], names[total-1])
	}

	// previous walks back.
	r := call(t, "GET", f.base+"/"+waba+"/message_templates?fields=name&limit=25&after=MjQZD", tok, "")
	prev := r.body["paging"].(map[string]any)["previous"].(string)
	r = call(t, "GET", prev, "", "")
	if d := r.body["data"].([]any); len(d) != 25 || d[0].(map[string]any)["name"] != "hello_world" {
		t.Errorf("previous page: %s", r.raw)
	}
	// A token given in the query string is the one embedded.
	f.g.AddToken("querytok", nil, []string{waba})
	r = call(t, "GET", f.base+"/"+waba+"/message_templates?limit=10&access_token=querytok", "", "")
	if lu, _ := url.Parse(r.body["paging"].(map[string]any)["next"].(string)); lu.Query().Get("access_token") != "querytok" {
		t.Errorf("next = %v", r.body["paging"])
	}
	expectError(t, call(t, "GET", f.base+"/"+waba+"/message_templates?after=!!", tok, ""), 400, 100, 0, "")
}

func TestPagingLinksUseRequestHostWhenUnstarted(t *testing.T) {
	g := New(WithPlainJSON())
	g.AddToken(tok, nil, []string{waba})
	for i := range 3 {
		g.AddTemplates(waba, Template{Name: fmt.Sprint("n", i), Status: "APPROVED"})
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "http://fake.local/v26.0/"+waba+"/message_templates?limit=1", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	g.ServeHTTP(rec, req)
	if !strings.Contains(rec.Body.String(), `"next":"http://fake.local/v26.0/`+waba+`/message_templates?access_token=`+tok) {
		t.Errorf("body = %s", rec.Body.String())
	}
}

func TestOAuthAccessToken(t *testing.T) {
	f := setup(t)
	ex := func(q string) resp { return call(t, "GET", f.base+"/oauth/access_token?"+q, "", "") }
	f.g.AddCode("code1", "EAAnew", 0)
	f.g.AddToken("EAAnew", []string{pnid}, []string{waba})

	r := ex("client_id=" + appID + "&client_secret=" + appSK + "&code=code1")
	if r.status != 200 || string(r.raw) != `{"access_token":"EAAnew","token_type":"bearer"}` {
		t.Fatalf("exchange: %d %s", r.status, r.raw)
	}
	r = ex("client_id=" + appID + "&client_secret=" + appSK + "&code=code1")
	expectError(t, r, 400, 100, 36009, "This authorization code has been used.")
	if got := r.header.Get("WWW-Authenticate"); got != `OAuth "Facebook Platform" "invalid_code" "This authorization code has been used."` {
		t.Errorf("WWW-Authenticate = %q", got)
	}
	f.g.AddCode("code2", "EAAx", -time.Second) // expired
	expectError(t, ex("client_id="+appID+"&client_secret="+appSK+"&code=code2"), 400, 100, 36007, "This authorization code has expired.")
	expectError(t, ex("client_id="+appID+"&client_secret="+appSK+"&code=nope"), 400, 100, 36007, "Invalid verification code format.")
	expectError(t, ex("client_id="+appID+"&client_secret=wrong&code=code1"), 400, 1, 0, "Error validating client secret.")
	expectError(t, ex("client_id=999&client_secret="+appSK+"&code=code1"), 400, 101, 0, "Error validating application. Invalid application ID.")
	expectError(t, ex("client_secret="+appSK+"&code=code1"), 400, 101, 0, "Missing client_id parameter.")

	// A code whose token was never added yields a valid token without grants.
	f.g.AddCode("code3", "EAAbare", 0)
	if r := ex("client_id=" + appID + "&client_secret=" + appSK + "&code=code3"); r.status != 200 {
		t.Fatalf("code3: %s", r.raw)
	}
	expectError(t, call(t, "POST", f.base+"/"+waba+"/subscribed_apps", "EAAbare", ""), 403, 200, 0, "")
}

func TestSubscribedApps(t *testing.T) {
	f := setup(t)
	u := f.base + "/" + waba + "/subscribed_apps"
	r := call(t, "GET", u, tok, "")
	if string(r.raw) != `{"data":[]}` {
		t.Errorf("before: %s", r.raw)
	}
	r = call(t, "POST", u, tok, "")
	if r.status != 200 || string(r.raw) != `{"success":true}` {
		t.Fatalf("subscribe: %d %s", r.status, r.raw)
	}
	if sub, _ := f.g.Subscribed(waba); !sub {
		t.Error("not subscribed")
	}
	r = call(t, "GET", u, tok, "")
	item := r.body["data"].([]any)[0].(map[string]any)["whatsapp_business_api_data"].(map[string]any)
	if item["id"] != appID {
		t.Errorf("GET: %s", r.raw)
	}
	expectError(t, call(t, "POST", u, tok, `{"override_callback_uri":"https://x.example/hook"}`), 400, 100, 0, "(#100) The parameter verify_token is required.")
	if r := call(t, "POST", u, tok, `{"override_callback_uri":"https://x.example/hook","verify_token":"v"}`); r.status != 200 {
		t.Errorf("override: %s", r.raw)
	}
	if _, uri := f.g.Subscribed(waba); uri != "https://x.example/hook" {
		t.Errorf("override uri = %q", uri)
	}
	r = call(t, "DELETE", u, tok, "")
	if r.status != 200 || string(r.raw) != `{"success":true}` {
		t.Fatalf("unsubscribe: %d %s", r.status, r.raw)
	}
	if sub, _ := f.g.Subscribed(waba); sub {
		t.Error("still subscribed")
	}
}

func TestRegister(t *testing.T) {
	f := setup(t)
	u := f.base + "/" + pnid + "/register"
	body := `{"messaging_product":"whatsapp","pin":"123456"}`
	r := call(t, "POST", u, tok, body)
	if r.status != 200 || string(r.raw) != `{"success":true}` {
		t.Fatalf("register: %d %s", r.status, r.raw)
	}
	if reg, pin, n := f.g.NumberState(pnid); !reg || pin != "123456" || n != 1 {
		t.Errorf("state = %v %q %d", reg, pin, n)
	}
	r = call(t, "POST", u, tok, `{"messaging_product":"whatsapp","pin":"12345"}`)
	expectError(t, r, 400, 100, 0, "(#100) Invalid parameter")
	if d := r.errField("error_data").(map[string]any); d["details"] != "Invalid PIN format. PIN must be exactly 6 digits" {
		t.Errorf("details = %v", d)
	}
	expectError(t, call(t, "POST", u, tok, `{"messaging_product":"whatsapp"}`), 400, 100, 0, "(#100) The parameter pin is required.")
	expectError(t, call(t, "POST", u, tok, `{"pin":"123456"}`), 400, 100, 0, "(#100) The parameter messaging_product is required.")
	// Two-step PIN already set: a different one mismatches.
	r = call(t, "POST", u, tok, `{"messaging_product":"whatsapp","pin":"654321"}`)
	expectError(t, r, 400, 133005, 0, "(#133005) Two step verification PIN Mismatch")
	// Scripted error.
	f.g.SetRegisterError(pnid, 133005)
	expectError(t, call(t, "POST", u, tok, body), 400, 133005, 0, "")
	f.g.SetRegisterError(pnid, 0)
	// The 10-per-72h limit (attempts so far: 1 ok + 1 mismatch + 1 scripted = 3).
	for i := 3; i < 10; i++ {
		if r := call(t, "POST", u, tok, body); r.status != 200 {
			t.Fatalf("call %d: %s", i+1, r.raw)
		}
	}
	expectError(t, call(t, "POST", u, tok, body), 400, 133016, 0, "(#133016) Account register deregister rate limit exceeded")
	// Form-encoded bodies work too.
	f.g.AddNumber("321", waba, "+1 555-0121", "Form")
	req, _ := http.NewRequest("POST", f.base+"/321/register", strings.NewReader("messaging_product=whatsapp&pin=000111"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("form register: %v %v", err, res.StatusCode)
	}
	res.Body.Close()
}

func TestReadNumber(t *testing.T) {
	f := setup(t)
	r := call(t, "GET", f.base+"/"+pnid+"?fields=display_phone_number,verified_name", tok, "")
	if r.status != 200 || string(r.raw) != `{"display_phone_number":"+1 555-0100","verified_name":"Lucky Shrub","id":"`+pnid+`"}` {
		t.Fatalf("%d %s", r.status, r.raw)
	}
	r = call(t, "GET", f.base+"/"+pnid, tok, "")
	for _, k := range []string{"verified_name", "code_verification_status", "display_phone_number", "quality_rating", "platform_type", "throughput", "id"} {
		if _, ok := r.body[k]; !ok {
			t.Errorf("default field %s missing: %s", k, r.raw)
		}
	}
	expectError(t, call(t, "GET", f.base+"/"+pnid+"?fields=nope", tok, ""), 400, 100, 0, "")
	r = call(t, "GET", f.base+"/"+waba+"/phone_numbers", tok, "")
	if d := r.body["data"].([]any); len(d) != 1 || d[0].(map[string]any)["id"] != pnid {
		t.Errorf("phone_numbers: %s", r.raw)
	}
	r = call(t, "GET", f.base+"/"+waba+"?fields=id,name", tok, "")
	if r.status != 200 || r.body["id"] != waba || r.body["name"] == nil {
		t.Errorf("waba: %s", r.raw)
	}
}

func TestDebugToken(t *testing.T) {
	f := setup(t)
	u := f.base + "/debug_token?access_token=" + appID + "|" + appSK + "&input_token="
	r := call(t, "GET", u+tok, "", "")
	d := r.body["data"].(map[string]any)
	if r.status != 200 || d["is_valid"] != true || d["expires_at"] != 0.0 {
		t.Fatalf("%s", r.raw)
	}
	gs := d["granular_scopes"].([]any)[0].(map[string]any)
	if ids := gs["target_ids"].([]any); len(ids) != 1 || ids[0] != waba {
		t.Errorf("granular_scopes = %v", gs)
	}
	f.g.RevokeToken(tok)
	r = call(t, "GET", u+tok, "", "")
	if d := r.body["data"].(map[string]any); d["is_valid"] != false || d["error"].(map[string]any)["code"] != 190.0 {
		t.Errorf("revoked: %s", r.raw)
	}
	r = call(t, "GET", u+"unknown", "", "")
	if d := r.body["data"].(map[string]any); d["is_valid"] != false {
		t.Errorf("unknown: %s", r.raw)
	}
}

func TestMedia(t *testing.T) {
	f := setup(t)
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("messaging_product", "whatsapp")
	_ = mw.WriteField("type", "image/png")
	fw, _ := mw.CreateFormFile("file", "a.png")
	_, _ = fw.Write([]byte("PNGDATA"))
	_ = mw.Close()
	req, _ := http.NewRequest("POST", f.base+"/"+pnid+"/media", &buf)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var up struct{ ID string }
	_ = json.NewDecoder(res.Body).Decode(&up)
	res.Body.Close()
	if res.StatusCode != 200 || up.ID == "" {
		t.Fatalf("upload: %d %v", res.StatusCode, up)
	}
	r := call(t, "GET", f.base+"/"+up.ID, tok, "")
	if r.status != 200 || r.body["mime_type"] != "image/png" || r.body["file_size"] != 7.0 {
		t.Fatalf("media node: %s", r.raw)
	}
	dl := r.body["url"].(string)
	if !strings.HasPrefix(dl, f.root+"/whatsapp_business/attachments/?mid="+up.ID) {
		t.Errorf("url = %s", dl)
	}
	r = call(t, "GET", dl, tok, "")
	if r.status != 200 || string(r.raw) != "PNGDATA" {
		t.Errorf("download: %d %s", r.status, r.raw)
	}
	if r := call(t, "GET", dl, "", ""); r.status != 401 {
		t.Errorf("download without token: %d", r.status)
	}
	expectError(t, call(t, "POST", f.base+"/"+pnid+"/media", tok, `{}`), 400, 100, 0, "(#100) The parameter messaging_product is required.")
	if r := call(t, "DELETE", f.base+"/"+up.ID, tok, ""); string(r.raw) != `{"success":true}` {
		t.Errorf("delete: %s", r.raw)
	}
}

func TestFailNext(t *testing.T) {
	f := setup(t)
	u := f.base + "/" + pnid + "/messages"

	f.g.FailNext("POST /"+pnid+"/messages", 2, 0, ErrRateLimitHit())
	for i := range 2 {
		r := call(t, "POST", u, tok, textBody)
		expectError(t, r, 429, 130429, 2494055, "(#130429) Rate limit hit")
		if i == 0 && r.errField("error_data").(map[string]any)["messaging_product"] != "whatsapp" {
			t.Errorf("error_data: %s", r.raw)
		}
	}
	if r := call(t, "POST", u, tok, textBody); r.status != 200 {
		t.Fatalf("third call should pass: %d", r.status)
	}

	// Other method/path unaffected; explicit observed status.
	f.g.FailNext("POST /"+pnid+"/messages", 1, 400, ErrPairRateLimit())
	if r := call(t, "GET", f.base+"/"+pnid, tok, ""); r.status != 200 {
		t.Errorf("GET affected: %d", r.status)
	}
	expectError(t, call(t, "POST", u, tok, textBody), 400, 131056, 0, "")

	// Dead token, with WWW-Authenticate invalid_token.
	f.g.FailNext("/"+waba+"/message_templates", 1, 0, ErrTokenExpired())
	r := call(t, "GET", f.base+"/"+waba+"/message_templates", tok, "")
	expectError(t, r, 401, 190, 463, "")
	if !strings.Contains(r.header.Get("WWW-Authenticate"), `"invalid_token"`) {
		t.Errorf("WWW-Authenticate = %q", r.header.Get("WWW-Authenticate"))
	}

	// Wildcard segment and match-anything; GraphError helper.
	f.g.FailNext("POST /*/messages", 1, 500, GraphError("An unknown error has occurred.", "OAuthException", 1, 0))
	expectError(t, call(t, "POST", u, tok, textBody), 500, 1, 0, "An unknown error has occurred.")
	f.g.FailNext("", 1, 503, []byte("upstream down"))
	r = call(t, "GET", f.base+"/"+pnid, tok, "")
	if r.status != 503 || string(r.raw) != "upstream down" {
		t.Errorf("raw body: %d %s", r.status, r.raw)
	}
	// Injected answers apply even without a valid token (they replace the whole answer).
	f.g.FailNext("POST /"+pnid+"/messages", 1, 200, map[string]any{"success": true})
	if r := call(t, "POST", u, "", textBody); r.status != 200 {
		t.Errorf("injected success: %d", r.status)
	}

	// Connection drop.
	f.g.FailNext("POST /"+pnid+"/messages", 1, -1, nil)
	req, _ := http.NewRequest("POST", u, strings.NewReader(textBody))
	req.Header.Set("Authorization", "Bearer "+tok)
	if res, err := http.DefaultClient.Do(req); err == nil {
		res.Body.Close()
		t.Errorf("expected a transport error, got %d", res.StatusCode)
	}

	// ClearFailures.
	f.g.FailNext("", 5, 500, nil)
	f.g.ClearFailures()
	if r := call(t, "POST", u, tok, textBody); r.status != 200 {
		t.Errorf("after ClearFailures: %d", r.status)
	}
	if DocStatus(131047) != 400 || DocStatus(132001) != 404 || DocStatus(250) != 403 {
		t.Error("DocStatus")
	}
}

func TestRequestRecord(t *testing.T) {
	f := setup(t)
	call(t, "POST", f.base+"/"+pnid+"/messages", tok, textBody)
	call(t, "GET", f.base+"/"+waba+"/message_templates?fields=name", tok, "")
	call(t, "POST", f.base+"/"+pnid+"/messages", "bad", textBody)

	all := f.g.Requests()
	if len(all) != 3 {
		t.Fatalf("len = %d", len(all))
	}
	sends := f.g.RequestsTo("POST", "/messages")
	if len(sends) != 2 || string(sends[0].Body) != textBody || sends[0].Header.Get("Authorization") != "Bearer "+tok ||
		sends[0].Path != "/v26.0/"+pnid+"/messages" || sends[0].At.IsZero() {
		t.Errorf("sends = %+v", sends)
	}
	if g := f.g.RequestsTo("get", "/message_templates"); len(g) != 1 || g[0].RawQuery != "fields=name" {
		t.Errorf("get = %+v", g)
	}
	if len(f.g.RequestsTo("", "/"+pnid+"/messages")) != 2 {
		t.Error("any-method filter")
	}
	f.g.Reset()
	if len(f.g.Requests()) != 0 {
		t.Error("Reset")
	}
	// State survives Reset.
	if r := call(t, "POST", f.base+"/"+pnid+"/messages", tok, textBody); r.status != 200 {
		t.Error("state lost")
	}

	g := New(WithMaxRecorded(3))
	for i := range 10 {
		g.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", fmt.Sprintf("/v26.0/x%d", i), nil))
	}
	if rs := g.Requests(); len(rs) != 3 || rs[2].Path != "/v26.0/x9" || rs[0].Path != "/v26.0/x7" {
		t.Errorf("bounded record = %v", rs)
	}
}

func TestGraphStyleEscaping(t *testing.T) {
	f := setup(t)
	f.g.AddTemplates(waba, Template{ID: "77", Name: "acentos", Status: "APPROVED", Language: "pt_BR",
		Components: []any{map[string]any{"type": "BODY", "text": "Olá & até já 👋 <b>"}}})
	r := call(t, "GET", f.base+"/77?fields=components", tok, "")
	want := `{"components":[{"text":"Ol\u00e1 & at\u00e9 j\u00e1 \ud83d\udc4b <b>","type":"BODY"}],"id":"77"}`
	if string(r.raw) != want {
		t.Errorf("got  %s\nwant %s", r.raw, want)
	}
	if r.body["components"].([]any)[0].(map[string]any)["text"] != "Olá & até já 👋 <b>" {
		t.Errorf("decoded: %v", r.body)
	}
}

func TestGzip(t *testing.T) {
	f := setup(t)
	get := func(u string) *http.Response {
		req, _ := http.NewRequest("GET", u, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Accept-Encoding", "gzip") // set explicitly: the transport won't decompress
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := get(f.base + "/" + waba + "/message_templates?limit=1")
	defer res.Body.Close()
	if res.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("Content-Encoding = %q", res.Header.Get("Content-Encoding"))
	}
	zr, err := gzip.NewReader(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if err := json.NewDecoder(zr).Decode(&body); err != nil || body["paging"] == nil {
		t.Fatalf("decoded %v, %v", body, err)
	}

	g := New(WithoutGzip())
	g.AddToken(tok, nil, []string{waba})
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/v26.0/"+waba+"/message_templates", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept-Encoding", "gzip")
	g.ServeHTTP(rec, req)
	if rec.Header().Get("Content-Encoding") != "" || rec.Body.String() != `{"data":[]}` {
		t.Errorf("WithoutGzip: %q %s", rec.Header().Get("Content-Encoding"), rec.Body.String())
	}
}

func TestLatency(t *testing.T) {
	f := setup(t)
	// 10 requests of 1 s each: at least 1 s, and far below the 10 s they would take one after
	// another (a margin a loaded machine cannot use up)
	const latency = time.Second
	f.g.SetLatency(latency)
	start := time.Now()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if r := call(t, "POST", f.base+"/"+pnid+"/messages", tok, textBody); r.status != 200 {
				t.Errorf("status %d", r.status)
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	if el < latency || el > 5*latency {
		t.Errorf("10 parallel requests with %v latency took %v (must not serialize)", latency, el)
	}
	f.g.SetLatency(0)
}

func TestConcurrency(t *testing.T) {
	f := setup(t, WithMaxRecorded(500))
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]bool{}
	for w := range 32 {
		wg.Go(func() {
			for i := range 30 {
				switch (w + i) % 6 {
				case 0:
					call(t, "GET", f.base+"/"+waba+"/message_templates?limit=2", tok, "")
				case 1:
					f.g.AddTemplates(waba, Template{Name: fmt.Sprintf("c_%d_%d", w, i), Status: "APPROVED"})
				case 2:
					f.g.FailNext("GET /"+pnid, 1, 500, ErrSomethingWentWrong())
					call(t, "GET", f.base+"/"+pnid, tok, "")
				case 3:
					_ = f.g.Requests()
					f.g.AddToken(fmt.Sprint("x", w), []string{pnid}, nil)
					f.g.RevokeToken(fmt.Sprint("x", w))
				default:
					r := call(t, "POST", f.base+"/"+pnid+"/messages", tok, textBody)
					if r.status != 200 {
						t.Errorf("send: %d %s", r.status, r.raw)
						return
					}
					id := r.body["messages"].([]any)[0].(map[string]any)["id"].(string)
					mu.Lock()
					if seen[id] {
						t.Errorf("duplicate wamid")
					}
					seen[id] = true
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkSendText(b *testing.B) {
	g := New(WithMaxRecorded(1000))
	g.AddNumber(pnid, waba, "+1", "x")
	g.AddToken(tok, []string{pnid}, nil)
	body := []byte(textBody)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest("POST", "/v26.0/"+pnid+"/messages", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+tok)
			rec := httptest.NewRecorder()
			g.ServeHTTP(rec, req)
			if rec.Code != 200 {
				b.Fatal(rec.Code)
			}
		}
	})
}
