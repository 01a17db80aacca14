package dashboard_test

// Browser tests of the dashboard with headless Chromium (chromedp, through
// internal/browsertest) over a real Postgres database (newEnv): every flow is
// driven through the pages as an operator would, and checked in the page and
// in the database. The tests run in parallel in the test binary's one browser
// (browsertest.Shared); each page is a tab in a browser context of its own (its
// own cookies, storage and permissions), and each test has its own database and
// server. Only TestBrowserChannels uses the clipboard, which the browser's tabs
// share. Every test fails on console errors and CSP violations (apart
// from the log line of a page served with an expected error status), and
// saves screenshots as artifacts/dashboard/<test>-<page>-<desktop|mobile>.png
// (or under $WABARELAY_ARTIFACTS).
//
// WABARELAY_UPDATE_DOCS_SCREENSHOT=1 also writes the Channels page to
// docs/img/dashboard.png (the README shows it).
//
// Chromium: $WABARELAY_CHROMIUM, else /usr/bin/chromium, else PATH; the tests
// fail without it unless WABARELAY_SKIP_BROWSER=1 (ignored when CI is set).

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/browsertest"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

// newBrowserEnv is newEnv plus the shared browser. The browser is looked for
// first, so that a skipped run does no database work.
func newBrowserEnv(t *testing.T, opts ...envOption) (*env, *browsertest.Browser) {
	t.Helper()
	browsertest.ChromiumPath(t)
	e := newEnv(t, opts...)
	return e, browsertest.Shared(t)
}

// shot saves a full-page screenshot as <test>-<name>-<variant>.png.
func shot(t *testing.T, p *browsertest.Page, name, variant string) string {
	t.Helper()
	test, _, _ := strings.Cut(t.Name(), "/")
	return p.Screenshot(t, "dashboard", test+"-"+name+"-"+variant+".png")
}

func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

// click clicks the first element matching sel, waits for the page it loads
// and returns that page's response.
func click(t *testing.T, p *browsertest.Page, sel string) (status int, path string) {
	t.Helper()
	resp := p.Load(t, chromedp.Click(css(sel)))
	return int(resp.Status), browserPath(t, p)
}

// browserPath is the path (and query) of the page shown.
func browserPath(t *testing.T, p *browsertest.Page) string {
	t.Helper()
	return browsertest.Eval[string](t, p, `location.pathname + location.search`)
}

// wantPage checks the page's status and path (query ignored).
func wantPage(t *testing.T, status int, path string, wantStatus int, wantPath string) {
	t.Helper()
	if p, _, _ := strings.Cut(path, "?"); status != wantStatus || p != wantPath {
		t.Fatalf("page %s (HTTP %d), want %s (HTTP %d)", path, status, wantPath, wantStatus)
	}
}

// textOf is the visible text of the first element matching sel ("" when there
// is none).
func textOf(t *testing.T, p *browsertest.Page, sel string) string {
	t.Helper()
	return browsertest.Eval[string](t, p, `(() => { const n = document.querySelector(`+browsertest.Quote(sel)+`); return n ? n.innerText : ''; })()`)
}

// wantText fails unless the first element matching sel shows every want.
func wantText(t *testing.T, p *browsertest.Page, sel string, want ...string) {
	t.Helper()
	got := textOf(t, p, sel)
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Fatalf("%s shows %q, want it to contain %q", sel, got, w)
		}
	}
}

func present(t *testing.T, p *browsertest.Page, sel string) bool {
	t.Helper()
	return browsertest.Eval[bool](t, p, `document.querySelector(`+browsertest.Quote(sel)+`) !== null`)
}

func valueOf(t *testing.T, p *browsertest.Page, sel string) string {
	t.Helper()
	return browsertest.Run(t, p, chromedp.Value(css(sel)))
}

// waitTrue waits until the JavaScript function fn, called with args, returns
// true.
func waitTrue(t *testing.T, p *browsertest.Page, fn string, args ...any) {
	t.Helper()
	browsertest.Run(t, p, chromedp.PollFunction[bool](fn, chromedp.WithPollingArgs(args...)))
}

// signIn signs in through the sign-in form and checks that it lands on Channels.
func signIn(t *testing.T, p *browsertest.Page, e *env, key string) {
	t.Helper()
	p.Navigate(t, e.srv.URL+"/dashboard/login")
	p.Do(t, chromedp.SendKeys(chromedp.ID("api_key"), key))
	status, path := click(t, p, `form[action$="/login"] button[type=submit]`)
	wantPage(t, status, path, http.StatusOK, "/dashboard/channels")
}

func channels(t *testing.T, e *env) []store.Channel {
	t.Helper()
	list, err := e.Store.ListChannels(context.Background(), e.org.ID)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

func webhooks(t *testing.T, e *env) []store.Webhook {
	t.Helper()
	list, err := e.Store.ListWebhooks(context.Background(), e.org.ID)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// ---------------------------------------------------------------------------
// 1. Sign-in and sign-out
// ---------------------------------------------------------------------------

// TestBrowserSignInOut: a bad key shows the API's message on the sign-in
// page; the org's key lands on Channels; Sign out returns to the sign-in page,
// and neither the browser's Back button nor a direct visit brings Channels
// back.
func TestBrowserSignInOut(t *testing.T) {
	t.Parallel()
	e, b := newBrowserEnv(t)
	p := b.NewPage(t)

	resp := p.Navigate(t, e.srv.URL+"/dashboard/")
	wantPage(t, int(resp.Status), browserPath(t, p), http.StatusOK, "/dashboard/login")
	wantText(t, p, "main", "API key of your organization")
	if got := browsertest.Eval[string](t, p, `document.activeElement.id`); got != "api_key" {
		t.Errorf("focus on the sign-in page is on %q, want the key field", got)
	}
	shot(t, p, "login", "desktop")

	p.Do(t, chromedp.SendKeys(chromedp.ID("api_key"), "crt_pk_nope"))
	status, path := click(t, p, `form[action$="/login"] button[type=submit]`)
	wantPage(t, status, path, http.StatusUnauthorized, "/dashboard/login")
	wantText(t, p, `.error[role=alert]`, managementapi.MsgKeyInvalid)
	if v := valueOf(t, p, "#api_key"); v != "" {
		t.Errorf("the key field keeps %q after a failed sign-in", v)
	}
	shot(t, p, "login-bad-key", "desktop")

	p.Do(t, chromedp.SendKeys(chromedp.ID("api_key"), e.key))
	status, path = click(t, p, `form[action$="/login"] button[type=submit]`)
	wantPage(t, status, path, http.StatusOK, "/dashboard/channels")
	wantText(t, p, "h1", "Channels")
	wantText(t, p, ".who", "ops", e.keyRec.Prefix)
	wantText(t, p, `nav[aria-label=Main] a[aria-current=page]`, "Channels")

	status, path = click(t, p, `form.signout button[type=submit]`)
	wantPage(t, status, path, http.StatusOK, "/dashboard/login")
	wantText(t, p, `.notice[role=status]`, "Signed out.")
	if present(t, p, "form.signout") {
		t.Errorf("the sign-in page after sign-out still shows the session's header")
	}

	// Back to the Channels page in the history: the page is asked of the
	// server again (Chrome may first restore it from its back/forward cache;
	// the page then fetches itself), and redirects to the sign-in page.
	p.Load(t, chromedp.Evaluate[chromedp.Void](`history.back()`))
	if path := browserPath(t, p); !strings.HasPrefix(path, "/dashboard/login") {
		t.Errorf("Back after sign-out shows %s, want the sign-in page", path)
	}
	if present(t, p, "form.signout") || !present(t, p, "#api_key") {
		t.Errorf("Back after sign-out shows a signed-in page")
	}
	resp = p.Navigate(t, e.srv.URL+"/dashboard/channels")
	wantPage(t, int(resp.Status), browserPath(t, p), http.StatusOK, "/dashboard/login")
	p.AssertNoConsoleErrors(t, http.StatusUnauthorized)
}

// ---------------------------------------------------------------------------
// 2. Channels
// ---------------------------------------------------------------------------

// TestBrowserChannels: creating a channel shows its card with the connect
// link, a working Copy link button and the QR code; deleting an active channel
// asks for a confirmation ("Keep it" keeps it, "Delete it anyway" deletes
// it); Reconnect opens a new link for a channel whose link expired.
func TestBrowserChannels(t *testing.T) {
	t.Parallel()
	e, b := newBrowserEnv(t, withConnectBase("https://relay.example.com"))
	ctx := context.Background()
	p := b.NewPage(t)
	signIn(t, p, e, e.key)
	if !present(t, p, "p.empty") {
		t.Errorf("no empty-state text without channels")
	}

	p.Do(t, chromedp.SendKeys(chromedp.ID("channel-name"), "Support line"))
	status, path := click(t, p, `form[action$="/channels"] button[type=submit]`)
	wantPage(t, status, path, http.StatusOK, "/dashboard/channels")
	wantText(t, p, `.notice[role=status]`, "Channel created")
	list := channels(t, e)
	if len(list) != 1 || list[0].Name != "Support line" {
		t.Fatalf("channels after create: %+v", list)
	}
	ch := list[0]
	card := "#channel-" + ch.ID.String()
	wantText(t, p, card+" h2", "Support line")
	wantText(t, p, card+" .badge", "pending")
	link := valueOf(t, p, "#link-"+ch.ID.String())
	if link != "https://relay.example.com/connect/"+ch.ChannelToken {
		t.Errorf("connect link = %q, want the channel's link on the connect base", link)
	}
	wantText(t, p, card+` label[for="link-`+ch.ID.String()+`"]`, "Connect link (open until")
	p.Do(t, chromedp.WaitVisible(css(card+" svg.qr")))
	if label := browsertest.Eval[string](t, p, `document.querySelector('`+card+` svg.qr').getAttribute('aria-label')`); label != "Connect link of Support line" {
		t.Errorf("QR code label = %q", label)
	}
	if n := browsertest.Eval[int](t, p, `document.querySelector('`+card+` svg.qr path').getAttribute('d').length`); n < 1000 {
		t.Errorf("QR code path has %d characters: no code drawn", n)
	}
	docShot := shot(t, p, "created", "desktop")
	if os.Getenv("WABARELAY_UPDATE_DOCS_SCREENSHOT") == "1" {
		buf, err := os.ReadFile(docShot)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(browsertest.RepoRoot(t), "docs", "img", "dashboard.png")
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, buf, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("docs screenshot: %s", dst)
	}

	// Copy link: the page may write the clipboard (and the test read it back).
	bctx := chromedp.FromContext(p.Ctx).BrowserContextID
	for _, perm := range []string{"clipboard-read", "clipboard-write"} {
		if _, err := chromedp.CallBrowser(p.Ctx, browser.SetPermission, browser.SetPermissionParams{
			Permission: &browser.PermissionDescriptor{Name: perm}, Setting: browser.PermissionSettingGranted,
			Origin: e.srv.URL, BrowserContextID: bctx,
		}); err != nil {
			t.Fatalf("grant %s: %v", perm, err)
		}
	}
	copyBtn := card + " button[data-copy]"
	wantText(t, p, copyBtn, "Copy link")
	// Record the labels the button takes ("Copied" lasts 1.5 s: a loaded
	// machine could miss it between two polls).
	browsertest.Eval[bool](t, p, `(() => {
	const b = document.querySelector(`+browsertest.Quote(copyBtn)+`);
	window.__labels = [];
	new MutationObserver(() => window.__labels.push(b.textContent)).observe(b, {childList: true, characterData: true, subtree: true});
	return true;
})()`)
	p.Do(t, chromedp.Click(css(copyBtn)))
	waitTrue(t, p, `() => window.__labels.includes('Copied')`)
	if got := browsertest.Run(t, p, chromedp.Evaluate[string](`navigator.clipboard.readText()`, chromedp.EvalAwaitPromise)); got != link {
		t.Errorf("clipboard = %q after Copy link, want the link %q", got, link)
	}
	// The label comes back.
	waitTrue(t, p, `(sel) => document.querySelector(sel).textContent === 'Copy link'`, copyBtn)

	// An active channel: Delete asks first.
	makeActive(t, e, ch.ID)
	p.Navigate(t, e.srv.URL+"/dashboard/channels")
	wantText(t, p, card+" .badge", "active")
	wantText(t, p, card+" dl", "+1 555 0100", "1001", "2001")
	if present(t, p, "#link-"+ch.ID.String()) || present(t, p, card+` form[action$="/reconnect"]`) {
		t.Errorf("a connected channel shows a connect link or Reconnect")
	}
	status, path = click(t, p, card+` form[action$="/delete"] button`)
	wantPage(t, status, path, http.StatusConflict, "/dashboard/channels/"+ch.ID.String()+"/delete")
	wantText(t, p, `.error[role=alert]`, managementapi.MsgChannelActive)
	wantText(t, p, "section.confirm h2", "Delete the active channel", "Support line")
	wantText(t, p, "section.confirm", "+1 555 0100")
	shot(t, p, "confirm-delete", "desktop")
	status, path = click(t, p, `section.confirm a`) // Keep it
	wantPage(t, status, path, http.StatusOK, "/dashboard/channels")
	if len(channels(t, e)) != 1 || !present(t, p, card) {
		t.Fatalf("Keep it did not keep the channel")
	}
	click(t, p, card+` form[action$="/delete"] button`)
	status, path = click(t, p, `section.confirm button[type=submit]`) // Delete it anyway
	wantPage(t, status, path, http.StatusOK, "/dashboard/channels")
	wantText(t, p, `.notice[role=status]`, "Channel deleted.")
	if present(t, p, card) {
		t.Errorf("the deleted channel's card is still shown")
	}
	if n := len(channels(t, e)); n != 0 {
		t.Fatalf("%d channels left after Delete it anyway", n)
	}

	// A channel whose link expired: Reconnect opens a new one.
	old := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Old link"})
	e.Exec(t, `UPDATE channels SET token_expires_at = now() - interval '1 minute' WHERE id = $1`, old.ID)
	oldCard := "#channel-" + old.ID.String()
	p.Navigate(t, e.srv.URL+"/dashboard/channels")
	if present(t, p, "#link-"+old.ID.String()) || present(t, p, oldCard+" svg.qr") {
		t.Errorf("an expired link is still offered")
	}
	shot(t, p, "expired-link", "desktop")
	status, path = click(t, p, oldCard+` form[action$="/reconnect"] button`)
	wantPage(t, status, path, http.StatusOK, "/dashboard/channels")
	wantText(t, p, `.notice[role=status]`, "The connect link is open again.")
	p.Do(t, chromedp.WaitVisible(css("#link-"+old.ID.String())), chromedp.WaitVisible(css(oldCard+" svg.qr")))
	fresh, err := e.Store.GetChannel(ctx, e.org.ID, old.ID)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.TokenExpiresAt == nil || !fresh.TokenExpiresAt.After(time.Now()) {
		t.Errorf("after Reconnect the link expires at %v", fresh.TokenExpiresAt)
	}
	if got := valueOf(t, p, "#link-"+old.ID.String()); got != "https://relay.example.com/connect/"+fresh.ChannelToken {
		t.Errorf("after Reconnect the link is %q", got)
	}

	// Reconnect is offered exactly where the API accepts it: a connected
	// channel whose upstream token died, not one the operator deactivated.
	makeActive(t, e, old.ID)
	e.Exec(t, `UPDATE channels SET upstream_disconnected_at = now() WHERE id = $1`, old.ID)
	off := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Switched off"})
	e.Exec(t, `UPDATE channels SET status = 'inactive', inactive_reason = 'operator', token_expires_at = NULL WHERE id = $1`, off.ID)
	p.Navigate(t, e.srv.URL+"/dashboard/channels")
	wantText(t, p, oldCard+" .row", "upstream token dead")
	if present(t, p, "#channel-"+off.ID.String()+` form[action$="/reconnect"]`) {
		t.Errorf("Reconnect is offered for a channel the operator deactivated")
	}
	status, _ = click(t, p, oldCard+` form[action$="/reconnect"] button`)
	if status != http.StatusOK {
		t.Errorf("Reconnect of a channel whose upstream token died: HTTP %d", status)
	}
	wantText(t, p, `.notice[role=status]`, "The connect link is open again.")
	p.AssertNoConsoleErrors(t, http.StatusConflict)
}

// ---------------------------------------------------------------------------
// 3. Webhooks
// ---------------------------------------------------------------------------

// TestBrowserWebhooks: creating a webhook with chosen events and a channel
// shows its signing secret once; Pause and Resume change its badge; a channel
// is assigned and removed; Delete asks first: Cancel deletes nothing, OK
// deletes it.
func TestBrowserWebhooks(t *testing.T) {
	t.Parallel()
	e, b := newBrowserEnv(t)
	ctx := context.Background()
	support := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Support line"})
	sales := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Sales"})
	p := b.NewPage(t)
	signIn(t, p, e, e.key)
	status, path := click(t, p, `nav a[href$="/webhooks"]`)
	wantPage(t, status, path, http.StatusOK, "/dashboard/webhooks")

	p.Do(t,
		chromedp.SendKeys(chromedp.ID("wh-name"), "CRM"),
		chromedp.SendKeys(chromedp.ID("wh-url"), "https://crm.example.com/hooks/whatsapp"),
		chromedp.Click(css(`input[name=events][value=message_status]`)), // only messages
		chromedp.Click(css(`input[name=channel_ids][value="`+support.ID.String()+`"]`)),
	)
	status, path = click(t, p, `form[action$="/webhooks"] button[type=submit]`)
	wantPage(t, status, path, http.StatusCreated, "/dashboard/webhooks")
	wantText(t, p, `.notice[role=status]`, "Webhook created")
	wantText(t, p, "section.secret h2", "Signing secret of", "CRM")
	secret := valueOf(t, p, "#new-secret")
	if !strings.HasPrefix(secret, store.SecretPrefix) || len(secret) < 40 {
		t.Fatalf("secret shown = %q", secret)
	}
	wantText(t, p, "section.secret button[data-copy]", "Copy secret")
	shot(t, p, "secret", "desktop")
	hooks := webhooks(t, e)
	if len(hooks) != 1 {
		t.Fatalf("%d webhooks after create", len(hooks))
	}
	wh := hooks[0]
	if wh.Name != "CRM" || strings.Join(wh.Events, ",") != "messages" || len(wh.ChannelIDs) != 1 || wh.ChannelIDs[0] != support.ID {
		t.Fatalf("webhook created = %+v", wh)
	}
	if got, err := e.Store.WebhookSecret(ctx, wh.ID); err != nil || got != secret {
		t.Fatalf("the page showed %q, the store holds %q (%v)", secret, got, err)
	}
	card := "#webhook-" + wh.ID.String()
	wantText(t, p, card+" dl", "https://crm.example.com/hooks/whatsapp", "messages", "Support line")

	// Shown once: a fresh visit does not show it.
	p.Navigate(t, e.srv.URL+"/dashboard/webhooks")
	if present(t, p, "#new-secret") || present(t, p, "section.secret") {
		t.Errorf("the secret card is shown again")
	}
	if html := browsertest.Eval[string](t, p, `document.documentElement.outerHTML`); strings.Contains(html, secret) {
		t.Errorf("the secret is in the page again")
	}

	// Pause, Resume.
	wantText(t, p, card+" .badge", "active")
	click(t, p, card+` form[action$="/status"] button`)
	wantText(t, p, `.notice[role=status]`, "Webhook updated.")
	wantText(t, p, card+" .badge", "paused")
	wantText(t, p, card+` form[action$="/status"] button`, "Resume")
	if got, _ := e.Store.GetWebhook(ctx, e.org.ID, wh.ID); got.Status != "paused" {
		t.Errorf("status in the store = %s after Pause", got.Status)
	}
	shot(t, p, "paused", "desktop")
	click(t, p, card+` form[action$="/status"] button`)
	wantText(t, p, card+" .badge", "active")
	if got, _ := e.Store.GetWebhook(ctx, e.org.ID, wh.ID); got.Status != "active" {
		t.Errorf("status in the store = %s after Resume", got.Status)
	}

	// Assign Sales, remove Support line.
	sel := "#assign-" + wh.ID.String()
	p.Do(t, chromedp.SetValue(css(sel), sales.ID.String()))
	status, _ = click(t, p, card+` button[name=op][value=assign]`)
	if status != http.StatusOK {
		t.Fatalf("Assign: HTTP %d", status)
	}
	wantText(t, p, `.notice[role=status]`, "Channel assignment updated.")
	wantText(t, p, card+" dl", "Support line, Sales")
	if got, _ := e.Store.GetWebhook(ctx, e.org.ID, wh.ID); len(got.ChannelIDs) != 2 {
		t.Errorf("channels in the store after Assign: %v", got.ChannelIDs)
	}
	p.Do(t, chromedp.SetValue(css(sel), support.ID.String()))
	click(t, p, card+` button[name=op][value=remove]`)
	wantText(t, p, `.notice[role=status]`, "Channel assignment updated.")
	if got := textOf(t, p, card+" dl"); strings.Contains(got, "Support line") || !strings.Contains(got, "Sales") {
		t.Errorf("scope after Remove: %q", got)
	}
	if got, _ := e.Store.GetWebhook(ctx, e.org.ID, wh.ID); len(got.ChannelIDs) != 1 || got.ChannelIDs[0] != sales.ID {
		t.Errorf("channels in the store after Remove: %v", got.ChannelIDs)
	}

	// Delete, answered Cancel: the form is not sent.
	del := card + ` form[action$="/delete"] button`
	browsertest.Eval[bool](t, p, `window.__samePage = true`)
	p.AnswerDialogs(false)
	p.Do(t, chromedp.Click(css(del)))
	if d := p.Dialogs(); len(d) != 1 || d[0] != "Delete the webhook “CRM” and its pending deliveries?" {
		t.Fatalf("dialogs = %q, want the delete confirmation", d)
	}
	if !browsertest.Eval[bool](t, p, `window.__samePage === true`) || !present(t, p, card) {
		t.Errorf("Cancel in the confirmation left the page")
	}
	if n := len(webhooks(t, e)); n != 1 {
		t.Fatalf("%d webhooks after a cancelled Delete", n)
	}
	// Answered OK: deleted. (Had the cancelled form been sent, this would be
	// a "not found" error, not the notice.)
	p.AnswerDialogs(true)
	status, path = click(t, p, del)
	wantPage(t, status, path, http.StatusOK, "/dashboard/webhooks")
	wantText(t, p, `.notice[role=status]`, "Webhook deleted.")
	if len(p.Dialogs()) != 2 {
		t.Errorf("dialogs = %q, want two", p.Dialogs())
	}
	if present(t, p, card) || len(webhooks(t, e)) != 0 {
		t.Errorf("the webhook is still there after Delete")
	}
	p.AssertNoConsoleErrors(t)
}

// ---------------------------------------------------------------------------
// 4. Delivery log
// ---------------------------------------------------------------------------

// TestBrowserDeliveryLog: a webhook's page lists its deliveries with their
// attempts (code, latency, response excerpt) and draws the two charts; the
// status and time filters narrow the list; Retry queues a failed delivery;
// Recover queues every failed delivery since a time.
func TestBrowserDeliveryLog(t *testing.T) {
	t.Parallel()
	e, b := newBrowserEnv(t)
	ch := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Line"})
	wh, _ := e.Webhook(t, e.org.ID, "https://crm.example.com/hook", &testenv.WebhookOpts{Name: "CRM"})
	failed := seedDelivery(t, e, wh.ID, ch.ID, "failed", 500, 42, "receiver exploded")
	ok := seedDelivery(t, e, wh.ID, ch.ID, "delivered", 200, 17, `{"ok":true}`)
	page := "/dashboard/webhooks/" + wh.ID.String()

	p := b.NewPage(t)
	signIn(t, p, e, e.key)
	click(t, p, `nav a[href$="/webhooks"]`)
	status, path := click(t, p, "#webhook-"+wh.ID.String()+" h2 a")
	wantPage(t, status, path, http.StatusOK, page)
	wantText(t, p, "h1", "Webhook CRM")

	fRow, okRow := "#delivery-"+failed.String(), "#delivery-"+ok.String()
	wantText(t, p, fRow+" .badge", "failed")
	wantText(t, p, fRow, "500", "42 ms", "receiver exploded")
	wantText(t, p, okRow+" .badge", "delivered")
	wantText(t, p, okRow, "200", "17 ms", `{"ok":true}`)
	if present(t, p, okRow+` form[action$="/retry"]`) {
		t.Errorf("a delivered delivery offers Retry")
	}
	wantText(t, p, ".summary", "1 attempts succeeded, 1 failed")
	p.Do(t, chromedp.WaitVisible(css(`svg.chart[aria-label^="Delivery attempts per 15 minutes"]`)),
		chromedp.WaitVisible(css(`svg.chart[aria-label^="Attempt latency"]`)))
	if n := browsertest.Eval[int](t, p, `document.querySelectorAll('figure svg.chart rect.bar').length`); n != 4 {
		t.Errorf("%d chart bars, want 4 (succeeded, failed, p50, p99)", n)
	}
	shot(t, p, "log", "desktop")

	// Filters.
	p.Do(t, chromedp.SetValue(css("#f-status"), "failed"))
	status, path = click(t, p, `form.filters button[type=submit]`)
	wantPage(t, status, path, http.StatusOK, page)
	if !strings.Contains(path, "status=failed") {
		t.Errorf("filter URL = %s", path)
	}
	if !present(t, p, fRow) || present(t, p, okRow) {
		t.Errorf("status=failed: want only the failed delivery")
	}
	if v := valueOf(t, p, "#f-status"); v != "failed" {
		t.Errorf("the status filter shows %q after filtering", v)
	}
	p.Do(t, chromedp.SetValue(css("#f-status"), "delivered"))
	click(t, p, `form.filters button[type=submit]`)
	if present(t, p, fRow) || !present(t, p, okRow) {
		t.Errorf("status=delivered: want only the delivered delivery")
	}
	p.Do(t, chromedp.SetValue(css("#f-status"), ""),
		chromedp.SetValue(css("#f-since"), time.Now().UTC().Add(time.Hour).Format("2006-01-02T15:04")))
	click(t, p, `form.filters button[type=submit]`)
	wantText(t, p, "p.empty", "No deliveries match.")
	p.Do(t, chromedp.SetValue(css("#f-since"), time.Now().UTC().Add(-time.Hour).Format("2006-01-02T15:04")))
	click(t, p, `form.filters button[type=submit]`)
	if !present(t, p, fRow) || !present(t, p, okRow) {
		t.Errorf("since an hour ago: want both deliveries")
	}

	// Retry.
	status, path = click(t, p, fRow+` form[action$="/retry"] button`)
	wantPage(t, status, path, http.StatusOK, page)
	wantText(t, p, `.notice[role=status]`, "Delivery queued for a fresh attempt.")
	wantText(t, p, fRow+" .badge", "pending")
	if s := deliveryStatus(t, e, failed); s != "pending" {
		t.Errorf("after Retry the delivery is %s", s)
	}

	// It fails again; Recover since an hour ago queues it again.
	e.Exec(t, `WITH q AS (DELETE FROM delivery_queue WHERE delivery_id = $1) UPDATE deliveries SET status = 'failed' WHERE id = $1`, failed)
	p.Navigate(t, e.srv.URL+page)
	wantText(t, p, fRow+" .badge", "failed")
	p.Do(t, chromedp.SetValue(css("#recover-since"), time.Now().UTC().Add(-time.Hour).Format("2006-01-02T15:04")))
	status, _ = click(t, p, `form[action$="/recover"] button[type=submit]`)
	if status != http.StatusOK {
		t.Fatalf("Recover: HTTP %d", status)
	}
	wantText(t, p, `.notice[role=status]`, "1 failed deliveries queued again.")
	wantText(t, p, fRow+" .badge", "pending")
	if s := deliveryStatus(t, e, failed); s != "pending" {
		t.Errorf("after Recover the delivery is %s", s)
	}
	shot(t, p, "recovered", "desktop")
	p.AssertNoConsoleErrors(t)
}

// ---------------------------------------------------------------------------
// 5. API keys
// ---------------------------------------------------------------------------

// TestBrowserAPIKeys: a new key is shown once; revoking another key asks
// first and revokes it; revoking the session's own key ends the session.
func TestBrowserAPIKeys(t *testing.T) {
	t.Parallel()
	e, b := newBrowserEnv(t)
	ctx := context.Background()
	p := b.NewPage(t)
	signIn(t, p, e, e.key)
	status, path := click(t, p, `nav a[href$="/api-keys"]`)
	wantPage(t, status, path, http.StatusOK, "/dashboard/api-keys")
	wantText(t, p, "#key-"+e.keyRec.ID.String(), "(this session)", "active")

	p.Do(t, chromedp.SendKeys(chromedp.ID("key-name"), "ci"), chromedp.SendKeys(chromedp.ID("key-expires"), "720h"))
	status, path = click(t, p, `form[action$="/api-keys"] button[type=submit]`)
	wantPage(t, status, path, http.StatusCreated, "/dashboard/api-keys")
	wantText(t, p, "section.secret h2", "New API key", "ci")
	key := valueOf(t, p, "#new-key")
	if !strings.HasPrefix(key, "crt_pk_") {
		t.Fatalf("key shown = %q", key)
	}
	ci, err := e.Store.AuthenticateAPIKey(ctx, key)
	if err != nil {
		t.Fatalf("the key shown does not authenticate: %v", err)
	}
	if ci.ExpiresAt == nil || time.Until(*ci.ExpiresAt) < 719*time.Hour {
		t.Errorf("key expires at %v, want in 720h", ci.ExpiresAt)
	}
	shot(t, p, "created", "desktop")

	p.Navigate(t, e.srv.URL+"/dashboard/api-keys")
	if present(t, p, "#new-key") {
		t.Errorf("the new key is shown again")
	}
	if html := browsertest.Eval[string](t, p, `document.documentElement.outerHTML`); strings.Contains(html, key) {
		t.Errorf("the key is in the page again")
	}
	// Nor does Back to the page that showed it (the form is not sent again).
	resp := p.Load(t, chromedp.Evaluate[chromedp.Void](`history.back()`))
	if resp.Status != http.StatusOK || present(t, p, "#new-key") {
		t.Errorf("Back to the created key: HTTP %d, key field shown: %v", resp.Status, present(t, p, "#new-key"))
	}
	if html := browsertest.Eval[string](t, p, `document.documentElement.outerHTML`); strings.Contains(html, key) {
		t.Errorf("Back shows the key again")
	}
	if ks, _ := e.Store.ListAPIKeys(ctx, e.org.ID); len(ks) != 2 {
		t.Errorf("%d keys after Back, want 2", len(ks))
	}
	row := "#key-" + ci.ID.String()
	wantText(t, p, row, "ci", "active")

	p.AnswerDialogs(true)
	status, path = click(t, p, row+" button.danger")
	wantPage(t, status, path, http.StatusOK, "/dashboard/api-keys")
	if d := p.Dialogs(); len(d) != 1 || !strings.HasPrefix(d[0], "Revoke the key "+ci.Prefix) {
		t.Errorf("dialogs = %q, want the revoke confirmation", d)
	}
	wantText(t, p, `.notice[role=status]`, "API key revoked.")
	wantText(t, p, row, "revoked")
	if present(t, p, row+" button") {
		t.Errorf("a revoked key still offers Revoke")
	}
	if _, err := e.Store.AuthenticateAPIKey(ctx, key); err == nil {
		t.Errorf("the revoked key still authenticates")
	}
	shot(t, p, "revoked", "desktop")

	// The session's own key.
	status, path = click(t, p, "#key-"+e.keyRec.ID.String()+" button.danger")
	wantPage(t, status, path, http.StatusOK, "/dashboard/login")
	if d := p.Dialogs(); len(d) != 2 || !strings.HasPrefix(d[1], "Revoke the key "+e.keyRec.Prefix) {
		t.Errorf("dialogs = %q, want a second revoke confirmation", d)
	}
	wantText(t, p, `.notice[role=status]`, "Signed out.")
	if _, err := e.Store.AuthenticateAPIKey(ctx, e.key); err == nil {
		t.Errorf("the session's key still authenticates")
	}
	resp = p.Navigate(t, e.srv.URL+"/dashboard/api-keys")
	wantPage(t, int(resp.Status), browserPath(t, p), http.StatusOK, "/dashboard/login")
	p.AssertNoConsoleErrors(t)
}

// ---------------------------------------------------------------------------
// 6. A revoked key ends its session
// ---------------------------------------------------------------------------

// TestBrowserRevokedKeyEndsSession: once the session's key is revoked
// elsewhere, the next page is the sign-in page and a form sent from a page
// still open is refused.
func TestBrowserRevokedKeyEndsSession(t *testing.T) {
	t.Parallel()
	e, b := newBrowserEnv(t)
	ctx := context.Background()
	p := b.NewPage(t)
	signIn(t, p, e, e.key)
	if _, err := e.Store.RevokeAPIKey(ctx, e.keyRec.ID); err != nil {
		t.Fatal(err)
	}
	status, path := click(t, p, `nav a[href$="/webhooks"]`)
	wantPage(t, status, path, http.StatusOK, "/dashboard/login")
	p.Do(t, chromedp.WaitVisible(chromedp.ID("api_key")))

	// A second key, signed in, with the Channels form open; the key goes.
	k2, key2 := e.APIKey(t, e.org.ID, &testenv.APIKeyOpts{Name: "second"})
	signIn(t, p, e, key2)
	p.Do(t, chromedp.SendKeys(chromedp.ID("channel-name"), "Too late"))
	if _, err := e.Store.RevokeAPIKey(ctx, k2.ID); err != nil {
		t.Fatal(err)
	}
	status, _ = click(t, p, `form[action$="/channels"] button[type=submit]`)
	if status != http.StatusUnauthorized {
		t.Errorf("a form after revocation: HTTP %d, want 401", status)
	}
	wantText(t, p, `.error[role=alert]`, "Your session has ended. Sign in again.")
	shot(t, p, "session-ended", "desktop")
	if n := len(channels(t, e)); n != 0 {
		t.Errorf("%d channels created with a revoked key", n)
	}
	p.AssertNoConsoleErrors(t, http.StatusUnauthorized)
}

// ---------------------------------------------------------------------------
// 7. Cross-site requests
// ---------------------------------------------------------------------------

// TestBrowserCrossOriginRefused: forms on another site posting to the
// dashboard (a sign-in with the attacker's key, a change in the operator's
// session) are refused with the 403 page and change nothing; the dashboard's
// own forms, which carry no token, work.
func TestBrowserCrossOriginRefused(t *testing.T) {
	t.Parallel()
	e, b := newBrowserEnv(t)
	wh, _ := e.Webhook(t, e.org.ID, "https://crm.example.com/hook", &testenv.WebhookOpts{Name: "CRM"})
	_, attackerKey := e.APIKey(t, e.org.ID, &testenv.APIKeyOpts{Name: "attacker"})
	// The attacker's site: another host (localhost, the dashboard is on 127.0.0.1), forms
	// posting to the dashboard, as a page the operator is lured to would.
	dash := e.srv.URL + "/dashboard"
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, `<!doctype html><title>Win a prize</title>
<form id="login" method="post" action="`+dash+`/login"><input name="api_key" value="`+attackerKey+`"><button>Sign in</button></form>
<form id="create" method="post" action="`+dash+`/channels"><input name="name" value="Forged"><button>Create</button></form>
<form id="delete" method="post" action="`+dash+`/webhooks/`+wh.ID.String()+`/delete"><button>Delete</button></form>`)
	}))
	t.Cleanup(evil.Close)
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1)
	p := b.NewPage(t)

	// Login CSRF: the operator's browser must not be signed in with the attacker's key.
	p.Navigate(t, evilURL)
	status, _ := click(t, p, `#login button`)
	if status != http.StatusForbidden {
		t.Errorf("cross-site sign-in: HTTP %d, want 403", status)
	}
	resp := p.Navigate(t, dash+"/channels")
	wantPage(t, int(resp.Status), browserPath(t, p), http.StatusOK, "/dashboard/login")

	signIn(t, p, e, e.key)
	// Create a channel from the other site.
	p.Navigate(t, evilURL)
	if status, _ := click(t, p, `#create button`); status != http.StatusForbidden {
		t.Errorf("cross-site create: HTTP %d, want 403", status)
	}
	wantText(t, p, "h1", "Refused")
	shot(t, p, "refused", "desktop")
	if n := len(channels(t, e)); n != 0 {
		t.Errorf("%d channels after a cross-site form", n)
	}
	// Delete a webhook from the other site.
	p.Navigate(t, evilURL)
	if status, _ := click(t, p, `#delete button`); status != http.StatusForbidden {
		t.Errorf("cross-site delete: HTTP %d, want 403", status)
	}
	if n := len(webhooks(t, e)); n != 1 {
		t.Errorf("%d webhooks after a cross-site delete", n)
	}
	// The session is still fine: the dashboard's own form works (no token in it).
	p.Navigate(t, dash+"/webhooks")
	if present(t, p, `input[name=csrf]`) {
		t.Errorf("a form still carries a per-form token")
	}
	p.AnswerDialogs(true)
	click(t, p, "#webhook-"+wh.ID.String()+` form[action$="/delete"] button`)
	wantText(t, p, `.notice[role=status]`, "Webhook deleted.")
	p.AssertNoConsoleErrors(t, http.StatusForbidden)
}

// ---------------------------------------------------------------------------
// 8. Keyboard only
// ---------------------------------------------------------------------------

// focusInfo describes document.activeElement.
type focusInfo struct {
	Tag          string `json:"tag"`
	ID           string `json:"id"`
	Name         string `json:"name"`
	Type         string `json:"type"`
	Value        string `json:"value"`
	Text         string `json:"text"`
	Checked      bool   `json:"checked"`
	Visible      bool   `json:"visible"`
	Outline      bool   `json:"outline"`
	OutlineDesc  string `json:"outlineDesc"`
	FocusVisible bool   `json:"focusVisible"`
}

func (f focusInfo) String() string {
	return f.Tag + "#" + f.ID + "[name=" + f.Name + " value=" + f.Value + "] " + strings.TrimSpace(f.Text)
}

func focused(t *testing.T, p *browsertest.Page) focusInfo {
	t.Helper()
	raw := browsertest.Eval[[]byte](t, p, `(() => {
	const el = document.activeElement;
	if (!el || el === document.body) return {tag: 'BODY'};
	const r = el.getBoundingClientRect();
	const cs = getComputedStyle(el);
	return {
		tag: el.tagName, id: el.id, name: el.getAttribute('name') || '', type: el.getAttribute('type') || '',
		value: el.value === undefined ? '' : String(el.value), text: (el.innerText || '').trim(), checked: !!el.checked,
		visible: r.width > 0 && r.height > 0 && r.bottom > 0 && r.right > 0 && r.top < innerHeight && r.left < innerWidth && cs.visibility !== 'hidden',
		outline: cs.outlineStyle !== 'none' && parseFloat(cs.outlineWidth) >= 2,
		outlineDesc: cs.outlineStyle + ' ' + cs.outlineWidth + ' ' + cs.outlineColor,
		focusVisible: el.matches(':focus-visible'),
	};
})()`)
	var f focusInfo
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatalf("focus: %v (%s)", err, raw)
	}
	return f
}

// press sends one key (kb.Tab, kb.Enter, " ", ...) with modifiers.
func press(t *testing.T, p *browsertest.Page, key string, mods ...chromedp.Modifier) {
	t.Helper()
	p.Do(t, chromedp.KeyEvent(key, chromedp.KeyModifiers(mods...)))
}

// tabTo presses Tab (Shift+Tab when back) until the focused element matches,
// at most 30 times, and checks that it is visible with a focus outline.
func tabTo(t *testing.T, p *browsertest.Page, what string, back bool, match func(focusInfo) bool) focusInfo {
	t.Helper()
	var mods []chromedp.Modifier
	if back {
		mods = append(mods, chromedp.ModifierShift)
	}
	var seen []string
	for range 30 {
		press(t, p, kb.Tab, mods...)
		f := focused(t, p)
		if match(f) {
			if !f.Visible || !f.Outline || !f.FocusVisible {
				t.Errorf("focused %s (%s): visible %v, outline %q, :focus-visible %v", what, f, f.Visible, f.OutlineDesc, f.FocusVisible)
			}
			return f
		}
		seen = append(seen, f.String())
	}
	t.Fatalf("Tab never reached %s; focus went to:\n%s", what, strings.Join(seen, "\n"))
	return focusInfo{}
}

// keyLoad presses a key that navigates and waits for the new page.
func keyLoad(t *testing.T, p *browsertest.Page, key string) (status int, path string) {
	t.Helper()
	resp := p.Load(t, chromedp.KeyEvent(key))
	return int(resp.Status), browserPath(t, p)
}

// skipToContent goes from the top of the page to the skip link, follows it
// and checks that focus lands on the main region.
func skipToContent(t *testing.T, p *browsertest.Page, back bool) {
	t.Helper()
	f := tabTo(t, p, "the skip link", back, func(f focusInfo) bool { return f.Tag == "A" && f.Text == "Skip to content" })
	if !f.Visible {
		t.Fatalf("the focused skip link is off screen")
	}
	press(t, p, kb.Enter)
	if got := focused(t, p); got.ID != "main" {
		t.Errorf("Skip to content moved focus to %s, want main", got)
	}
}

// TestBrowserKeyboardOnly: sign in, create a channel and create a webhook
// with key presses only (Tab, Shift+Tab, Enter, Space, typing), starting from
// "Skip to content"; every element reached shows a visible focus outline.
func TestBrowserKeyboardOnly(t *testing.T) {
	t.Parallel()
	e, b := newBrowserEnv(t)
	ctx := context.Background()
	p := b.NewPage(t)

	// Sign-in: the key field has autofocus; go back up to the skip link.
	p.Navigate(t, e.srv.URL+"/dashboard/login")
	skipToContent(t, p, true)
	tabTo(t, p, "the key field", false, func(f focusInfo) bool { return f.ID == "api_key" })
	press(t, p, e.key)
	status, path := keyLoad(t, p, kb.Enter)
	wantPage(t, status, path, http.StatusOK, "/dashboard/channels")

	// A channel.
	skipToContent(t, p, false)
	tabTo(t, p, "the channel name", false, func(f focusInfo) bool { return f.ID == "channel-name" })
	press(t, p, "Keyboard line")
	tabTo(t, p, "Create channel", false, func(f focusInfo) bool { return f.Tag == "BUTTON" && f.Text == "Create channel" })
	shot(t, p, "focus-button", "desktop")
	status, path = keyLoad(t, p, " ")
	wantPage(t, status, path, http.StatusOK, "/dashboard/channels")
	wantText(t, p, `.notice[role=status]`, "Channel created")
	list := channels(t, e)
	if len(list) != 1 || list[0].Name != "Keyboard line" {
		t.Fatalf("channels: %+v", list)
	}
	// The Copy link button is reachable too.
	tabTo(t, p, "Copy link", false, func(f focusInfo) bool { return f.Tag == "BUTTON" && f.Text == "Copy link" })

	// To Webhooks through the main navigation.
	p.Navigate(t, e.srv.URL+"/dashboard/channels")
	tabTo(t, p, "the Webhooks link", false, func(f focusInfo) bool { return f.Tag == "A" && f.Text == "Webhooks" })
	status, path = keyLoad(t, p, kb.Enter)
	wantPage(t, status, path, http.StatusOK, "/dashboard/webhooks")

	skipToContent(t, p, false)
	tabTo(t, p, "the webhook name", false, func(f focusInfo) bool { return f.ID == "wh-name" })
	press(t, p, "Keyboard hook")
	tabTo(t, p, "the webhook URL", false, func(f focusInfo) bool { return f.ID == "wh-url" })
	press(t, p, "https://kb.example.com/hook")
	tabTo(t, p, "the message_status box", false, func(f focusInfo) bool { return f.Name == "events" && f.Value == "message_status" })
	press(t, p, " ")
	if f := focused(t, p); f.Checked {
		t.Errorf("Space did not uncheck message_status")
	}
	tabTo(t, p, "the channel box", false, func(f focusInfo) bool { return f.Name == "channel_ids" })
	press(t, p, " ")
	if f := focused(t, p); !f.Checked {
		t.Errorf("Space did not check the channel")
	}
	shot(t, p, "focus-checkbox", "desktop")
	tabTo(t, p, "Create webhook", false, func(f focusInfo) bool { return f.Tag == "BUTTON" && f.Text == "Create webhook" })
	status, path = keyLoad(t, p, kb.Enter)
	wantPage(t, status, path, http.StatusCreated, "/dashboard/webhooks")
	wantText(t, p, "section.secret h2", "Keyboard hook")
	hooks := webhooks(t, e)
	if len(hooks) != 1 || hooks[0].URL != "https://kb.example.com/hook" || strings.Join(hooks[0].Events, ",") != "messages" ||
		len(hooks[0].ChannelIDs) != 1 || hooks[0].ChannelIDs[0] != list[0].ID {
		t.Fatalf("webhook: %+v", hooks)
	}
	// The secret's Copy button is reachable.
	tabTo(t, p, "Copy secret", false, func(f focusInfo) bool { return f.Tag == "BUTTON" && f.Text == "Copy secret" })
	if _, err := e.Store.WebhookSecret(ctx, hooks[0].ID); err != nil {
		t.Fatal(err)
	}
	p.AssertNoConsoleErrors(t)
}

// ---------------------------------------------------------------------------
// 9. Layout at 375 px and 1280 px
// ---------------------------------------------------------------------------

// overflow reports the document's scroll width and the elements sticking out
// past width.
func overflow(t *testing.T, p *browsertest.Page, width int) (int, []string) {
	t.Helper()
	raw := browsertest.Eval[[]byte](t, p, `(() => {
	const W = `+itoa(width)+`;
	const out = [];
	for (const el of document.querySelectorAll('body *')) {
		const r = el.getBoundingClientRect();
		if (r.right > W + 0.5 && r.width > 0) {
			out.push(el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + (el.className && el.className.baseVal === undefined ? '.' + el.className.split(' ').join('.') : '') + ' right=' + Math.round(r.right));
		}
	}
	return {w: document.documentElement.scrollWidth, out: out.slice(0, 12)};
})()`)
	var res struct {
		W   int      `json:"w"`
		Out []string `json:"out"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	return res.W, res.Out
}

// spills lists the elements sticking out of their card (or of main), outside
// scrolling containers (a wide table scrolls inside its own box by design).
func spills(t *testing.T, p *browsertest.Page) []string {
	t.Helper()
	return browsertest.Eval[[]string](t, p, `(() => {
	const out = [];
	const desc = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + (typeof el.className === 'string' && el.className ? '.' + el.className.split(' ').join('.') : '');
	for (const box of document.querySelectorAll('main, main .card')) {
		const b = box.getBoundingClientRect();
		for (const el of box.querySelectorAll('*')) {
			let clipped = false;
			for (let a = el.parentElement; a && a !== box; a = a.parentElement) {
				if (getComputedStyle(a).overflowX !== 'visible') { clipped = true; break; }
			}
			const r = el.getBoundingClientRect();
			if (clipped || r.width === 0 || getComputedStyle(el).position === 'absolute') continue;
			if (r.right > b.right + 0.5 || r.left < b.left - 0.5) {
				out.push(desc(el) + ' [' + Math.round(r.left) + ', ' + Math.round(r.right) + '] out of ' + desc(box) + ' [' + Math.round(b.left) + ', ' + Math.round(b.right) + ']');
			}
		}
	}
	return out.slice(0, 12);
})()`)
}

// badText lists SVG texts drawn stretched or squeezed (a non-uniform scale) or
// smaller than 10 px.
func badText(t *testing.T, p *browsertest.Page) []string {
	t.Helper()
	return browsertest.Eval[[]string](t, p, `(() => {
	const out = [];
	for (const el of document.querySelectorAll('svg text')) {
		const m = el.getScreenCTM();
		const size = parseFloat(getComputedStyle(el).fontSize) * Math.abs(m.d);
		if (Math.abs(m.a / m.d - 1) > 0.05 || size < 10) {
			out.push(JSON.stringify(el.textContent) + ' scale ' + m.a.toFixed(2) + '×' + m.d.toFixed(2) + ', ' + size.toFixed(1) + ' px');
		}
	}
	return out;
})()`)
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// viewport is a screen the layout is checked on.
type viewport struct {
	name   string
	width  int
	height int
	scale  float64
	mobile bool
}

// viewports are a 375 px phone and a 1280 px desktop.
var viewports = []viewport{
	{"mobile", 375, 812, 2, true},
	{"desktop", 1280, 900, 1, false},
}

// page opens a tab of b with v's screen.
func (v viewport) page(t *testing.T, b *browsertest.Browser) *browsertest.Page {
	t.Helper()
	p := b.NewPage(t)
	if _, err := chromedp.Call(p.Ctx, emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{
		Width: int64(v.width), Height: int64(v.height), DeviceScaleFactor: v.scale, Mobile: v.mobile,
	}); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkLayout fails unless the page shown fits v: no sideways scrolling, nothing out of its card,
// chart text neither distorted nor tiny; and saves its screenshot as name.
func checkLayout(t *testing.T, p *browsertest.Page, name string, v viewport) {
	t.Helper()
	if iw := browsertest.Eval[int](t, p, `window.innerWidth`); iw != v.width {
		t.Errorf("%s: viewport is %d px wide, want %d", name, iw, v.width)
	}
	if w, out := overflow(t, p, v.width); w > v.width {
		t.Errorf("%s: the page is %d px wide at %d px (scrolls sideways); sticking out: %s", name, w, v.width, strings.Join(out, ", "))
	}
	if out := spills(t, p); len(out) > 0 {
		t.Errorf("%s at %d px: out of their box:\n%s", name, v.width, strings.Join(out, "\n"))
	}
	if out := badText(t, p); len(out) > 0 {
		t.Errorf("%s at %d px: distorted or tiny chart text:\n%s", name, v.width, strings.Join(out, "\n"))
	}
	shot(t, p, name, v.name)
}

// TestBrowserLayout: every page, signed out and in (with a channel, a
// webhook, its deliveries, a new secret, a new key, the delete confirmation,
// an error page), fits a 375 px phone and a 1280 px desktop: no sideways
// scrolling, nothing out of its card, chart text neither distorted nor tiny;
// screenshots of each.
func TestBrowserLayout(t *testing.T) {
	t.Parallel()
	// Each screen has a dashboard and data of its own (the same), so the two run in parallel.
	for _, v := range viewports {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			e, b := newBrowserEnv(t, withConnectBase("https://relay.example.com"))
			support := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Support line"})
			sales := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Sales and after-sales service, Europe"})
			makeActive(t, e, sales.ID)
			wh, _ := e.Webhook(t, e.org.ID, "https://crm.example.com/hooks/whatsapp/inbound-messages-and-statuses",
				&testenv.WebhookOpts{Name: "CRM", Events: []string{"messages", "message_status"}, ChannelIDs: []uuid.UUID{support.ID}})
			seedDelivery(t, e, wh.ID, support.ID, "failed", 502, 1234,
				`{"error":{"message":"upstream_connect_error_or_disconnect_reset_before_headers_reset_reason_connection_failure","code":"BAD_GATEWAY"}}`)
			seedDelivery(t, e, wh.ID, support.ID, "delivered", 200, 35, `{"ok":true}`)
			e.APIKey(t, e.org.ID, &testenv.APIKeyOpts{Name: "ci-deploy-pipeline-production"})
			seedUsage(e, e.org.ID, sales.ID, 2, "authentication-international", "free_customer_service", "ZZ", 1234567, 1234567) // (dashboard/usage_test.go)

			p := v.page(t, b)
			check := func(name string) {
				t.Helper()
				checkLayout(t, p, name, v)
			}
			visit := func(name, path string, wantStatus int) {
				t.Helper()
				resp := p.Navigate(t, e.srv.URL+path)
				if int(resp.Status) != wantStatus {
					t.Fatalf("%s: HTTP %d, want %d", path, resp.Status, wantStatus)
				}
				check(name)
			}

			visit("login", "/dashboard/login", http.StatusOK)
			signIn(t, p, e, e.key)
			visit("channels", "/dashboard/channels", http.StatusOK)
			click(t, p, "#channel-"+sales.ID.String()+` form[action$="/delete"] button`)
			check("channels-confirm")
			visit("webhooks", "/dashboard/webhooks", http.StatusOK)
			p.Do(t, chromedp.SendKeys(chromedp.ID("wh-name"), "Layout "+v.name),
				chromedp.SendKeys(chromedp.ID("wh-url"), "https://example.com/"+v.name))
			if status, _ := click(t, p, `form[action$="/webhooks"] button[type=submit]`); status != http.StatusCreated {
				t.Fatalf("create webhook: HTTP %d", status)
			}
			check("webhooks-secret")
			visit("delivery-log", "/dashboard/webhooks/"+wh.ID.String(), http.StatusOK)
			visit("api-keys", "/dashboard/api-keys", http.StatusOK)
			p.Do(t, chromedp.SendKeys(chromedp.ID("key-name"), "layout-"+v.name))
			if status, _ := click(t, p, `form[action$="/api-keys"] button[type=submit]`); status != http.StatusCreated {
				t.Fatalf("create key: HTTP %d", status)
			}
			check("api-keys-created")
			visit("usage", "/dashboard/usage", http.StatusOK)
			visit("error", "/dashboard/no-such-page", http.StatusNotFound)
			p.AssertNoConsoleErrors(t, http.StatusNotFound, http.StatusConflict)
		})
	}
}
