// Package browsertest is a small kit for browser tests with headless Chromium
// (chromedp): it finds the browser, starts one per test with a fresh profile,
// opens tabs that record their console, uncaught exceptions, failed loads and
// Content-Security-Policy violations, answers JavaScript dialogs, and saves
// screenshots under the artifacts directory.
//
// The connect page's and the dashboard's browser tests use it. Conventions:
//
//   - Chromium: $WABARELAY_CHROMIUM, else /usr/bin/chromium, else chromium on
//     PATH. When it is missing the test fails, unless WABARELAY_SKIP_BROWSER=1
//     (ignored when CI is set).
//   - Screenshots go to <repo root>/artifacts/, or to $WABARELAY_ARTIFACTS.
//
// A test starts one Browser and opens as many Pages as it needs; each Page is
// a tab in its own browser context, so pages share no cookies. Tests that run
// in parallel may instead share the test binary's one browser (Shared), which
// saves a Chromium start per test; the package's TestMain then stops it with
// StopShared.
package browsertest

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// Timeout bounds one step of a page (a navigation, a wait, an evaluation).
// It is generous: the tests run on small, possibly loaded machines.
const Timeout = 45 * time.Second

// cspBinding is the function the pages call for each CSP violation; it is a
// DevTools binding, so the reports survive navigations.
const cspBinding = "__browsertestCSP"

// ChromiumPath finds the browser, or fails the test (skips it only when
// WABARELAY_SKIP_BROWSER=1 outside CI).
func ChromiumPath(t testing.TB) string {
	t.Helper()
	ci := os.Getenv("CI")
	inCI := ci != "" && ci != "false" && ci != "0"
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

// RepoRoot is the directory of the go.mod above the working directory (the
// working directory itself when there is none).
func RepoRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for root := wd; ; {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			return root
		}
		parent := filepath.Dir(root)
		if parent == root {
			return wd
		}
		root = parent
	}
}

// ArtifactsDir is $WABARELAY_ARTIFACTS or <repo root>/artifacts, created if
// needed.
func ArtifactsDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("WABARELAY_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(RepoRoot(t), "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("artifacts dir: %v", err)
	}
	return dir
}

// AllocatorOptions are the Chromium flags of Start: headless, no sandbox, no
// GPU, no QUIC, no first-run, background networking, component updates or
// sync, a fresh profile in userDataDir and a 1280×900 window.
//
// The omnibox's WebUI popups are off as well (chromedp's default
// disable-features kept): headless Chromium 156 gave every window two
// renderers for them, which the tests never show. Off, the dashboard's browser
// tests cost Chromium 71–82 s of CPU instead of 119 s (2026-11-30, `go test
// -race -run TestBrowser ./dashboard`, Chromium's processes sampled from /proc).
func AllocatorOptions(execPath, userDataDir string) []chromedp.ExecAllocatorOption {
	return append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(execPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-features", "Translate,BlinkGenPropertyTrees,WebUIOmniboxPopup,WebUIOmniboxAimPopup,WebUIOmniboxFullPopup"),
		chromedp.UserDataDir(userDataDir),
		chromedp.WindowSize(1280, 900),
	)
}

// Browser is one Chromium process of a test.
type Browser struct {
	ctx context.Context
}

// Start starts Chromium with a fresh profile; it stops in t.Cleanup.
func Start(t testing.TB) *Browser {
	t.Helper()
	execPath := ChromiumPath(t)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), AllocatorOptions(execPath, t.TempDir())...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	// The first Do starts the browser and binds it to the context it gets, so
	// it gets ctx itself, not one with a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", execPath, err)
	}
	return &Browser{ctx: ctx}
}

// shared is the browser of Shared.
var shared struct {
	mu   sync.Mutex
	b    *Browser
	stop func()
}

// Shared returns the test binary's one browser, started by the first call
// (with a fresh profile, as Start's) and stopped by StopShared, which the
// package's TestMain must call after the tests:
//
//	func TestMain(m *testing.M) { testenv.Main(m, browsertest.StopShared) }
//
// Tests that use it may run in parallel: each Page is a tab in a browser
// context of its own (no cookies, storage or permissions shared), and chromedp
// drives the tabs of one browser independently.
func Shared(t testing.TB) *Browser {
	t.Helper()
	execPath := ChromiumPath(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.b != nil {
		return shared.b
	}
	dir, err := os.MkdirTemp("", "browsertest-profile-")
	if err != nil {
		t.Fatalf("a profile directory: %v", err)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), AllocatorOptions(execPath, dir)...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	stop := func() {
		cancel()
		cancelAlloc()
		_ = os.RemoveAll(dir)
	}
	// As in Start: the first Do starts the browser and binds it to ctx.
	if err := chromedp.Do(ctx); err != nil {
		stop()
		t.Fatalf("start %s: %v", execPath, err)
	}
	shared.b, shared.stop = &Browser{ctx: ctx}, stop
	return shared.b
}

// StopShared stops the browser of Shared, if it started, and removes its
// profile.
func StopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.stop != nil {
		shared.stop()
	}
	shared.b, shared.stop = nil, nil
}

// Entry is one line of a page's console or browser log.
type Entry struct {
	Level  string // error, warning, exception, ...
	Source string // console, javascript, network, security, csp, ...
	Text   string
	URL    string
}

func (e Entry) String() string {
	s := e.Level + " [" + e.Source + "] " + e.Text
	if e.URL != "" {
		s += " (" + e.URL + ")"
	}
	return s
}

// Page is one tab, in a browser context of its own.
type Page struct {
	// Ctx is the tab's chromedp context, for actions the kit does not wrap.
	Ctx context.Context

	mu      sync.Mutex
	console []Entry
	csp     []string
	dialogs []string
	accept  bool
}

// NewPage opens a tab in a new browser context (its own cookies and storage),
// recording its console and CSP violations from the first document on.
// JavaScript dialogs are dismissed until AnswerDialogs says otherwise.
func (b *Browser) NewPage(t testing.TB) *Page {
	t.Helper()
	p := &Page{}
	ctx, cancel := chromedp.NewContext(b.ctx, chromedp.WithNewBrowserContext(), chromedp.WithListener(p.listen))
	t.Cleanup(cancel)
	p.Ctx = ctx
	// The first Do opens the tab and binds it to the context it gets: ctx
	// itself, not one with a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	// Background tabs of a headless browser may lose focus; pages here
	// always have it (clipboard access, :focus-visible).
	if _, err := call(p, emulation.SetFocusEmulationEnabled, emulation.SetFocusEmulationEnabledParams{Enabled: true}); err != nil {
		t.Fatalf("emulate focus: %v", err)
	}
	if _, err := call(p, runtime.AddBinding, runtime.AddBindingParams{Name: cspBinding}); err != nil {
		t.Fatalf("add the CSP binding: %v", err)
	}
	p.AddInitScript(t, `document.addEventListener('securitypolicyviolation', function (e) {
	var s = e.violatedDirective + ' blocked ' + (e.blockedURI || 'inline') + ' at ' + e.sourceFile + ':' + e.lineNumber;
	try { window.`+cspBinding+`(s); } catch (_) {}
});`)
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			p.mu.Lock()
			p.dialogs = append(p.dialogs, ev.Message)
			accept := p.accept
			p.mu.Unlock()
			// An error here means the tab is gone; the test then fails on its own.
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: accept})
		}
	}()
	return p
}

// call runs one DevTools command on the tab, bounded by Timeout.
func call[P, R any](p *Page, cmd cdp.Command[P, R], params P) (R, error) {
	ctx, cancel := context.WithTimeout(p.Ctx, Timeout)
	defer cancel()
	return chromedp.Call(ctx, cmd, params)
}

// AddInitScript runs src in every document the tab loads from now on, before
// the document's own scripts.
func (p *Page) AddInitScript(t testing.TB, src string) {
	t.Helper()
	if _, err := call(p, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: src}); err != nil {
		t.Fatalf("add init script: %v", err)
	}
}

// AnswerDialogs sets the answer to the JavaScript dialogs (confirm, alert)
// that open from now on: accept (OK) or dismiss (Cancel).
func (p *Page) AnswerDialogs(accept bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.accept = accept
}

// Dialogs returns the messages of the dialogs the tab has shown.
func (p *Page) Dialogs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.dialogs...)
}

// Do runs actions, each run bounded by Timeout, and fails the test on error.
func (p *Page) Do(t testing.TB, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.Ctx, Timeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		p.DumpConsole(t)
		t.Fatalf("browser: %v", err)
	}
}

// Run runs one action with a value on p, bounded by Timeout, and fails the
// test on error.
func Run[T any](t testing.TB, p *Page, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.Ctx, Timeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		p.DumpConsole(t)
		t.Fatalf("browser: %v", err)
	}
	return v
}

// Eval evaluates a JavaScript expression in the page and decodes its value.
func Eval[T any](t testing.TB, p *Page, expr string) T {
	t.Helper()
	return Run(t, p, chromedp.Evaluate[T](expr))
}

// Navigate opens url and returns the response of the document (after
// redirects).
func (p *Page) Navigate(t testing.TB, url string) *network.Response {
	t.Helper()
	return Run(t, p, chromedp.NavigateResponse(url))
}

// Header is the value of the response header name (any case), or "".
func Header(resp *network.Response, name string) string {
	for k, v := range resp.Headers {
		if strings.EqualFold(k, name) {
			s, _ := v.(string)
			return s
		}
	}
	return ""
}

// Load runs steps that navigate (a click on a link or a submit button, a key
// press), waits until the new document has loaded and returns its response
// (after redirects).
//
// Steps whose node was replaced between its query and the click (a page that
// updates itself in place, like a running broadcast's) fail before any input
// is sent ("Could not find node with given id"); they are run again, twice at
// most, on the node that replaced it.
func (p *Page) Load(t testing.TB, steps ...chromedp.Action[chromedp.Void]) *network.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.Ctx, Timeout)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, steps...)
	for retry := 0; retry < 2 && err != nil && strings.Contains(err.Error(), "Could not find node with given id"); retry++ {
		resp, err = chromedp.RunResponse(ctx, steps...)
	}
	if err != nil {
		p.DumpConsole(t)
		t.Fatalf("browser: waiting for a page load: %v", err)
	}
	if resp == nil {
		t.Fatalf("browser: no document response")
	}
	return resp
}

// Screenshot saves a full-page PNG as name under dir (relative to the
// artifacts directory) and logs and returns its path.
func (p *Page) Screenshot(t testing.TB, dir, name string) string {
	t.Helper()
	buf := Run(t, p, chromedp.FullScreenshot(100))
	d := filepath.Join(ArtifactsDir(t), dir)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(d, name)
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	t.Logf("screenshot: %s", path)
	return path
}

// ConsoleErrors returns the errors the tab logged so far: console.error and
// console.assert calls, uncaught exceptions, browser log errors (failed loads,
// blocked resources) and CSP violations.
func (p *Page) ConsoleErrors() []Entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Entry
	for _, e := range p.console {
		if e.Level == "error" || e.Level == "exception" || e.Level == "assert" {
			out = append(out, e)
		}
	}
	for _, v := range p.csp {
		out = append(out, Entry{Level: "error", Source: "csp", Text: v})
	}
	return out
}

var statusRe = regexp.MustCompile(`status of (\d{3})`)

// HTTPStatus is the status code a "Failed to load resource: the server
// responded with a status of N" log entry names, or 0.
func (e Entry) HTTPStatus() int {
	if e.Source != "network" {
		return 0
	}
	m := statusRe.FindStringSubmatch(e.Text)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// AssertNoConsoleErrors fails the test for every console error and CSP
// violation, except the network entries of documents answered with one of the
// expected statuses (a page served with 401, 403, 409, ... logs one).
func (p *Page) AssertNoConsoleErrors(t testing.TB, expectedStatus ...int) {
	t.Helper()
	for _, e := range p.ConsoleErrors() {
		if s := e.HTTPStatus(); s != 0 && contains(expectedStatus, s) {
			continue
		}
		t.Errorf("console: %s", e)
	}
}

func contains(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// DumpConsole logs everything the tab logged, for a failure's context.
func (p *Page) DumpConsole(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.console {
		t.Logf("console: %s", e)
	}
	for _, v := range p.csp {
		t.Logf("CSP violation: %s", v)
	}
}

// listen runs in the tab's message loop: it must return fast.
func (p *Page) listen(ev any) {
	var e Entry
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		parts := make([]string, 0, len(ev.Args))
		for _, a := range ev.Args {
			parts = append(parts, remoteText(a))
		}
		e = Entry{Level: string(ev.Type), Source: "console", Text: strings.Join(parts, " ")}
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		text := d.Text
		if d.Exception != nil && d.Exception.Description != "" {
			text += " " + d.Exception.Description
		}
		e = Entry{Level: "exception", Source: "javascript", Text: text, URL: d.URL}
	case *log.EventEntryAdded:
		if ev.Entry == nil {
			return
		}
		e = Entry{Level: string(ev.Entry.Level), Source: string(ev.Entry.Source), Text: ev.Entry.Text, URL: ev.Entry.URL}
	case *runtime.EventBindingCalled:
		if ev.Name != cspBinding {
			return
		}
		p.mu.Lock()
		p.csp = append(p.csp, ev.Payload)
		p.mu.Unlock()
		return
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

// Quote returns s as a JavaScript string literal.
func Quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
