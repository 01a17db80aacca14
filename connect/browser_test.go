package connect_test

// Browser tests of the connect page (connect/assets) with headless Chromium
// and the stub SDK (connect/testdata/stub-sdk.js).
//
// The harness is independent of the server that serves the page:
//
//   - runConnectFlow(t, pageURL, flowCase, expect) opens pageURL (which may
//     redirect, e.g. GET /connect/<token> → 303 → token-free page), gives the
//     stub SDK its configuration, clicks "Connect WhatsApp", waits for the
//     final state and hands a flowResult to expect, where the caller checks
//     what its server recorded (the POST body here, the channel's state in
//     the real build).
//   - openConnectPage gives the same steps one by one (for a retry after an
//     error, say).
//   - checkExpiredPage(t, url, screenshot) checks a 410 page.
//
// The page under test must load the stub as its SDK (.SDKURL) and accept
// messages from its own origin (.OriginSuffix = the page's host), because the
// stub posts the WA_EMBEDDED_SIGNUP message from the page's window.
//
// Chromium: $WABARELAY_CHROMIUM, else /usr/bin/chromium, else chromium on
// PATH. When it is missing the tests fail, unless WABARELAY_SKIP_BROWSER=1
// (ignored when CI=true). Screenshots go to <repo root>/artifacts/, or to
// $WABARELAY_ARTIFACTS.

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

// stubConfig is handed to the stub SDK as window.__stubConfig (see the
// comment at the top of testdata/stub-sdk.js). Empty fields keep the stub's
// defaults.
type stubConfig struct {
	PhoneNumberID string `json:"pnid,omitempty"`
	WABAID        string `json:"waba,omitempty"`
	Code          string `json:"code,omitempty"`
	// Event is FINISH (default), FINISH_ONLY_WABA, CANCEL, CANCEL_ERROR,
	// ERROR or NONE (the login window closes with no message).
	Event        string `json:"event,omitempty"`
	Step         string `json:"step,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
	ErrorCode    string `json:"error_code,omitempty"`
	// Order is "message-first" (default) or "callback-first".
	Order  string `json:"order,omitempty"`
	NoCode bool   `json:"no_code,omitempty"`
}

// flowCase describes one run of the connect page.
type flowCase struct {
	Stub stubConfig
	// WantState is the final data-state of #connect-app: success, error or
	// cancelled.
	WantState string
	// WantText are substrings that the status panel must show.
	WantText []string
	// PageShot and ResultShot, when set, are file names under the
	// artifacts directory for screenshots of the page before the click and
	// in its final state.
	PageShot   string
	ResultShot string
}

// flowResult is what the browser saw.
type flowResult struct {
	State      string         // final data-state of #connect-app
	StatusText string         // text of the status panel
	FocusedID  string         // id of the focused element at the end
	ButtonText string         // label of #connect-button ("" when hidden)
	InitOpts   map[string]any // options of FB.init
	LoginOpts  map[string]any // options of FB.login
	LoginCalls int
	StubErrors []string // option problems the stub found
}

// runConnectFlow opens the connect page at pageURL, clicks "Connect WhatsApp",
// waits for the final state, checks it against fc, the console (no errors)
// and the login options, and calls expect (may be nil) with the result.
func runConnectFlow(t *testing.T, pageURL string, fc flowCase, expect func(t *testing.T, res flowResult)) {
	t.Helper()
	p := openConnectPage(t, pageURL, fc.Stub)
	if fc.PageShot != "" {
		p.screenshot(t, fc.PageShot)
	}
	p.clickConnect(t)
	res := p.waitFinal(t)
	if fc.ResultShot != "" {
		p.screenshot(t, fc.ResultShot)
	}
	checkFlowResult(t, fc, res)
	p.assertNoConsoleErrors(t)
	if expect != nil {
		expect(t, res)
	}
}

// checkFlowResult checks the parts of a result that every case shares.
func checkFlowResult(t *testing.T, fc flowCase, res flowResult) {
	t.Helper()
	if len(res.StubErrors) > 0 {
		t.Errorf("stub SDK found problems: %q", res.StubErrors)
	}
	if res.LoginCalls < 1 {
		t.Fatalf("FB.login was not called")
	}
	checkLoginOpts(t, res.LoginOpts)
	if fc.WantState != "" && res.State != fc.WantState {
		t.Errorf("final state = %q, want %q (status: %q)", res.State, fc.WantState, res.StatusText)
	}
	for _, want := range fc.WantText {
		if !strings.Contains(res.StatusText, want) {
			t.Errorf("status panel %q does not contain %q", res.StatusText, want)
		}
	}
	if res.FocusedID != "status" {
		t.Errorf("focus is on %q after the flow, want the status region", res.FocusedID)
	}
}

func checkLoginOpts(t *testing.T, o map[string]any) {
	t.Helper()
	if o == nil {
		t.Fatalf("FB.login options were not recorded")
	}
	if s, _ := o["config_id"].(string); s == "" {
		t.Errorf("FB.login config_id = %v, want the configuration id", o["config_id"])
	}
	if o["response_type"] != "code" {
		t.Errorf("FB.login response_type = %v, want code", o["response_type"])
	}
	if o["override_default_response_type"] != true {
		t.Errorf("FB.login override_default_response_type = %v, want true", o["override_default_response_type"])
	}
	extras, _ := o["extras"].(map[string]any)
	if _, ok := extras["setup"].(map[string]any); !ok {
		t.Errorf("FB.login extras = %v, want {setup: {}}", o["extras"])
	}
}

// connectPage is one browser tab with the connect page open.
type connectPage struct {
	ctx context.Context
	url string

	mu      sync.Mutex
	console []consoleEntry
}

type consoleEntry struct {
	Level  string // error, warning, exception, ...
	Source string // console, network, security, ...
	Text   string
	URL    string
}

func (e consoleEntry) String() string {
	s := e.Level + " [" + e.Source + "] " + e.Text
	if e.URL != "" {
		s += " (" + e.URL + ")"
	}
	return s
}

// openConnectPage starts a browser, installs the stub configuration and a
// recorder of CSP violations before any page script, opens pageURL and waits
// until the Connect button is shown and the SDK is initialised.
func openConnectPage(t *testing.T, pageURL string, stub stubConfig) *connectPage {
	t.Helper()
	p := newBrowserPage(t, pageURL)
	cfg, err := json.Marshal(stub)
	if err != nil {
		t.Fatal(err)
	}
	p.addInitScript(t, "window.__stubConfig = "+string(cfg)+";")
	resp, err := chromedp.Run(p.ctx, chromedp.NavigateResponse(pageURL))
	if err != nil {
		t.Fatalf("open %s: %v", pageURL, err)
	}
	if resp.Status != http.StatusOK {
		t.Fatalf("open %s: HTTP %d, want 200", pageURL, resp.Status)
	}
	// The token of a /connect/<token> link must not stay in the page's URL
	// (DESIGN.md §5: the server moves it into a cookie and redirects).
	if u, err := url.Parse(pageURL); err == nil {
		if seg := pathSegment(u.Path); seg != "" && strings.Contains(resp.URL, seg) {
			t.Errorf("page URL %s still carries the token %s", resp.URL, seg)
		}
	}
	_, err = chromedp.Run(p.ctx, chromedp.PollFunction[bool](`() => {
		const b = document.getElementById('connect-button');
		return !!(b && !b.hidden && window.FB && window.__fbInitOpts);
	}`, chromedp.WithPollingTimeout(15*time.Second)))
	if err != nil {
		p.dumpConsole(t)
		t.Fatalf("the Connect button or the SDK did not come up: %v", err)
	}
	return p
}

// setStub replaces the stub configuration in the open page (for a retry).
func (p *connectPage) setStub(t *testing.T, stub stubConfig) {
	t.Helper()
	cfg, err := json.Marshal(stub)
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(p.ctx, chromedp.Evaluate[chromedp.Void]("window.__stubConfig = "+string(cfg)+";")); err != nil {
		t.Fatal(err)
	}
}

// clickConnect clicks the primary button with a real mouse click.
func (p *connectPage) clickConnect(t *testing.T) {
	t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.Click(chromedp.ID("connect-button"))); err != nil {
		t.Fatalf("click Connect WhatsApp: %v", err)
	}
}

// waitFinal waits for success, error or cancelled and reads the result.
func (p *connectPage) waitFinal(t *testing.T) flowResult {
	t.Helper()
	_, err := chromedp.Run(p.ctx, chromedp.PollFunction[string](`() => {
		const s = document.getElementById('connect-app').dataset.state;
		return ['success', 'error', 'cancelled'].includes(s) ? s : '';
	}`, chromedp.WithPollingTimeout(25*time.Second)))
	if err != nil {
		p.dumpConsole(t)
		state, _ := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.getElementById('connect-app').dataset.state`))
		t.Fatalf("no final state (state %q): %v", state, err)
	}
	return p.result(t)
}

func (p *connectPage) result(t *testing.T) flowResult {
	t.Helper()
	var raw struct {
		State      string         `json:"state"`
		StatusText string         `json:"statusText"`
		FocusedID  string         `json:"focusedID"`
		ButtonText string         `json:"buttonText"`
		InitOpts   map[string]any `json:"initOpts"`
		LoginOpts  map[string]any `json:"loginOpts"`
		LoginCalls int            `json:"loginCalls"`
		StubErrors []string       `json:"stubErrors"`
	}
	b, err := chromedp.Run(p.ctx, chromedp.Evaluate[[]byte](`(() => {
		const b = document.getElementById('connect-button');
		const a = document.activeElement;
		return {
			state: document.getElementById('connect-app').dataset.state,
			statusText: document.getElementById('status').innerText,
			focusedID: a ? a.id : '',
			buttonText: b && !b.hidden ? b.textContent : '',
			initOpts: window.__fbInitOpts || null,
			loginOpts: window.__fbLoginOpts || null,
			loginCalls: window.__fbLoginCalls || 0,
			stubErrors: window.__stubErrors || [],
		};
	})()`))
	if err != nil {
		t.Fatalf("read the page state: %v", err)
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("decode the page state %s: %v", b, err)
	}
	return flowResult(raw)
}

// screenshot saves a full-page PNG under the artifacts directory.
func (p *connectPage) screenshot(t *testing.T, name string) {
	t.Helper()
	saveScreenshot(t, p.ctx, name)
}

// consoleErrors are the errors the page logged: console.error calls,
// exceptions, and browser log errors (failed loads, CSP violations).
func (p *connectPage) consoleErrors() []consoleEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []consoleEntry
	for _, e := range p.console {
		if e.Level == "error" || e.Level == "exception" || e.Level == "assert" {
			out = append(out, e)
		}
	}
	return out
}

func (p *connectPage) assertNoConsoleErrors(t *testing.T) {
	t.Helper()
	var violations []string
	if b, err := chromedp.Run(p.ctx, chromedp.Evaluate[[]byte](`window.__cspViolations || []`)); err == nil {
		_ = json.Unmarshal(b, &violations)
	}
	for _, v := range violations {
		t.Errorf("CSP violation: %s", v)
	}
	for _, e := range p.consoleErrors() {
		t.Errorf("console: %s", e)
	}
}

func (p *connectPage) dumpConsole(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.console {
		t.Logf("console: %s", e)
	}
}

// newBrowserPage starts Chromium with a fresh profile and opens a tab that
// records its console.
func newBrowserPage(t *testing.T, pageURL string) *connectPage {
	t.Helper()
	execPath := chromiumPath(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(execPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)

	p := &connectPage{url: pageURL}
	ctx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithListener(p.listen))
	t.Cleanup(cancelTab)
	// A whole run (browser start included) gets at most two minutes.
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	p.ctx = ctx
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", execPath, err)
	}
	p.addInitScript(t, `window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', function (e) {
	window.__cspViolations.push(e.violatedDirective + ' blocked ' + (e.blockedURI || 'inline') + ' at ' + e.sourceFile + ':' + e.lineNumber);
});`)
	return p
}

func (p *connectPage) addInitScript(t *testing.T, src string) {
	t.Helper()
	if _, err := chromedp.Call(p.ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: src}); err != nil {
		t.Fatalf("add init script: %v", err)
	}
}

// listen runs in the tab's message loop: it must return fast.
func (p *connectPage) listen(ev any) {
	var e consoleEntry
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		parts := make([]string, 0, len(ev.Args))
		for _, a := range ev.Args {
			parts = append(parts, remoteText(a))
		}
		e = consoleEntry{Level: string(ev.Type), Source: "console", Text: strings.Join(parts, " ")}
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		text := d.Text
		if d.Exception != nil && d.Exception.Description != "" {
			text += " " + d.Exception.Description
		}
		e = consoleEntry{Level: "exception", Source: "javascript", Text: text, URL: d.URL}
	case *log.EventEntryAdded:
		if ev.Entry == nil {
			return
		}
		e = consoleEntry{Level: string(ev.Entry.Level), Source: string(ev.Entry.Source), Text: ev.Entry.Text, URL: ev.Entry.URL}
	default:
		return
	}
	p.mu.Lock()
	p.console = append(p.console, e)
	p.mu.Unlock()
}

func remoteText(a *runtime.RemoteObject) string {
	if a == nil {
		return ""
	}
	if len(a.Value) > 0 {
		var s string
		if err := json.Unmarshal(a.Value, &s); err == nil {
			return s
		}
		return string(a.Value)
	}
	if a.Description != "" {
		return a.Description
	}
	return string(a.Type)
}

// chromiumPath finds the browser, or fails (skips only when asked to,
// outside CI).
func chromiumPath(t *testing.T) string {
	t.Helper()
	inCI := os.Getenv("CI") != "" && os.Getenv("CI") != "false" && os.Getenv("CI") != "0"
	if os.Getenv("WABARELAY_SKIP_BROWSER") == "1" && !inCI {
		t.Skip("browser tests skipped: WABARELAY_SKIP_BROWSER=1")
	}
	candidates := []string{os.Getenv("WABARELAY_CHROMIUM"), "/usr/bin/chromium"}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			candidates = append(candidates, p)
		}
	}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if fi, err := os.Stat(c); err == nil && !fi.IsDir() {
			return c
		}
	}
	t.Fatalf("Chromium not found (looked at $WABARELAY_CHROMIUM, /usr/bin/chromium and PATH). " +
		"Install it with `apt-get install -y chromium`, or set WABARELAY_SKIP_BROWSER=1 to skip the browser tests locally.")
	return ""
}

// artifactsDir is $WABARELAY_ARTIFACTS or <repo root>/artifacts.
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("WABARELAY_ARTIFACTS")
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		root := wd
		for {
			if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
				break
			}
			parent := filepath.Dir(root)
			if parent == root {
				root = wd
				break
			}
			root = parent
		}
		dir = filepath.Join(root, "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("artifacts dir: %v", err)
	}
	return dir
}

func saveScreenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(artifactsDir(t), name)
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	t.Logf("screenshot: %s", path)
}

// pathSegment is the token of a /connect/<token> path, else "".
func pathSegment(p string) string {
	rest, ok := strings.CutPrefix(p, "/connect/")
	if !ok || rest == "" || strings.Contains(rest, "/") {
		return ""
	}
	return rest
}

// checkExpiredPage opens an unknown or expired link and checks the 410 page:
// status, wording, no channel details (leak names the strings that must not
// appear), no console errors apart from the 410 itself, and a screenshot.
func checkExpiredPage(t *testing.T, linkURL, shot string, leak ...string) {
	t.Helper()
	p := newBrowserPage(t, linkURL)
	resp, err := chromedp.Run(p.ctx, chromedp.NavigateResponse(linkURL))
	if err != nil {
		t.Fatalf("open %s: %v", linkURL, err)
	}
	if resp.Status != http.StatusGone {
		t.Errorf("expired link: HTTP %d, want 410", resp.Status)
	}
	for k, v := range resp.Headers {
		if strings.EqualFold(k, "Referrer-Policy") && fmt.Sprint(v) != "no-referrer" {
			t.Errorf("Referrer-Policy = %v, want no-referrer", v)
		}
	}
	text, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"invalid or has expired", "Ask the company that sent you this link for a new one"} {
		if !strings.Contains(text, want) {
			t.Errorf("expired page does not say %q:\n%s", want, text)
		}
	}
	html, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leak {
		if l != "" && strings.Contains(html, l) {
			t.Errorf("expired page leaks %q", l)
		}
	}
	if shot != "" {
		p.screenshot(t, shot)
	}
	for _, e := range p.consoleErrors() {
		if e.Source == "network" && strings.Contains(e.Text, "410") {
			continue // the page's own status
		}
		t.Errorf("console: %s", e)
	}
}

// ---------------------------------------------------------------------------
// A small stand-in for the server: renders the templates with sample data.
// ---------------------------------------------------------------------------

// pageData mirrors the data the real handler gives page.html.
type pageData struct {
	ChannelName  string
	AppID        string
	ConfigID     string
	SDKURL       string
	GraphVersion string
	PostURL      string
	CSPNonce     string
	AssetBase    string
	OriginSuffix string
}

type expiredData struct {
	AssetBase string
}

const (
	sampleChannel = "Acme Support Line"
	validToken    = "tok_valid_4f1c"
	cookieName    = "wabarelay_connect"
)

// testSite serves GET /connect/<token> (cookie + 303), the page, the assets,
// the stub SDK and POST /connect/complete, which records the body and
// answers with respond.
type testSite struct {
	srv       *httptest.Server
	page      *template.Template
	expired   *template.Template
	mu        sync.Mutex
	posts     []map[string]any
	cookieOK  []bool
	respond   func() (int, string)
	strictOrg bool // render with OriginSuffix facebook.com (messages from the page are ignored)
}

func newTestSite(t *testing.T) *testSite {
	t.Helper()
	s := &testSite{
		page:    template.Must(template.ParseFiles(filepath.Join("templates", "page.html"))),
		expired: template.Must(template.ParseFiles(filepath.Join("templates", "expired.html"))),
		respond: func() (int, string) {
			return http.StatusOK, `{"status":"active","display_phone_number":"+1 555 0100"}`
		},
	}
	mux := http.NewServeMux()
	mux.Handle("GET /connect/assets/", http.StripPrefix("/connect/assets/", http.FileServer(http.Dir("assets"))))
	mux.Handle("GET /stub/", http.StripPrefix("/stub/", http.FileServer(http.Dir("testdata"))))
	mux.HandleFunc("GET /connect/{token}", s.link)
	mux.HandleFunc("GET /connect/{$}", s.renderPage)
	mux.HandleFunc("POST /connect/complete", s.complete)
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	return s
}

func (s *testSite) setResponse(status int, body string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.respond = func() (int, string) { return status, body }
}

func (s *testSite) recorded() ([]map[string]any, []bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]map[string]any(nil), s.posts...), append([]bool(nil), s.cookieOK...)
}

func securityHeaders(w http.ResponseWriter, nonce string) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self' 'nonce-"+nonce+"'; style-src 'self' 'nonce-"+nonce+"'; "+
		"img-src 'self'; connect-src 'self'; frame-src https://*.facebook.com; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
}

func (s *testSite) link(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("token") != validToken {
		s.renderExpired(w)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: validToken, Path: "/connect", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, "/connect/", http.StatusSeeOther)
}

func (s *testSite) renderExpired(w http.ResponseWriter) {
	securityHeaders(w, "unused")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(http.StatusGone)
	_ = s.expired.Execute(w, expiredData{AssetBase: "/connect/assets/"})
}

func (s *testSite) renderPage(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(cookieName); err != nil || c.Value != validToken {
		s.renderExpired(w)
		return
	}
	host := r.Host
	if h, _, ok := strings.Cut(host, ":"); ok {
		host = h
	}
	suffix := host
	s.mu.Lock()
	if s.strictOrg {
		suffix = "facebook.com"
	}
	s.mu.Unlock()
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	securityHeaders(w, nonce)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	err := s.page.Execute(w, pageData{
		ChannelName:  sampleChannel,
		AppID:        "1234567890",
		ConfigID:     "cfg-987654321",
		SDKURL:       "/stub/stub-sdk.js",
		GraphVersion: "v26.0",
		PostURL:      "/connect/complete",
		CSPNonce:     nonce,
		AssetBase:    "/connect/assets/",
		OriginSuffix: suffix,
	})
	if err != nil {
		panic(err)
	}
}

func (s *testSite) complete(w http.ResponseWriter, r *http.Request) {
	c, err := r.Cookie(cookieName)
	cookieOK := err == nil && c.Value == validToken
	w.Header().Set("Content-Type", "application/json")
	if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		w.WriteHeader(http.StatusUnsupportedMediaType)
		_, _ = io.WriteString(w, `{"error":"Content-Type must be application/json"}`)
		return
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":"Invalid JSON body"}`)
		return
	}
	s.mu.Lock()
	s.posts = append(s.posts, body)
	s.cookieOK = append(s.cookieOK, cookieOK)
	respond := s.respond
	s.mu.Unlock()
	if !cookieOK {
		w.WriteHeader(http.StatusGone)
		_, _ = io.WriteString(w, `{"error":"This link is invalid or has expired"}`)
		return
	}
	status, out := respond()
	w.WriteHeader(status)
	_, _ = io.WriteString(w, out)
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

func TestBrowserConnectFlow(t *testing.T) {
	site := newTestSite(t)
	link := site.srv.URL + "/connect/" + validToken

	// expectPost checks the POST the page made: one, with the cookie, and
	// exactly {code, phone_number_id, waba_id}.
	expectPost := func(code, pnid, waba string) func(t *testing.T, res flowResult) {
		return func(t *testing.T, res flowResult) {
			t.Helper()
			posts, cookies := site.recorded()
			if len(posts) != 1 {
				t.Fatalf("%d POSTs, want 1: %v", len(posts), posts)
			}
			want := map[string]any{"code": code, "phone_number_id": pnid, "waba_id": waba}
			if fmt.Sprint(posts[0]) != fmt.Sprint(want) {
				t.Errorf("POST body = %v, want %v", posts[0], want)
			}
			if !cookies[0] {
				t.Errorf("POST came without the link cookie")
			}
			if res.InitOpts["appId"] != "1234567890" || res.InitOpts["version"] != "v26.0" {
				t.Errorf("FB.init options = %v", res.InitOpts)
			}
			if res.LoginOpts["config_id"] != "cfg-987654321" {
				t.Errorf("FB.login config_id = %v", res.LoginOpts["config_id"])
			}
		}
	}
	expectNoPost := func(t *testing.T, res flowResult) {
		t.Helper()
		if posts, _ := site.recorded(); len(posts) != 0 {
			t.Errorf("the page posted %v, want no POST", posts)
		}
	}
	reset := func(t *testing.T) {
		site.mu.Lock()
		site.posts, site.cookieOK, site.strictOrg = nil, nil, false
		site.mu.Unlock()
		site.setResponse(http.StatusOK, `{"status":"active","display_phone_number":"+1 555 0100"}`)
	}

	t.Run("success/message-first", func(t *testing.T) {
		reset(t)
		runConnectFlow(t, link, flowCase{
			Stub:       stubConfig{PhoneNumberID: "1001", WABAID: "2001", Code: "abc"},
			WantState:  "success",
			WantText:   []string{"WhatsApp is connected", "+1 555 0100", sampleChannel},
			PageShot:   "connect-page.png",
			ResultShot: "connect-success.png",
		}, func(t *testing.T, res flowResult) {
			expectPost("abc", "1001", "2001")(t, res)
			if res.ButtonText != "" {
				t.Errorf("button still shown after success: %q", res.ButtonText)
			}
		})
	})

	t.Run("success/callback-first", func(t *testing.T) {
		reset(t)
		site.setResponse(http.StatusOK, `{"status":"active"}`)
		runConnectFlow(t, link, flowCase{
			Stub:      stubConfig{PhoneNumberID: "1002", WABAID: "2002", Code: "code-2", Order: "callback-first"},
			WantState: "success",
			WantText:  []string{"WhatsApp is connected", "Your WhatsApp Business number is now connected"},
		}, expectPost("code-2", "1002", "2002"))
	})

	t.Run("upstream-502-then-retry", func(t *testing.T) {
		reset(t)
		site.setResponse(http.StatusBadGateway, `{"error":"Upstream error: This authorization code has expired."}`)
		p := openConnectPage(t, link, stubConfig{PhoneNumberID: "1003", WABAID: "2003", Code: "old"})
		p.clickConnect(t)
		res := p.waitFinal(t)
		p.screenshot(t, "connect-error.png")
		checkFlowResult(t, flowCase{WantState: "error", WantText: []string{"This authorization code has expired."}}, res)
		if res.ButtonText != "Try again" {
			t.Errorf("button after an error = %q, want Try again", res.ButtonText)
		}
		// A console error for the 502 response itself is expected.
		for _, e := range p.consoleErrors() {
			if !(e.Source == "network" && strings.Contains(e.Text, "502")) {
				t.Errorf("console: %s", e)
			}
		}

		// Try again: a new signup with a fresh code, and the server agrees.
		site.setResponse(http.StatusOK, `{"status":"active","display_phone_number":"+1 555 0100"}`)
		p.setStub(t, stubConfig{PhoneNumberID: "1003", WABAID: "2003", Code: "new"})
		p.clickConnect(t)
		res = p.waitFinal(t)
		checkFlowResult(t, flowCase{WantState: "success", WantText: []string{"+1 555 0100"}}, res)
		if res.LoginCalls != 2 {
			t.Errorf("FB.login calls = %d, want 2", res.LoginCalls)
		}
		posts, _ := site.recorded()
		if len(posts) != 2 || posts[1]["code"] != "new" {
			t.Errorf("POSTs = %v, want a second one with the new code", posts)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		reset(t)
		runConnectFlow(t, link, flowCase{
			Stub:       stubConfig{Event: "CANCEL", Step: "PHONE_NUMBER_SETUP"},
			WantState:  "cancelled",
			WantText:   []string{"You closed the signup at step", "Phone number setup", "you can try again"},
			ResultShot: "connect-cancel.png",
		}, func(t *testing.T, res flowResult) {
			expectNoPost(t, res)
			if res.ButtonText != "Try again" {
				t.Errorf("button after cancel = %q, want Try again", res.ButtonText)
			}
		})
	})

	t.Run("error-event", func(t *testing.T) {
		reset(t)
		runConnectFlow(t, link, flowCase{
			Stub:      stubConfig{Event: "ERROR", ErrorMessage: "Your business is not eligible", ErrorCode: "2593"},
			WantState: "error",
			WantText:  []string{"Your business is not eligible", "Error code 2593"},
		}, expectNoPost)
	})

	t.Run("cancel-with-error-message", func(t *testing.T) {
		reset(t)
		runConnectFlow(t, link, flowCase{
			Stub:      stubConfig{Event: "CANCEL_ERROR", ErrorMessage: "The phone number is already registered"},
			WantState: "error",
			WantText:  []string{"The phone number is already registered"},
		}, expectNoPost)
	})

	t.Run("window-closed-without-code", func(t *testing.T) {
		reset(t)
		runConnectFlow(t, link, flowCase{
			Stub:      stubConfig{Event: "NONE"},
			WantState: "cancelled",
			WantText:  []string{"closed before the signup finished"},
		}, expectNoPost)
	})

	t.Run("finish-without-phone-number", func(t *testing.T) {
		reset(t)
		runConnectFlow(t, link, flowCase{
			Stub:      stubConfig{Event: "FINISH_ONLY_WABA"},
			WantState: "error",
			WantText:  []string{"without a WhatsApp phone number"},
		}, expectNoPost)
	})

	t.Run("message-from-other-origin-ignored", func(t *testing.T) {
		reset(t)
		site.mu.Lock()
		site.strictOrg = true // the page accepts only *.facebook.com
		site.mu.Unlock()
		p := openConnectPage(t, link, stubConfig{PhoneNumberID: "1009", WABAID: "2009"})
		p.clickConnect(t)
		_, err := chromedp.Run(p.ctx, chromedp.PollFunction[bool](`() => window.__fbLoginCalls > 0`, chromedp.WithPollingTimeout(5*time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(800 * time.Millisecond) // the stub answers after ~100 ms
		state, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.getElementById('connect-app').dataset.state`))
		if err != nil {
			t.Fatal(err)
		}
		if state != "waiting" {
			t.Errorf("state = %q after a FINISH from a foreign origin, want waiting", state)
		}
		expectNoPost(t, flowResult{})
		p.assertNoConsoleErrors(t)
	})

	t.Run("mobile-layout", func(t *testing.T) {
		reset(t)
		p := openConnectPage(t, link, stubConfig{})
		if err := chromedp.Do(p.ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile)); err != nil {
			t.Fatal(err)
		}
		overflow, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`))
		if err != nil {
			t.Fatal(err)
		}
		if overflow {
			t.Errorf("the page scrolls sideways at 390 px")
		}
		p.screenshot(t, "connect-page-mobile.png")
		p.assertNoConsoleErrors(t)
	})

	t.Run("dark-mode", func(t *testing.T) {
		reset(t)
		p := openConnectPage(t, link, stubConfig{Event: "CANCEL", Step: "WABA_SETUP"})
		if _, err := chromedp.Call(p.ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}},
		}); err != nil {
			t.Fatal(err)
		}
		p.clickConnect(t)
		res := p.waitFinal(t)
		checkFlowResult(t, flowCase{WantState: "cancelled", WantText: []string{"WhatsApp Business account setup"}}, res)
		p.screenshot(t, "connect-dark.png")
		p.assertNoConsoleErrors(t)
	})
}

// TestBrowserNoScript: without JavaScript the page says so and shows no dead
// button.
func TestBrowserNoScript(t *testing.T) {
	site := newTestSite(t)
	p := newBrowserPage(t, site.srv.URL)
	if _, err := chromedp.Call(p.ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(p.ctx, chromedp.Navigate(site.srv.URL+"/connect/"+validToken)); err != nil {
		t.Fatal(err)
	}
	visible, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](`(() => {
		const n = document.getElementById('noscript-message');
		const b = document.getElementById('connect-button');
		return !!n && n.offsetParent !== null && b.offsetParent === null;
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	if !visible {
		t.Errorf("without JavaScript: want the noscript message shown and the button hidden")
	}
}

func TestBrowserExpiredPage(t *testing.T) {
	site := newTestSite(t)
	checkExpiredPage(t, site.srv.URL+"/connect/tok_unknown_0000", "connect-expired.png", sampleChannel, "1234567890", "cfg-987654321")
	// The token-free page without the cookie is the same 410.
	checkExpiredPage(t, site.srv.URL+"/connect/", "", sampleChannel)
}
