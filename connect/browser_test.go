package connect_test

// Browser tests of the connect page in headless Chromium (internal/browsertest), served by the
// real connect.Handler over the test's store, with the fake upstream (internal/fakegraph) behind
// the completion and the stub SDK (testdata/stub-sdk.js) playing Embedded Signup:
//
//   - runConnectFlow(t, b, link, flowCase, expect) opens the link (GET /connect/<token> → 303 →
//     the token-free page), gives the stub SDK its configuration, clicks "Connect WhatsApp",
//     waits for the final state and hands a flowResult to expect, where the caller checks what
//     the server did.
//   - openConnectPage gives the same steps one by one (for a retry after an error, say).
//   - checkExpiredPage(t, b, link, screenshot) checks a 410 page.
//
// The page must load the stub as its SDK (Options.SDKURL) and accept messages from its own
// origin (Options.OriginSuffix = the page's host), because the stub posts the
// WA_EMBEDDED_SIGNUP message from the page's window. Screenshots: artifacts/connect-*.png.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/connect"
	"github.com/wabarelay/wabarelay/internal/browsertest"
	"github.com/wabarelay/wabarelay/store"
)

// stubConfig is handed to the stub SDK as window.__stubConfig (see the comment at the top of
// testdata/stub-sdk.js). Empty fields keep the stub's defaults.
type stubConfig struct {
	PhoneNumberID string `json:"pnid,omitempty"`
	WABAID        string `json:"waba,omitempty"`
	Code          string `json:"code,omitempty"`
	// Event is FINISH (default), FINISH_ONLY_WABA, CANCEL, CANCEL_ERROR, ERROR or NONE (the
	// login window closes with no message).
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
	// WantState is the final data-state of #connect-app: success, error or cancelled.
	WantState string
	// WantText are substrings that the status panel must show.
	WantText []string
	// PageShot and ResultShot, when set, are file names under the artifacts directory for
	// screenshots of the page before the click and in its final state.
	PageShot, ResultShot string
}

// flowResult is what the browser saw.
type flowResult struct {
	State      string         `json:"state"`      // final data-state of #connect-app
	StatusText string         `json:"statusText"` // text of the status panel
	FocusedID  string         `json:"focusedID"`  // id of the focused element at the end
	ButtonText string         `json:"buttonText"` // label of #connect-button ("" when hidden)
	InitOpts   map[string]any `json:"initOpts"`   // options of FB.init
	LoginOpts  map[string]any `json:"loginOpts"`  // options of FB.login
	LoginCalls int            `json:"loginCalls"`
	StubErrors []string       `json:"stubErrors"` // option problems the stub found
}

// runConnectFlow opens the connect link, clicks "Connect WhatsApp", waits for the final state,
// checks it against fc, the console (no errors, no CSP violations) and the login options, and
// calls expect (may be nil) with the result.
func runConnectFlow(t *testing.T, b *browsertest.Browser, link string, fc flowCase, expect func(t *testing.T, res flowResult)) {
	t.Helper()
	p := openConnectPage(t, b, link, fc.Stub)
	if fc.PageShot != "" {
		p.Screenshot(t, "", fc.PageShot)
	}
	p.clickConnect(t)
	res := p.waitFinal(t)
	if fc.ResultShot != "" {
		p.Screenshot(t, "", fc.ResultShot)
	}
	checkFlowResult(t, fc, res)
	p.AssertNoConsoleErrors(t)
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
	o := res.LoginOpts
	extras, _ := o["extras"].(map[string]any)
	if _, ok := extras["setup"].(map[string]any); o["config_id"] != configID || o["response_type"] != "code" ||
		o["override_default_response_type"] != true || !ok {
		t.Errorf("FB.login options = %v, want config_id %s, response_type code, override_default_response_type, extras.setup", o, configID)
	}
	if res.InitOpts["appId"] != appID || res.InitOpts["version"] != "v26.0" {
		t.Errorf("FB.init options = %v", res.InitOpts)
	}
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

// connectPage is a tab with the connect page open.
type connectPage struct{ *browsertest.Page }

// openConnectPage opens a tab, installs the stub configuration before any page script, opens
// the link and waits until the Connect button is shown and the SDK is initialised.
func openConnectPage(t *testing.T, b *browsertest.Browser, link string, stub stubConfig) connectPage {
	t.Helper()
	p := connectPage{b.NewPage(t)}
	p.AddInitScript(t, stubScript(t, stub))
	resp := p.Navigate(t, link)
	if resp.Status != http.StatusOK {
		t.Fatalf("open %s: HTTP %d, want 200", link, resp.Status)
	}
	// The token of a link must not stay in the page's URL: the server moves it into a cookie and
	// redirects (docs/connect.md, step 2).
	if u, err := url.Parse(link); err == nil && strings.Contains(resp.URL, strings.TrimPrefix(u.Path, "/connect/")) {
		t.Errorf("page URL %s still carries the link's token", resp.URL)
	}
	browsertest.Run(t, p.Page, chromedp.PollFunction[bool](`() => {
		const b = document.getElementById('connect-button');
		return !!(b && !b.hidden && window.FB && window.__fbInitOpts);
	}`))
	return p
}

func stubScript(t *testing.T, stub stubConfig) string {
	t.Helper()
	cfg, err := json.Marshal(stub)
	if err != nil {
		t.Fatal(err)
	}
	return "window.__stubConfig = " + string(cfg) + ";"
}

// setStub replaces the stub configuration in the open page (for a retry).
func (p connectPage) setStub(t *testing.T, stub stubConfig) {
	t.Helper()
	browsertest.Eval[any](t, p.Page, stubScript(t, stub))
}

// clickConnect clicks the primary button with a real mouse click.
func (p connectPage) clickConnect(t *testing.T) {
	t.Helper()
	p.Do(t, chromedp.Click(chromedp.ID("connect-button")))
}

// waitFinal waits for success, error or cancelled and reads the result.
func (p connectPage) waitFinal(t *testing.T) flowResult {
	t.Helper()
	browsertest.Run(t, p.Page, chromedp.PollFunction[string](`() => {
		const s = document.getElementById('connect-app').dataset.state;
		return ['success', 'error', 'cancelled'].includes(s) ? s : '';
	}`))
	b := browsertest.Eval[[]byte](t, p.Page, `(() => {
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
	})()`)
	var res flowResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("decode the page state %s: %v", b, err)
	}
	return res
}

// checkExpiredPage opens an unknown or expired link and checks the 410 page: status, wording,
// no channel details (leak names the strings that must not appear), no console errors apart
// from the 410 itself, and a screenshot.
func checkExpiredPage(t *testing.T, b *browsertest.Browser, link, shot string, leak ...string) {
	t.Helper()
	p := b.NewPage(t)
	resp := p.Navigate(t, link)
	if resp.Status != http.StatusGone || browsertest.Header(resp, "Referrer-Policy") != "no-referrer" {
		t.Errorf("expired link: HTTP %d, Referrer-Policy %q; want 410, no-referrer", resp.Status, browsertest.Header(resp, "Referrer-Policy"))
	}
	text := browsertest.Eval[string](t, p, `document.body.innerText`)
	for _, want := range []string{"invalid or has expired", "Ask the company that sent you this link for a new one"} {
		if !strings.Contains(text, want) {
			t.Errorf("expired page does not say %q:\n%s", want, text)
		}
	}
	html := browsertest.Eval[string](t, p, `document.documentElement.outerHTML`)
	for _, l := range leak {
		if l != "" && strings.Contains(html, l) {
			t.Errorf("expired page leaks %q", l)
		}
	}
	if shot != "" {
		p.Screenshot(t, "", shot)
	}
	p.AssertNoConsoleErrors(t, http.StatusGone)
}

// site is the real handler, twice (messages accepted from the page's own origin, and only from
// facebook.com), over one world, with the stub SDK and a browser.
type site struct {
	*world
	browser        *browsertest.Browser
	url, strictURL string

	mu    sync.Mutex
	posts []post
}

// post is a completion the page made.
type post struct {
	body   map[string]any
	cookie bool // it carried the link's cookie
}

func newSite(t *testing.T) *site {
	t.Helper()
	browsertest.ChromiumPath(t) // fails (or skips locally) before anything is started
	s := &site{world: newWorld(t, "")}
	sdk := httptest.NewServer(http.FileServer(http.Dir("testdata")))
	t.Cleanup(sdk.Close)
	opt := s.options()
	opt.SDKURL = sdk.URL + "/stub-sdk.js"
	opt.OriginSuffix = "127.0.0.1"
	s.url = s.serve(opt)
	opt.OriginSuffix = "" // facebook.com: the stub's messages are ignored
	s.strictURL = s.serve(opt)
	s.browser = browsertest.Shared(t)
	return s
}

// serve starts the handler of opt behind a recorder of the page's completions.
func (s *site) serve(opt connect.Options) string {
	h := s.handler(opt)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/connect/complete" {
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			p := post{}
			_ = json.Unmarshal(b, &p.body)
			_, err := r.Cookie(connect.CookieName)
			p.cookie = err == nil
			s.mu.Lock()
			s.posts = append(s.posts, p)
			s.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	s.t.Cleanup(srv.Close)
	return srv.URL
}

// link is a new pending channel's connect link on base, and the channel.
func (s *site) link(base string) (string, store.Channel) {
	s.mu.Lock()
	s.posts = nil
	s.mu.Unlock()
	c := s.channel()
	return base + "/connect/" + c.ChannelToken, c
}

// signup adds a number (display may be "") to the fake upstream and returns a code of an
// Embedded Signup that chose it, valid for ttl.
func (s *site) signup(pnid, waba, display string, ttl time.Duration) string {
	s.fake.AddNumber(pnid, waba, display, "Acme Support")
	token, code := "EAAG"+uuid.NewString(), "code-"+uuid.NewString()
	s.fake.AddToken(token, []string{pnid}, []string{waba})
	s.fake.AddCode(code, token, ttl)
	return code
}

func (s *site) recorded() []post {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]post(nil), s.posts...)
}

// expectConnected checks the page's completions (the last with code, all with the cookie and
// exactly {code, phone_number_id, waba_id}) and that the channel is active with that number.
func (s *site) expectConnected(t *testing.T, c store.Channel, posts int, code, pnid, waba string) {
	t.Helper()
	got := s.recorded()
	if len(got) != posts {
		t.Fatalf("%d POSTs, want %d: %v", len(got), posts, got)
	}
	want := map[string]any{"code": code, "phone_number_id": pnid, "waba_id": waba}
	if last := got[len(got)-1]; !maps.Equal(last.body, want) {
		t.Errorf("POST body = %v, want %v", last.body, want)
	}
	for _, p := range got {
		if !p.cookie {
			t.Errorf("POST came without the link's cookie")
		}
	}
	if ch := s.get(c.ID); ch.Status != "active" || ch.PhoneNumberID == nil || *ch.PhoneNumberID != pnid || ch.WabaID == nil || *ch.WabaID != waba {
		t.Errorf("channel after the flow: %+v", ch)
	}
}

// expectNothingPosted checks that the page posted nothing and the channel is still pending.
func (s *site) expectNothingPosted(t *testing.T, c store.Channel) {
	t.Helper()
	if got := s.recorded(); len(got) != 0 {
		t.Errorf("the page posted %v, want no POST", got)
	}
	if ch := s.get(c.ID); ch.Status != "pending" {
		t.Errorf("channel is %s, want pending", ch.Status)
	}
}

func TestBrowserConnectFlow(t *testing.T) {
	t.Parallel()
	// Each case has a site of its own (database, fake upstream, servers, recorded completions) in
	// the shared browser, so the cases run in parallel.
	// cancelled runs a flow the page ends without posting anything.
	cancelled := func(fc flowCase, expect func(t *testing.T, res flowResult)) func(t *testing.T) {
		return func(t *testing.T) {
			t.Parallel()
			s := newSite(t)
			b := s.browser
			link, c := s.link(s.url)
			runConnectFlow(t, b, link, fc, func(t *testing.T, res flowResult) {
				s.expectNothingPosted(t, c)
				if expect != nil {
					expect(t, res)
				}
			})
		}
	}

	t.Run("success/message-first", func(t *testing.T) {
		t.Parallel()
		s := newSite(t)
		b := s.browser
		link, c := s.link(s.url)
		code := s.signup("1001", "2001", "+1 555 0100", 0)
		runConnectFlow(t, b, link, flowCase{
			Stub:       stubConfig{PhoneNumberID: "1001", WABAID: "2001", Code: code},
			WantState:  "success",
			WantText:   []string{"WhatsApp is connected", "+1 555 0100", "Support line"},
			PageShot:   "connect-page.png",
			ResultShot: "connect-success.png",
		}, func(t *testing.T, res flowResult) {
			s.expectConnected(t, c, 1, code, "1001", "2001")
			if res.ButtonText != "" {
				t.Errorf("button still shown after success: %q", res.ButtonText)
			}
		})
	})

	t.Run("success/callback-first", func(t *testing.T) {
		t.Parallel()
		s := newSite(t)
		b := s.browser
		link, c := s.link(s.url)
		code := s.signup("1002", "2002", "", 0) // no display number: the page says "your number"
		runConnectFlow(t, b, link, flowCase{
			Stub:      stubConfig{PhoneNumberID: "1002", WABAID: "2002", Code: code, Order: "callback-first"},
			WantState: "success",
			WantText:  []string{"WhatsApp is connected", "Your WhatsApp Business number is now connected"},
		}, func(t *testing.T, res flowResult) { s.expectConnected(t, c, 1, code, "1002", "2002") })
	})

	t.Run("upstream-502-then-retry", func(t *testing.T) {
		t.Parallel()
		s := newSite(t)
		b := s.browser
		link, c := s.link(s.url)
		old := s.signup("1003", "2003", "+1 555 0103", time.Nanosecond) // expired when exchanged
		p := openConnectPage(t, b, link, stubConfig{PhoneNumberID: "1003", WABAID: "2003", Code: old})
		p.clickConnect(t)
		res := p.waitFinal(t)
		p.Screenshot(t, "", "connect-error.png")
		checkFlowResult(t, flowCase{WantState: "error", WantText: []string{"This authorization code has expired."}}, res)
		if res.ButtonText != "Try again" {
			t.Errorf("button after an error = %q, want Try again", res.ButtonText)
		}
		p.AssertNoConsoleErrors(t, http.StatusBadGateway) // the 502 itself is logged
		if ch := s.get(c.ID); ch.Status != "pending" {
			t.Errorf("channel after the refusal: %s, want pending", ch.Status)
		}

		// Try again: a new signup with a fresh code, and the upstream agrees.
		code := s.signup("1003", "2003", "+1 555 0103", 0)
		p.setStub(t, stubConfig{PhoneNumberID: "1003", WABAID: "2003", Code: code})
		p.clickConnect(t)
		res = p.waitFinal(t)
		checkFlowResult(t, flowCase{WantState: "success", WantText: []string{"+1 555 0103"}}, res)
		if res.LoginCalls != 2 {
			t.Errorf("FB.login calls = %d, want 2", res.LoginCalls)
		}
		s.expectConnected(t, c, 2, code, "1003", "2003")
	})

	t.Run("cancel", cancelled(flowCase{
		Stub:       stubConfig{Event: "CANCEL", Step: "PHONE_NUMBER_SETUP"},
		WantState:  "cancelled",
		WantText:   []string{"You closed the signup at step", "Phone number setup", "you can try again"},
		ResultShot: "connect-cancel.png",
	}, func(t *testing.T, res flowResult) {
		if res.ButtonText != "Try again" {
			t.Errorf("button after cancel = %q, want Try again", res.ButtonText)
		}
	}))

	t.Run("error-event", cancelled(flowCase{
		Stub:      stubConfig{Event: "ERROR", ErrorMessage: "Your business is not eligible", ErrorCode: "2593"},
		WantState: "error",
		WantText:  []string{"Your business is not eligible", "Error code 2593"},
	}, nil))

	t.Run("cancel-with-error-message", cancelled(flowCase{
		Stub:      stubConfig{Event: "CANCEL_ERROR", ErrorMessage: "The phone number is already registered"},
		WantState: "error",
		WantText:  []string{"The phone number is already registered"},
	}, nil))

	t.Run("window-closed-without-code", cancelled(flowCase{
		Stub:      stubConfig{Event: "NONE"},
		WantState: "cancelled",
		WantText:  []string{"closed before the signup finished"},
	}, nil))

	t.Run("finish-without-phone-number", cancelled(flowCase{
		Stub:      stubConfig{Event: "FINISH_ONLY_WABA"},
		WantState: "error",
		WantText:  []string{"without a WhatsApp phone number"},
	}, nil))

	t.Run("message-from-other-origin-ignored", func(t *testing.T) {
		t.Parallel()
		s := newSite(t)
		b := s.browser
		link, c := s.link(s.strictURL) // the page accepts only *.facebook.com
		p := openConnectPage(t, b, link, stubConfig{PhoneNumberID: "1009", WABAID: "2009", Code: s.signup("1009", "2009", "", 0)})
		p.clickConnect(t)
		// The stub posts FINISH, then hands over the code: had the page taken the message, the
		// code would submit; having ignored it, the page waits for the number.
		title := browsertest.Run(t, p.Page, chromedp.PollFunction[string](`() => {
			const s = document.getElementById('connect-app').dataset.state;
			const t = document.getElementById('status').innerText;
			return t.includes('Almost done') || !['loading', 'waiting', 'idle'].includes(s) ? s + ': ' + t : '';
		}`))
		if !strings.HasPrefix(title, "waiting: Almost done") {
			t.Errorf("after a FINISH from a foreign origin: %q, want waiting for the number", title)
		}
		s.expectNothingPosted(t, c)
		p.AssertNoConsoleErrors(t)
	})

	t.Run("mobile-layout", func(t *testing.T) {
		t.Parallel()
		s := newSite(t)
		b := s.browser
		link, _ := s.link(s.url)
		p := openConnectPage(t, b, link, stubConfig{})
		p.Do(t, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile))
		if browsertest.Eval[bool](t, p.Page, `document.documentElement.scrollWidth > window.innerWidth`) {
			t.Errorf("the page scrolls sideways at 390 px")
		}
		p.Screenshot(t, "", "connect-page-mobile.png")
		p.AssertNoConsoleErrors(t)
	})

	t.Run("dark-mode", func(t *testing.T) {
		t.Parallel()
		s := newSite(t)
		b := s.browser
		link, _ := s.link(s.url)
		p := openConnectPage(t, b, link, stubConfig{Event: "CANCEL", Step: "WABA_SETUP"})
		if _, err := chromedp.Call(p.Ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}},
		}); err != nil {
			t.Fatal(err)
		}
		p.clickConnect(t)
		checkFlowResult(t, flowCase{WantState: "cancelled", WantText: []string{"WhatsApp Business account setup"}}, p.waitFinal(t))
		p.Screenshot(t, "", "connect-dark.png")
		p.AssertNoConsoleErrors(t)
	})
}

// TestBrowserNoScript: without JavaScript the page says so and shows no dead button.
func TestBrowserNoScript(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	link, _ := s.link(s.url)
	p := s.browser.NewPage(t)
	if _, err := chromedp.Call(p.Ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true}); err != nil {
		t.Fatal(err)
	}
	if resp := p.Navigate(t, link); resp.Status != http.StatusOK {
		t.Fatalf("page without JavaScript: HTTP %d", resp.Status)
	}
	visible := browsertest.Eval[bool](t, p, `(() => {
		const n = document.getElementById('noscript-message');
		const b = document.getElementById('connect-button');
		return !!n && n.offsetParent !== null && b.offsetParent === null;
	})()`)
	if !visible {
		t.Errorf("without JavaScript: want the noscript message shown and the button hidden")
	}
}

func TestBrowserExpiredPage(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	s.channel() // a channel whose name must not show
	checkExpiredPage(t, s.browser, s.url+"/connect/tok_unknown_0000", "connect-expired.png", "Support line", appID, configID)
	// The token-free page without the cookie is the same 410.
	checkExpiredPage(t, s.browser, s.url+"/connect/", "", "Support line")
	// So is a link whose time is up.
	link, c := s.link(s.url)
	if _, err := s.Pool.Exec(context.Background(), `UPDATE channels SET token_expires_at = now() - interval '1 second' WHERE id = $1`, c.ID); err != nil {
		t.Fatal(err)
	}
	checkExpiredPage(t, s.browser, link, "", "Support line", appID, configID)
}
