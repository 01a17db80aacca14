package connect_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/google/uuid"

	_ "github.com/wabarelay/wabarelay" // the wabarelay modules, for MainCaddy

	"github.com/wabarelay/wabarelay/connect"
	"github.com/wabarelay/wabarelay/graph"
	"github.com/wabarelay/wabarelay/internal/browsertest"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestMain runs the tests, or, started by testenv.StartCaddy, this test binary as the wabarelay
// Caddy (TestBrowserRealCaddy): no separate build of ./cmd/caddy. After the tests it stops the
// browser the browser tests share.
func TestMain(m *testing.M) { testenv.MainCaddy(m, caddycmd.Main, browsertest.StopShared) }

const (
	appID, appSecret = "1234567890", "app-secret-xyz"
	configID         = "cfg-1"
	pnid, waba       = "106540352242922", "524126980791429"
)

// world is a connect handler (srv) over a store (the Fixture) with an org, and the fake
// upstream behind its completion.
type world struct {
	*testenv.Fixture
	t    *testing.T
	fake *fakegraph.Server
	srv  *httptest.Server
	org  uuid.UUID
}

func newWorld(t *testing.T, pin string) *world {
	t.Helper()
	w := &world{t: t, fake: fakegraph.New(fakegraph.WithAppID(appID), fakegraph.WithAppSecret(appSecret))}
	w.fake.Start()
	t.Cleanup(w.fake.Close)
	w.fake.AddNumber(pnid, waba, "+1 555-010-0100", "Acme Support")
	w.fake.AddNumber("999", "888", "+1 555-010-0999", "Other")
	w.Fixture = testenv.NewStore(t)
	w.org = w.Org(t).ID
	opt := w.options()
	opt.RegisterPIN = pin
	w.srv = httptest.NewServer(w.handler(opt))
	t.Cleanup(w.srv.Close)
	return w
}

// options are the connect options of the world's handler: its store and fake upstream.
func (w *world) options() connect.Options {
	return connect.Options{Store: w.Store, Graph: graph.New(w.fake.URL()+"/v26.0", nil),
		AppID: appID, AppSecret: appSecret, ConfigID: configID, SDKURL: "https://connect.facebook.net/en_US/sdk.js",
		GraphVersion: "v26.0", ConnectBase: "https://relay.example.com"}
}

func (w *world) handler(opt connect.Options) *connect.Handler {
	w.t.Helper()
	h, err := connect.New(opt)
	if err != nil {
		w.t.Fatal(err)
	}
	return h
}

func (w *world) channel() store.Channel {
	return w.Channel(w.t, w.org, &testenv.ChannelOpts{Name: "Support line"})
}

// code adds a fresh Embedded Signup code that exchanges for token (granted pnid and waba).
func (w *world) code(token string) string {
	code := "code-" + uuid.NewString()
	w.fake.AddToken(token, []string{pnid, "999"}, []string{waba, "888"})
	w.fake.AddCode(code, token, 30*time.Second)
	return code
}

type answer struct {
	status int
	body   map[string]any
	raw    string
}

func (w *world) post(path, body string) answer {
	w.t.Helper()
	resp, err := http.Post(w.srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, raw: string(b)}
	_ = json.Unmarshal(b, &a.body) // not every answer is JSON: raw has the bytes
	return a
}

func completion(code, p, wb string) string {
	b, _ := json.Marshal(map[string]string{"code": code, "phone_number_id": p, "waba_id": wb})
	return string(b)
}

func (w *world) get(id uuid.UUID) store.Channel {
	c, err := w.Store.GetChannel(context.Background(), w.org, id)
	if err != nil {
		w.t.Fatal(err)
	}
	return c
}

func TestCompleteSuccessAndRepeat(t *testing.T) {
	w := newWorld(t, "")
	c := w.channel()
	a := w.post("/connect/"+c.ChannelToken, completion(w.code("EAAGbusiness1"), pnid, waba))
	if a.status != 200 || a.body["status"] != "active" || a.body["phone_number_id"] != pnid || a.body["waba_id"] != waba ||
		a.body["display_phone_number"] != "+1 555-010-0100" || a.body["connected_at"] == nil || a.body["token_expires_at"] != nil {
		t.Fatalf("completion: %d %s", a.status, a.raw)
	}
	if a.body["channel_token"] != c.ChannelToken {
		t.Fatal("channel token changed")
	}
	if sub, _ := w.fake.Subscribed(waba); !sub {
		t.Fatal("app not subscribed to the business account")
	}
	registered, pin, _ := w.fake.NumberState(pnid)
	stored, _ := w.Store.ChannelPIN(context.Background(), c.ID)
	if !registered || len(pin) != 6 || pin != stored {
		t.Fatalf("register: %v pin %q stored %q", registered, pin, stored)
	}
	rc, err := w.Store.RelayChannelByToken(context.Background(), c.ChannelToken)
	if err != nil || rc.UpstreamToken != "EAAGbusiness1" || rc.Status != "active" {
		t.Fatalf("relay view: %+v %v", rc, err)
	}
	var clear int
	if err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM channels WHERE position('EAAGbusiness1'::bytea in upstream_token_enc) > 0`).Scan(&clear); err != nil {
		t.Fatal(err)
	}
	if clear != 0 {
		t.Fatal("upstream token stored in clear")
	}
	// repeated post: same answer, no upstream call
	n := len(w.fake.Requests())
	if b := w.post("/connect/"+c.ChannelToken, completion("whatever", pnid, waba)); b.status != 200 || b.body["id"] != a.body["id"] {
		t.Fatalf("repeat: %d %s", b.status, b.raw)
	}
	if len(w.fake.Requests()) != n {
		t.Fatal("repeat called the upstream")
	}
	// another number on a connected channel is refused
	if b := w.post("/connect/"+c.ChannelToken, completion(w.code("EAAGx"), "999", "888")); b.status != 409 ||
		b.body["error"] != "Channel is already connected to another number" {
		t.Fatalf("other number: %d %s", b.status, b.raw)
	}
}

func TestCompleteUpstreamFailuresLeaveChannelPending(t *testing.T) {
	w := newWorld(t, "123456")
	c := w.channel()
	path := "/connect/" + c.ChannelToken
	check := func(name string, a answer, want string) {
		t.Helper()
		if a.status != 502 || !strings.Contains(a.body["error"].(string), want) {
			t.Fatalf("%s: %d %s", name, a.status, a.raw)
		}
		if got := w.get(c.ID); got.Status != "pending" || got.PhoneNumberID != nil || got.TokenExpiresAt == nil {
			t.Fatalf("%s changed the channel: %+v", name, got)
		}
		if strings.Contains(a.raw, appSecret) {
			t.Fatalf("%s: app secret in the answer", name)
		}
	}
	// expired code
	w.fake.AddToken("EAAGexp", []string{pnid}, []string{waba})
	w.fake.AddCode("old-code", "EAAGexp", time.Nanosecond)
	time.Sleep(5 * time.Millisecond)
	check("expired code", w.post(path, completion("old-code", pnid, waba)), "expired")
	// used code
	code := w.code("EAAGused")
	w.fake.FailNext("POST /"+waba+"/subscribed_apps", 1, 500, fakegraph.GraphError("An unexpected error has occurred. Please retry your request later.", "OAuthException", 2, 0))
	check("upstream 5xx", w.post(path, completion(code, pnid, waba)), "unexpected error")
	check("used code", w.post(path, completion(code, pnid, waba)), "used")
	// wrong PIN
	w.fake.SetNumberPIN(pnid, "654321")
	check("wrong PIN", w.post(path, completion(w.code("EAAGpin"), pnid, waba)), "")
	// unreachable upstream
	w.fake.Close()
	a := w.post(path, completion("c", pnid, waba))
	if a.status != 502 || a.body["error"] != connect.MsgUpstreamDown {
		t.Fatalf("unreachable: %d %s", a.status, a.raw)
	}
}

func TestLinksAndPage(t *testing.T) {
	w := newWorld(t, "")
	c := w.channel()
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	resp, err := client.Get(w.srv.URL + "/connect/" + c.ChannelToken)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 303 || resp.Header.Get("Location") != "/connect/" || resp.Header.Get("Referrer-Policy") != "no-referrer" {
		t.Fatalf("link: %d %v", resp.StatusCode, resp.Header)
	}
	ck := resp.Header.Get("Set-Cookie")
	for _, want := range []string{connect.CookieName + "=" + c.ChannelToken, "Path=/connect", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(ck, want) {
			t.Fatalf("cookie %q lacks %q", ck, want)
		}
	}
	resp, err = client.Get(w.srv.URL + "/connect/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), "Support line") || strings.Contains(string(page), c.ChannelToken) {
		t.Fatalf("page: %d (token in page: %v)", resp.StatusCode, strings.Contains(string(page), c.ChannelToken))
	}
	csp := resp.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "script-src 'self' https://connect.facebook.net") || strings.Contains(csp, "unsafe-inline") {
		t.Fatalf("CSP = %q", csp)
	}
	// the page's assets are served
	for _, a := range []string{"connect.js", "connect.css"} {
		r, err := http.Get(w.srv.URL + "/connect/assets/" + a)
		if err != nil || r.StatusCode != 200 {
			t.Fatalf("asset %s: %v %v", a, err, r.StatusCode)
		}
		r.Body.Close()
	}
	// the page's completion with the cookie
	req, _ := http.NewRequest("POST", w.srv.URL+"/connect/complete", strings.NewReader(completion(w.code("EAAGcookie"), pnid, waba)))
	req.Header.Set("Content-Type", "application/json")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || w.get(c.ID).Status != "active" {
		t.Fatalf("complete with cookie: %d", resp.StatusCode)
	}
	// the link is closed now: the page and the link say so, without naming the channel
	for _, p := range []string{"/connect/" + c.ChannelToken, "/connect/"} {
		resp, err := client.Get(w.srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 410 || strings.Contains(string(b), "Support line") {
			t.Fatalf("closed link %s: %d", p, resp.StatusCode)
		}
	}
}

func TestExpiredUnknownAndBadInput(t *testing.T) {
	w := newWorld(t, "")
	c := w.channel()
	if _, err := w.Pool.Exec(context.Background(), `UPDATE channels SET token_expires_at = now() - interval '1 second' WHERE id = $1`, c.ID); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{c.ChannelToken, "unknown-token", strings.Repeat("x", 500)} {
		resp, err := http.Get(w.srv.URL + "/connect/" + tok)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 410 || !strings.Contains(resp.Header.Get("Content-Type"), "text/html") || strings.Contains(string(b), "Support line") {
			t.Fatalf("GET %s...: %d", tok[:5], resp.StatusCode)
		}
		if a := w.post("/connect/"+tok, completion("c", pnid, waba)); a.status != 410 || a.body["error"] != connect.MsgLinkInvalid {
			t.Fatalf("POST expired/unknown: %d %s", a.status, a.raw)
		}
	}
	if a := w.post("/connect/complete", completion("c", pnid, waba)); a.status != 410 {
		t.Fatalf("complete without cookie: %d %s", a.status, a.raw)
	}
	fresh := w.channel()
	path := "/connect/" + fresh.ChannelToken
	for body, want := range map[string]string{
		`{`: "Invalid JSON body", `[]`: "Invalid JSON body",
		`{"phone_number_id":"1","waba_id":"2"}`:              `"code" is required`,
		`{"code":"c","waba_id":"2"}`:                         `"phone_number_id" is required`,
		`{"code":"c","phone_number_id":"1","waba_id":7}`:     `"waba_id" must be a string`,
		`{"code":"c","phone_number_id":"1/x","waba_id":"2"}`: `"phone_number_id" must be a numeric id`,
	} {
		if a := w.post(path, body); a.status/100 != 4 || a.body["error"] != want {
			t.Fatalf("%s: %d %s", body, a.status, a.raw)
		}
	}
	req, _ := http.NewRequest("PUT", w.srv.URL+path, nil)
	resp, _ := http.DefaultClient.Do(req)
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Fatalf("PUT: %d", resp.StatusCode)
	}
	if len(w.fake.Requests()) != 0 {
		t.Fatal("bad input reached the upstream")
	}
}

// TestReconnectAfter190 keeps the channel token and requires the same number.
func TestReconnectAfter190(t *testing.T) {
	w := newWorld(t, "")
	c := w.channel()
	ctx := context.Background()
	if a := w.post("/connect/"+c.ChannelToken, completion(w.code("EAAGfirst"), pnid, waba)); a.status != 200 {
		t.Fatalf("connect: %d %s", a.status, a.raw)
	}
	if err := w.Store.MarkUpstreamDisconnected(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	// the link is closed until reopened
	if a := w.post("/connect/"+c.ChannelToken, completion(w.code("EAAGsecond"), pnid, waba)); a.status != 410 {
		t.Fatalf("before reopen: %d %s", a.status, a.raw)
	}
	org := w.org
	if _, err := w.Store.ReopenLink(ctx, &org, c.ID, time.Hour, false); err != nil {
		t.Fatal(err)
	}
	if a := w.post("/connect/"+c.ChannelToken, completion(w.code("EAAGother"), "999", "888")); a.status != 409 || a.body["error"] != connect.MsgOtherNumber {
		t.Fatalf("other number: %d %s", a.status, a.raw)
	}
	a := w.post("/connect/"+c.ChannelToken, completion(w.code("EAAGsecond"), pnid, waba))
	if a.status != 200 || a.body["upstream_disconnected_at"] != nil || a.body["channel_token"] != c.ChannelToken || a.body["status"] != "active" {
		t.Fatalf("reconnect: %d %s", a.status, a.raw)
	}
	if rc, _ := w.Store.RelayChannelByToken(ctx, c.ChannelToken); rc.UpstreamToken != "EAAGsecond" || rc.Disconnected {
		t.Fatalf("after reconnect: %+v", rc)
	}
}
