package fakegraph

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// sdkSignup fetches GET /sdk.js and returns the signup written into it.
func sdkSignup(t *testing.T, root string) Signup {
	t.Helper()
	res, err := http.Get(root + "/sdk.js")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	js, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/javascript") ||
		res.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("sdk.js: %d %v", res.StatusCode, res.Header)
	}
	for _, want := range []string{"window.FB = {", "WA_EMBEDDED_SIGNUP", "'FINISH'", "fbAsyncInit", "Demo signup"} {
		if !strings.Contains(string(js), want) {
			t.Errorf("sdk.js lacks %q", want)
		}
	}
	m := regexp.MustCompile(`var SIGNUP = (\{.*\});`).FindSubmatch(js)
	if m == nil {
		t.Fatalf("no signup data in sdk.js")
	}
	var su Signup
	if err := json.Unmarshal(m[1], &su); err != nil {
		t.Fatal(err)
	}
	if su.PhoneNumberID == "" || su.WabaID == "" || su.BusinessID == "" || su.Code == "" || su.DisplayPhoneNumber == "" {
		t.Fatalf("signup %+v", su)
	}
	if strings.Contains(string(js), "EAAG") {
		t.Error("the access token is in the script")
	}
	return su
}

// TestDemoSDK: every fetch of /sdk.js makes up its own number, business account and code; the
// code exchanges once for a token that may use exactly that number and account.
func TestDemoSDK(t *testing.T) {
	f := setup(t, WithDemoSDK(0, Template{Name: "hello_world", Language: "en_US", Status: "APPROVED", Category: "UTILITY"}))
	a, b := sdkSignup(t, f.root), sdkSignup(t, f.root)
	if a.PhoneNumberID == b.PhoneNumberID || a.WabaID == b.WabaID || a.Code == b.Code || a.DisplayPhoneNumber == b.DisplayPhoneNumber {
		t.Fatalf("two fetches, one signup: %+v %+v", a, b)
	}
	if a.DisplayPhoneNumber != "+1 555 0101" || b.DisplayPhoneNumber != "+1 555 0102" {
		t.Errorf("display numbers %q %q", a.DisplayPhoneNumber, b.DisplayPhoneNumber)
	}
	if f.g.LastSignup() != "" {
		t.Fatal("LastSignup before any exchange")
	}

	ex := func(code string) resp {
		return call(t, "GET", f.base+"/oauth/access_token?client_id="+appID+"&client_secret="+appSK+"&code="+code, "", "")
	}
	r := ex(a.Code)
	tokA, _ := r.body["access_token"].(string)
	if r.status != 200 || !strings.HasPrefix(tokA, "EAA") {
		t.Fatalf("exchange: %d %s", r.status, r.raw)
	}
	expectError(t, ex(a.Code), 400, 100, 36009, "This authorization code has been used.")
	if f.g.LastSignup() != a.PhoneNumberID {
		t.Fatalf("LastSignup = %q, want %q", f.g.LastSignup(), a.PhoneNumberID)
	}

	// what the completion and the relay do with the token
	steps := []struct {
		method, path, body string
		want               string
	}{
		{"GET", "/" + a.WabaID + "/phone_numbers", "", `"id":"` + a.PhoneNumberID + `"`},
		{"POST", "/" + a.WabaID + "/subscribed_apps", "", `{"success":true}`},
		{"POST", "/" + a.PhoneNumberID + "/register", `{"messaging_product":"whatsapp","pin":"123456"}`, `{"success":true}`},
		{"GET", "/" + a.PhoneNumberID + "?fields=display_phone_number,verified_name", "", `"display_phone_number":"+1 555 0101","verified_name":"Demo Business 1"`},
		{"POST", "/" + a.PhoneNumberID + "/messages", textBody, `"messages":[{"id":"wamid.`},
		{"GET", "/" + a.WabaID + "/message_templates?fields=name,status", "", `"name":"hello_world"`},
	}
	for _, st := range steps {
		r := call(t, st.method, f.base+st.path, tokA, st.body)
		if r.status != 200 || !strings.Contains(string(r.raw), st.want) {
			t.Errorf("%s %s: %d %s", st.method, st.path, r.status, r.raw)
		}
	}
	if sub, _ := f.g.Subscribed(a.WabaID); !sub {
		t.Error("not subscribed")
	}
	if _, pin, _ := f.g.NumberState(a.PhoneNumberID); pin != "123456" {
		t.Errorf("pin %q", pin)
	}
	// the other signup's number and account stay out of reach
	expectError(t, call(t, "POST", f.base+"/"+b.PhoneNumberID+"/messages", tokA, textBody), 403, 10, 0, "")
	expectError(t, call(t, "POST", f.base+"/"+b.WabaID+"/subscribed_apps", tokA, ""), 403, 200, 0, "")
	expectError(t, call(t, "POST", f.base+"/"+pnid+"/messages", tokA, textBody), 403, 10, 0, "")

	// the same as JSON, for a completion without a browser
	r = call(t, "POST", f.root+"/_fake/signup", "", "")
	var c Signup
	if r.status != 200 || json.Unmarshal(r.raw, &c) != nil || c.Code == "" || c.PhoneNumberID == "" || c.DisplayPhoneNumber != "+1 555 0103" {
		t.Fatalf("_fake/signup: %d %s", r.status, r.raw)
	}
	if strings.Contains(string(r.raw), "EAAG") {
		t.Error("_fake/signup hands out the access token")
	}
	if r := ex(c.Code); r.status != 200 || f.g.LastSignup() != c.PhoneNumberID {
		t.Fatalf("exchange of the JSON signup: %d %s", r.status, r.raw)
	}
	if r := call(t, "GET", f.root+"/_fake/signup", "", ""); r.status != 405 {
		t.Errorf("GET _fake/signup: %d", r.status)
	}
}

// TestDemoEndpointsOff: without the demo options the fake is the plain Graph API.
func TestDemoEndpointsOff(t *testing.T) {
	f := setup(t)
	for _, p := range []string{"/sdk.js", "/_fake/signup", "/_fake/inbound", "/_fake/account_webhook"} {
		r := call(t, "POST", f.root+p, "", "")
		if r.status != 400 || r.errCode() == 0 {
			t.Errorf("%s: %d %s", p, r.status, r.raw)
		}
	}
	if len(f.g.Requests()) != 4 {
		t.Errorf("recorded %d requests", len(f.g.Requests()))
	}
}

// newHook is a callback URL (the kit's receiver) that answers every post with status.
func newHook(t *testing.T, status int) *testenv.Receiver {
	return testenv.NewReceiver(t, &testenv.ReceiverOpts{Respond: func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(status)
		io.WriteString(w, `{"events":1}`)
	}})
}

// post waits for the hook's n-th post (counted from 1) and returns it.
func post(t *testing.T, hook *testenv.Receiver, n int) testenv.Delivery {
	t.Helper()
	return hook.WaitN(t, n)[n-1]
}

// TestEmitMessage: an emitted message is the upstream's "messages" webhook, signed with the app
// secret over the exact bytes sent (Graph-escaped), and the inbound package reads it.
func TestEmitMessage(t *testing.T) {
	hook := newHook(t, 200)
	f := setup(t, WithDemoSDK(0), WithCallback(hook.URL+"/webhooks/upstream"))
	ctx := context.Background()

	// no number signed up yet and none given
	if err := f.g.EmitMessage(ctx, hook.URL, appSK, "", "", "hi"); err == nil || !strings.Contains(err.Error(), "no number signed up") {
		t.Fatalf("without a number: %v", err)
	}
	su := sdkSignup(t, f.root)
	call(t, "GET", f.base+"/oauth/access_token?client_id="+appID+"&client_secret="+appSK+"&code="+su.Code, "", "")

	text := "Olá / <ok> & ☕"
	if err := f.g.EmitMessage(ctx, hook.URL, appSK, "", "+1 650-555-9999", text); err != nil {
		t.Fatal(err)
	}
	p := post(t, hook, 1)
	if p.Header.Get("Content-Type") != "application/json" || !inbound.VerifySignature(appSK, p.Body, p.Header.Get("X-Hub-Signature-256")) {
		t.Fatalf("signature %q does not verify; headers %v", p.Header.Get("X-Hub-Signature-256"), p.Header)
	}
	if inbound.VerifySignature("other-secret", p.Body, p.Header.Get("X-Hub-Signature-256")) {
		t.Fatal("verifies with another secret")
	}
	for _, want := range []string{`\u00e1`, `\/`, `\u2615`, `"display_phone_number":"15550101"`} {
		if !strings.Contains(string(p.Body), want) {
			t.Errorf("body lacks %s: %s", want, p.Body)
		}
	}
	batch, err := inbound.Parse(p.Body)
	if err != nil || len(batch.Items) != 1 || batch.Skipped != 0 {
		t.Fatalf("parse: %+v %v", batch, err)
	}
	it := batch.Items[0]
	if it.Type != inbound.TypeMessage || it.PhoneNumberID != su.PhoneNumberID || it.WabaID != su.WabaID || !strings.HasPrefix(it.DedupeKey, "m:wamid.") {
		t.Fatalf("item %+v", it)
	}
	var data struct {
		Message struct {
			From, ID, Timestamp, Type string
			Text                      struct{ Body string }
		}
		Contact struct {
			Profile struct{ Name string }
			WaID    string `json:"wa_id"`
		}
	}
	if err := json.Unmarshal(it.Data, &data); err != nil {
		t.Fatal(err)
	}
	if data.Message.From != "16505559999" || data.Message.Type != "text" || data.Message.Text.Body != text ||
		data.Contact.WaID != "16505559999" || data.Contact.Profile.Name != "Demo Customer" || data.Message.Timestamp == "" {
		t.Fatalf("data %s", it.Data)
	}

	// an image: a medium of the number, which the number's token can read
	res, err := f.g.Emit(ctx, hook.URL, appSK, InboundMessage{PhoneNumberID: su.PhoneNumberID, Type: "image", Text: "a photo"})
	if err != nil || res.Status != 200 || res.MediaID == "" {
		t.Fatalf("image: %+v %v", res, err)
	}
	p = post(t, hook, 2)
	batch, _ = inbound.Parse(p.Body)
	if len(batch.Items) != 1 || len(batch.Items[0].ObjectIDs) != 1 || batch.Items[0].ObjectIDs[0] != res.MediaID ||
		!strings.Contains(string(p.Body), `"caption":"a photo"`) {
		t.Fatalf("image webhook %s → %+v", p.Body, batch)
	}

	// bad input
	for _, m := range []InboundMessage{{PhoneNumberID: "404"}, {From: "bob"}, {Type: "video"}} {
		if _, err := f.g.Emit(ctx, hook.URL, appSK, m); err == nil {
			t.Errorf("%+v: no error", m)
		}
	}
	if hook.Count() != 2 {
		t.Fatal("bad input was posted")
	}

	// a callback that refuses: EmitMessage names its status
	refusing := newHook(t, 401)
	if err := f.g.EmitMessage(ctx, refusing.URL, appSK, su.PhoneNumberID, "", ""); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("refused: %v", err)
	}
	post(t, refusing, 1)
}

// TestInboundEndpoint: POST /_fake/inbound emits to the configured callback and answers with
// the callback's status.
func TestInboundEndpoint(t *testing.T) {
	hook := testenv.NewReceiver(t, &testenv.ReceiverOpts{Respond: func(n int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(map[int]int{1: 200, 2: 503}[n]) // the first post is accepted, the second refused
	}})
	f := setup(t, WithDemoSDK(0), WithCallback(hook.URL))

	if r := call(t, "POST", f.root+"/_fake/inbound", "", `{"text":"hi"}`); r.status != 400 || !strings.Contains(string(r.raw), "no number signed up") {
		t.Fatalf("before a signup: %d %s", r.status, r.raw)
	}
	r := call(t, "POST", f.root+"/_fake/inbound", "", `{"phone_number_id":"`+pnid+`","from":"15550001111","name":"Ann","text":"Hello"}`)
	if r.status != 200 || r.body["phone_number_id"] != pnid || !strings.HasPrefix(r.body["message_id"].(string), "wamid.") || r.body["callback_status"] != 200.0 {
		t.Fatalf("emit: %d %s", r.status, r.raw)
	}
	p := post(t, hook, 1)
	if !inbound.VerifySignature(appSK, p.Body, p.Header.Get("X-Hub-Signature-256")) || !strings.Contains(string(p.Body), `"name":"Ann"`) {
		t.Fatalf("post %s", p.Body)
	}
	if r := call(t, "POST", f.root+"/_fake/inbound", "", `{"phone_number_id":"`+pnid+`"}`); r.status != 503 || r.body["callback_status"] != 503.0 {
		t.Fatalf("callback 503: %d %s", r.status, r.raw)
	}
	post(t, hook, 2)
	for _, body := range []string{`{"type":"sticker","phone_number_id":"` + pnid + `"}`, `{"txt":"typo"}`, `[`} {
		if r := call(t, "POST", f.root+"/_fake/inbound", "", body); r.status != 400 {
			t.Errorf("%s: %d %s", body, r.status, r.raw)
		}
	}
	hook.Close()
	if r := call(t, "POST", f.root+"/_fake/inbound", "", `{"phone_number_id":"`+pnid+`"}`); r.status != 502 {
		t.Errorf("callback down: %d %s", r.status, r.raw)
	}
}
