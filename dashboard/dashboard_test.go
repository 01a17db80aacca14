package dashboard_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/dashboard"
	"github.com/wabarelay/wabarelay/dispatcher"
	"github.com/wabarelay/wabarelay/internal/authguard"
	"github.com/wabarelay/wabarelay/internal/browsertest"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/store"
)

// TestMain stops the browser the browser tests share after the tests.
func TestMain(m *testing.M) { testenv.Main(m, browsertest.StopShared) }

// env is a dashboard over a fresh database (the kit's fixture), served by an httptest server,
// with one org and key.
type env struct {
	*testenv.Fixture
	t      *testing.T
	srv    *httptest.Server
	org    store.Org
	key    string
	keyRec store.APIKey
	// api is the management API the dashboard calls (sharing its AuthGuard), unless an option
	// gave the dashboard another.
	api *managementapi.Handler
	// dash is the dashboard handler, for requests made without a server (e.g. over "HTTPS").
	dash *dashboard.Handler
	// queries counts the statements the pool ran.
	queries *queryCounter
}

// queryCounter is a pgx tracer counting the statements run through the pool.
type queryCounter struct{ n atomic.Int64 }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// envOptions adjust the dashboard before it starts.
type envOption func(*dashboard.Options)

// withConnectBase gives the dashboard a management API whose connect links start with base.
func withConnectBase(base string) envOption {
	return func(o *dashboard.Options) {
		o.API = managementapi.New(managementapi.Options{Store: o.Store, ConnectBase: base, AuthGuard: o.AuthGuard}).Service()
	}
}

func newEnv(t *testing.T, opts ...envOption) *env {
	t.Helper()
	queries := &queryCounter{}
	f := testenv.NewStore(t, &testenv.StoreOpts{Pool: func(c *pgxpool.Config) { c.ConnConfig.Tracer = queries }})
	e := &env{Fixture: f, t: t, queries: queries}
	e.org = f.Org(t, &testenv.OrgOpts{Name: "Acme"})
	e.keyRec, e.key = f.APIKey(t, e.org.ID, &testenv.APIKeyOpts{Name: "ops"})
	opt := dashboard.Options{Store: f.Store}
	for _, o := range opts {
		o(&opt)
	}
	e.api = managementapi.New(managementapi.Options{Store: f.Store, AuthGuard: opt.AuthGuard})
	if opt.API == nil {
		opt.API = e.api.Service()
	}
	var h http.Handler
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) })
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	d, err := dashboard.New(opt)
	if err != nil {
		t.Fatal(err)
	}
	h, e.dash = d, d
	return e
}

// client is a browser-like client: a cookie jar, redirects followed.
type client struct {
	e    *env
	http *http.Client
}

func (e *env) client() *client {
	jar, _ := cookiejar.New(nil)
	return &client{e: e, http: &http.Client{Jar: jar, Timeout: 30 * time.Second}}
}

type answer struct {
	status int
	header http.Header
	body   string
	url    string
}

func (c *client) do(req *http.Request) answer {
	c.e.t.Helper()
	resp, err := c.http.Do(req)
	if err != nil {
		c.e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.e.t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: string(b), url: resp.Request.URL.Path}
	return a
}

func (c *client) get(path string) answer {
	c.e.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.e.srv.URL+path, nil)
	return c.do(req)
}

// post submits a form as the dashboard's own page does: from the dashboard's origin.
func (c *client) post(path string, form url.Values) answer {
	c.e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.e.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", c.e.srv.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	return c.do(req)
}

func (c *client) signIn(key string) answer {
	c.e.t.Helper()
	c.get("/dashboard/login")
	return c.post("/dashboard/login", url.Values{"api_key": {key}})
}

func wantStatus(t *testing.T, a answer, status int, contains ...string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("%s: status %d, want %d; body:\n%s", a.url, a.status, status, a.body)
	}
	for _, s := range contains {
		if !strings.Contains(a.body, s) {
			t.Fatalf("%s: body lacks %q:\n%s", a.url, s, a.body)
		}
	}
}

// seedDelivery inserts an event, a delivery of it to webhook wh with the given
// status and one attempt (code, latency, response body) five minutes ago.
func seedDelivery(t *testing.T, e *env, wh, ch uuid.UUID, status string, code, ms int, body string) uuid.UUID {
	t.Helper()
	evID, delID, attID := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	e.Exec(t, `INSERT INTO events (id, org_id, channel_id, type, dedupe_key, payload)
		VALUES ($1, $2, $3, 'messages', $4, '{}')`, evID, e.org.ID, ch, evID.String())
	e.Exec(t, `INSERT INTO deliveries (id, event_id, webhook_id, status, attempts, last_status_code, created_at)
		VALUES ($1, $2, $3, $4, 1, $5, (SELECT created_at FROM events WHERE id = $2))`, delID, evID, wh, status, code)
	e.Exec(t, `INSERT INTO delivery_attempts (id, delivery_id, attempt, started_at, duration_ms, status_code, response_body)
		VALUES ($1, $2, 1, now() - interval '5 minutes', $3, $4, $5)`, attID, delID, ms, code, body)
	return delID
}

func deliveryStatus(t *testing.T, e *env, id uuid.UUID) string {
	t.Helper()
	return testenv.QueryValue[string](t, e.Fixture, `SELECT status FROM deliveries WHERE id = $1`, id)
}

// makeActive turns a channel into a connected one, as Embedded Signup would.
func makeActive(t *testing.T, e *env, id uuid.UUID) {
	t.Helper()
	e.Exec(t, `UPDATE channels SET status = 'active', phone_number_id = '1001', waba_id = '2001',
		display_phone_number = '+1 555 0100', connected_at = now(), token_expires_at = NULL WHERE id = $1`, id)
}

func TestSignInAndOut(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	a := c.get("/dashboard/")
	wantStatus(t, a, http.StatusOK, "API key of your organization")
	if a.url != "/dashboard/login" {
		t.Fatalf("anonymous / went to %s", a.url)
	}
	if csp := a.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Fatalf("CSP = %q", csp)
	}

	wantStatus(t, c.signIn("crt_pk_nope"), http.StatusUnauthorized, managementapi.MsgKeyInvalid)

	// The session cookie's attributes, read off the raw answer.
	c.get("/dashboard/login")
	form := url.Values{"api_key": {e.key}}
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/dashboard/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, ck := range c.http.Jar.Cookies(req.URL) {
		req.AddCookie(ck)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in: %d", resp.StatusCode)
	}
	var session *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == "wabarelay_dashboard" {
			session = ck
		}
	}
	if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteStrictMode || session.Path != "/dashboard" || session.Secure {
		t.Fatalf("session cookie = %+v", session)
	}
	if strings.Contains(session.Value, e.key) {
		t.Fatal("the cookie carries the API key")
	}

	a = c.post("/dashboard/login", url.Values{"api_key": {e.key}})
	wantStatus(t, a, http.StatusOK, "New channel", "ops")
	if a.url != "/dashboard/channels" {
		t.Fatalf("after sign-in: %s", a.url)
	}
	var live string
	u, _ := url.Parse(e.srv.URL + "/dashboard/")
	for _, ck := range c.http.Jar.Cookies(u) {
		if ck.Name == "wabarelay_dashboard" {
			live = ck.Value
		}
	}
	if _, err := e.Store.DashboardSession(context.Background(), live); err != nil {
		t.Fatalf("live session: %v", err)
	}
	a = c.post("/dashboard/logout", nil)
	wantStatus(t, a, http.StatusOK, "Signed out.")
	a = c.get("/dashboard/channels")
	if a.url != "/dashboard/login" {
		t.Fatalf("after sign-out /channels went to %s", a.url)
	}
	// The signed-out cookie value is dead on the server too (a replayed cookie gets nothing).
	if _, err := e.Store.DashboardSession(context.Background(), live); err != store.ErrNoSession {
		t.Fatalf("session after sign-out: %v", err)
	}
}

func TestRevokedKeyEndsSession(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	wantStatus(t, c.signIn(e.key), http.StatusOK, "New channel")
	if _, err := e.Store.RevokeAPIKey(context.Background(), e.keyRec.ID); err != nil {
		t.Fatal(err)
	}
	a := c.get("/dashboard/channels")
	if a.url != "/dashboard/login" {
		t.Fatalf("with a revoked key /channels served %s", a.url)
	}
	// An expired key ends its sessions too.
	k, key := e.APIKey(t, e.org.ID, &testenv.APIKeyOpts{Name: "short"})
	c2 := e.client()
	wantStatus(t, c2.signIn(key), http.StatusOK, "New channel")
	e.Exec(t, `UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE id = $1`, k.ID)
	if a := c2.get("/dashboard/webhooks"); a.url != "/dashboard/login" {
		t.Fatalf("with an expired key /webhooks served %s", a.url)
	}
}

// crossPost posts a form with the given request headers (no cookie jar redirects followed).
func (c *client) crossPost(path string, form url.Values, hdr map[string]string) answer {
	c.e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.e.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return c.do(req)
}

// TestCrossOriginRefused: every state-changing request, sign-in included, must come from the
// dashboard's own origin; with SameSite=Strict cookies that is the whole defence (no per-form
// tokens). A forged sign-in cookie and a matching form token (the old login-CSRF defence) buy
// nothing.
func TestCrossOriginRefused(t *testing.T) {
	e := newEnv(t)
	refusals := []struct {
		name string
		hdr  map[string]string
	}{
		{"Origin null", map[string]string{"Origin": "null"}},
		{"Origin null, same-origin fetch metadata", map[string]string{"Origin": "null", "Sec-Fetch-Site": "same-origin"}},
		{"foreign Origin", map[string]string{"Origin": "https://evil.example"}},
		{"Origin of another port", map[string]string{"Origin": "http://127.0.0.1:1"}},
		{"Sec-Fetch-Site cross-site", map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"Sec-Fetch-Site same-site", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "https://sub.example"}},
	}
	ctx := context.Background()
	// Sign-in: a session for the attacker's key must not start in the victim's browser.
	for _, r := range refusals {
		c := e.client()
		u, _ := url.Parse(e.srv.URL + "/dashboard/")
		c.http.Jar.SetCookies(u, []*http.Cookie{{Name: "wabarelay_dashboard_signin", Value: "forged", Path: "/dashboard"}})
		a := c.crossPost("/dashboard/login", url.Values{"api_key": {e.key}, "csrf": {"forged"}}, r.hdr)
		if a.status != http.StatusForbidden {
			t.Errorf("sign-in with %s: status %d, want 403", r.name, a.status)
		}
		for _, ck := range c.http.Jar.Cookies(u) {
			if strings.HasSuffix(ck.Name, "wabarelay_dashboard") {
				t.Errorf("sign-in with %s set the session cookie", r.name)
			}
		}
	}
	if n := e.Count(t, "dashboard_sessions"); n != 0 {
		t.Fatalf("%d sessions after refused sign-ins", n)
	}
	// Sign-in from the dashboard's own origin, and from a client that is not a browser (no
	// Origin, no Sec-Fetch-Site), works.
	c := e.client()
	a := c.crossPost("/dashboard/login", url.Values{"api_key": {e.key}}, map[string]string{"Origin": e.srv.URL, "Sec-Fetch-Site": "same-origin"})
	wantStatus(t, a, http.StatusOK, "New channel")
	wantStatus(t, e.client().crossPost("/dashboard/login", url.Values{"api_key": {e.key}}, nil), http.StatusOK, "New channel")

	// Signed in: every form post.
	for _, r := range refusals {
		wantStatus(t, c.crossPost("/dashboard/channels", url.Values{"name": {"Forged"}}, r.hdr), http.StatusForbidden, "did not come from this dashboard")
		wantStatus(t, c.crossPost("/dashboard/logout", nil, r.hdr), http.StatusForbidden)
	}
	chans, err := e.Store.ListChannels(ctx, e.org.ID)
	if err != nil || len(chans) != 0 {
		t.Fatalf("channels after refused forms: %v %v", chans, err)
	}
	// A huge form is not read.
	if a := c.post("/dashboard/channels", url.Values{"name": {strings.Repeat("x", 100<<10)}}); a.status < 400 || a.status >= 500 {
		t.Fatalf("huge form: %d", a.status)
	}
	wantStatus(t, c.post("/dashboard/channels", url.Values{"name": {"D"}}), http.StatusOK, "Channel created")
	wantStatus(t, c.crossPost("/dashboard/channels", url.Values{"name": {"E"}}, map[string]string{"Origin": e.srv.URL}), http.StatusOK, "Channel created")
	if a := c.get("/dashboard/channels"); a.header.Get("Referrer-Policy") != "same-origin" {
		t.Fatalf("Referrer-Policy = %q", a.header.Get("Referrer-Policy"))
	}
}

// TestCookieNamesOverHTTPS: over HTTPS the session cookie is Secure and named with the
// __Secure- prefix (and only that name is read); over http it keeps its plain name.
func TestCookieNamesOverHTTPS(t *testing.T) {
	e := newEnv(t)
	serve := func(req *http.Request) *http.Response {
		rec := httptest.NewRecorder()
		e.dash.ServeHTTP(rec, req)
		return rec.Result()
	}
	form := url.Values{"api_key": {e.key}}.Encode()
	req := httptest.NewRequest(http.MethodPost, "https://dash.example/dashboard/login", strings.NewReader(form))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://dash.example")
	resp := serve(req)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in over HTTPS: %d", resp.StatusCode)
	}
	cks := resp.Cookies()
	if len(cks) != 1 || cks[0].Name != "__Secure-wabarelay_dashboard" || !cks[0].Secure || !cks[0].HttpOnly ||
		cks[0].SameSite != http.SameSiteStrictMode || cks[0].Path != "/dashboard" {
		t.Fatalf("cookies over HTTPS = %+v", cks)
	}
	get := func(name string) int {
		req := httptest.NewRequest(http.MethodGet, "https://dash.example/dashboard/channels", nil)
		req.AddCookie(&http.Cookie{Name: name, Value: cks[0].Value})
		return serve(req).StatusCode
	}
	if s := get("__Secure-wabarelay_dashboard"); s != http.StatusOK {
		t.Fatalf("page with the __Secure- cookie: %d", s)
	}
	if s := get("wabarelay_dashboard"); s != http.StatusSeeOther {
		t.Fatalf("page over HTTPS with the unprefixed cookie: %d, want a redirect to sign-in", s)
	}
	// Plain http (make run on localhost) keeps the plain name, not Secure.
	req = httptest.NewRequest(http.MethodPost, "http://localhost/dashboard/login", strings.NewReader(form))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp = serve(req)
	if cks := resp.Cookies(); resp.StatusCode != http.StatusSeeOther || len(cks) != 1 || cks[0].Name != "wabarelay_dashboard" || cks[0].Secure {
		t.Fatalf("sign-in over http: %d, cookies %+v", resp.StatusCode, cks)
	}
}

// noRedirects is a client that returns redirects as they are.
var noRedirects = &http.Client{Timeout: 30 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// TestGarbageSessionCookiesAreGuarded: a session cookie that names no live session is an
// authentication failure of the client address; after 20 the address gets 429 before any
// lookup, so 200 guessed cookies cost about 20 queries.
func TestGarbageSessionCookiesAreGuarded(t *testing.T) {
	e := newEnv(t, func(o *dashboard.Options) { o.AuthGuard = authguard.New(20, time.Minute, 100) })
	before := e.queries.n.Load()
	statuses := map[int]int{}
	for i := 0; i < 200; i++ {
		v := store.NewChannelToken() // well-formed: 32 random bytes, base64url
		if i%10 == 9 {
			v = "malformed"
		}
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/dashboard/webhooks", nil)
		req.AddCookie(&http.Cookie{Name: "wabarelay_dashboard", Value: v})
		resp, err := noRedirects.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		statuses[resp.StatusCode]++
		if i >= 20 {
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("cookie %d: status %d, Retry-After %q; want 429 with Retry-After", i+1, resp.StatusCode, resp.Header.Get("Retry-After"))
			}
		} else if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("cookie %d: status %d, want a redirect to sign-in", i+1, resp.StatusCode)
		}
	}
	if n := e.queries.n.Load() - before; n > 20 {
		t.Fatalf("200 garbage cookies cost %d queries, want at most 20 (statuses %v)", n, statuses)
	}
	// Another address is unaffected; the refused address cannot sign in either.
	c := e.client()
	a := c.post("/dashboard/login", url.Values{"api_key": {e.key}})
	wantStatus(t, a, http.StatusTooManyRequests)
	other := httptest.NewRequest(http.MethodGet, "http://dash.example/dashboard/login", nil)
	other.RemoteAddr = "192.0.2.1:1234"
	rec := httptest.NewRecorder()
	e.dash.ServeHTTP(rec, other)
	if rec.Code != http.StatusOK {
		t.Fatalf("another address: %d", rec.Code)
	}
}

// TestPageReadsRateLimited: the sign-in and each page load count against the signed-in key's
// management rate limit, the same budget its API calls use; over it a page is 429 with
// Retry-After.
func TestPageReadsRateLimited(t *testing.T) {
	rdb := testenv.RedisClient(t, testenv.Redis(t))
	const limit = 6
	lim := ratelimit.NewRedis(rdb, limit, time.Hour, "test:"+uuid.NewString()+":")
	var api *managementapi.Handler // the management API, its rate limit the dashboard's
	e := newEnv(t, func(o *dashboard.Options) {
		api = managementapi.New(managementapi.Options{Store: o.Store, Limiter: lim})
		o.API = api.Service()
	})
	c := e.client()
	wantStatus(t, c.signIn(e.key), http.StatusOK, "New channel") // sign-in and GET /channels: 2
	pages := []string{"/dashboard/webhooks", "/dashboard/api-keys", "/dashboard/channels"}
	n := 2
	for ; n < limit; n++ {
		wantStatus(t, c.get(pages[n%len(pages)]), http.StatusOK)
	}
	for _, p := range []string{"/dashboard/webhooks", "/dashboard/api-keys", "/dashboard/channels"} {
		a := c.get(p)
		wantStatus(t, a, http.StatusTooManyRequests, "Rate limit exceeded")
		if ra := a.header.Get("Retry-After"); ra == "" || ra == "0" {
			t.Fatalf("%s: Retry-After = %q", p, ra)
		}
		if rem := a.header.Get("RateLimit-Remaining"); rem != "0" {
			t.Fatalf("%s: RateLimit-Remaining = %q", p, rem)
		}
	}
	// The API's budget for that key is the same one: spent.
	req := httptest.NewRequest(http.MethodGet, "/channels", nil)
	req.Header.Set("X-Api-Key", e.key)
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, req)
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("API call after the pages spent the budget: %d", rec.Code)
	}
	// Another key has its own budget.
	_, key2 := e.APIKey(t, e.org.ID, &testenv.APIKeyOpts{Name: "other"})
	wantStatus(t, e.client().signIn(key2), http.StatusOK, "New channel")
}

func TestChannelsPage(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	c.signIn(e.key)
	a := c.post("/dashboard/channels", url.Values{"name": {"Support line"}})
	wantStatus(t, a, http.StatusOK, "Channel created", "Support line", "/connect/", `<svg class="qr"`, "Copy link")
	// The API's own checks and messages.
	wantStatus(t, c.post("/dashboard/channels", url.Values{"name": {"bad\x00name"}}), http.StatusUnprocessableEntity,
		"must be valid UTF-8 text without NUL characters")
	wantStatus(t, c.post("/dashboard/channels", url.Values{"name": {""}}), http.StatusUnprocessableEntity)

	// An active channel needs a confirmation to be deleted.
	ctx := context.Background()
	chans, _ := e.Store.ListChannels(ctx, e.org.ID)
	ch := chans[0]
	makeActive(t, e, ch.ID)
	a = c.post("/dashboard/channels/"+ch.ID.String()+"/delete", nil)
	wantStatus(t, a, http.StatusConflict, managementapi.MsgChannelActive, "Delete it anyway")
	a = c.post("/dashboard/channels/"+ch.ID.String()+"/delete", url.Values{"force": {"true"}})
	wantStatus(t, a, http.StatusOK, "Channel deleted.")
	if chans, _ := e.Store.ListChannels(ctx, e.org.ID); len(chans) != 0 {
		t.Fatalf("channels left: %d", len(chans))
	}
	// Another org's channel is not found.
	och := e.Channel(t, e.Org(t, &testenv.OrgOpts{Name: "Other"}).ID, &testenv.ChannelOpts{Name: "theirs"})
	wantStatus(t, c.post("/dashboard/channels/"+och.ID.String()+"/delete", nil), http.StatusNotFound, managementapi.MsgChannelNotFound)
	if strings.Contains(c.get("/dashboard/channels").body, "theirs") {
		t.Fatal("another org's channel is listed")
	}
}

func TestWebhooksAndDeliveryLog(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	c.signIn(e.key)
	ctx := context.Background()
	a := c.post("/dashboard/webhooks", url.Values{"name": {"CRM"}, "url": {"https://crm.example.com/hook"}, "events": {"messages"}})
	wantStatus(t, a, http.StatusCreated, "Signing secret of", store.SecretPrefix)
	secret := regexp.MustCompile(`value="(whsec_[^"]+)"`).FindStringSubmatch(a.body)
	if secret == nil {
		t.Fatal("no secret shown")
	}
	if strings.Contains(c.get("/dashboard/webhooks").body, secret[1]) {
		t.Fatal("the secret is shown again")
	}
	wantStatus(t, c.post("/dashboard/webhooks", url.Values{"name": {"x"}, "url": {"http://plain.example"}, "events": {"messages"}}),
		http.StatusUnprocessableEntity, "must start with https://")

	hooks, _ := e.Store.ListWebhooks(ctx, e.org.ID)
	wh := hooks[0]
	wantStatus(t, c.post("/dashboard/webhooks/"+wh.ID.String()+"/status", url.Values{"status": {"paused"}}), http.StatusOK, "Webhook updated.")
	if got, _ := e.Store.GetWebhook(ctx, e.org.ID, wh.ID); got.Status != "paused" {
		t.Fatalf("status = %s", got.Status)
	}

	// A failed delivery with an attempt: listed with its attempt, retried from the page.
	ch := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Line"})
	delID := seedDelivery(t, e, wh.ID, ch.ID, "failed", 500, 42, "receiver exploded")
	a = c.get("/dashboard/webhooks/" + wh.ID.String())
	wantStatus(t, a, http.StatusOK, delID.String(), "receiver exploded", "42 ms", "0 attempts succeeded, 1 failed", `<svg class="chart"`)
	wantStatus(t, c.get("/dashboard/webhooks/"+wh.ID.String()+"?status=delivered"), http.StatusOK, "No deliveries match.")
	wantStatus(t, c.get("/dashboard/webhooks/"+wh.ID.String()+"?status=bogus"), http.StatusUnprocessableEntity)
	future := time.Now().UTC().Add(time.Hour).Format("2006-01-02T15:04")
	wantStatus(t, c.get("/dashboard/webhooks/"+wh.ID.String()+"?since="+future), http.StatusOK, "No deliveries match.")

	a = c.post("/dashboard/webhooks/"+wh.ID.String()+"/deliveries/"+delID.String()+"/retry", nil)
	wantStatus(t, a, http.StatusOK, "Delivery queued")
	if status := deliveryStatus(t, e, delID); status != "pending" {
		t.Fatalf("after retry: %q", status)
	}
	wantStatus(t, c.post("/dashboard/webhooks/"+wh.ID.String()+"/deliveries/"+delID.String()+"/retry", nil),
		http.StatusConflict, managementapi.MsgDeliveryNotFailed)

	// Another org's webhook page is not found.
	owh, _ := e.Webhook(t, e.Org(t, &testenv.OrgOpts{Name: "Other"}).ID, "https://x.example", &testenv.WebhookOpts{Name: "theirs"})
	wantStatus(t, c.get("/dashboard/webhooks/"+owh.ID.String()), http.StatusNotFound)
	wantStatus(t, c.post("/dashboard/webhooks/"+wh.ID.String()+"/delete", nil), http.StatusOK, "Webhook deleted.")
}

func TestAPIKeysPage(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	c.signIn(e.key)
	a := c.post("/dashboard/api-keys", url.Values{"name": {"ci"}, "expires_in": {"720h"}})
	wantStatus(t, a, http.StatusCreated, "New API key", "crt_pk_")
	key := regexp.MustCompile(`value="(crt_pk_[^"]+)"`).FindStringSubmatch(a.body)
	if key == nil {
		t.Fatal("no key shown")
	}
	a = c.get("/dashboard/api-keys")
	if strings.Contains(a.body, key[1]) {
		t.Fatal("the key is shown again")
	}
	wantStatus(t, a, http.StatusOK, key[1][:12], "(this session)")
	ks, _ := e.Store.ListAPIKeys(context.Background(), e.org.ID)
	var ci store.APIKey
	for _, k := range ks {
		if k.Name == "ci" {
			ci = k
		}
	}
	wantStatus(t, c.post("/dashboard/api-keys/"+ci.ID.String()+"/revoke", nil), http.StatusOK, "API key revoked.")
	if _, err := e.Store.AuthenticateAPIKey(context.Background(), key[1]); err == nil {
		t.Fatal("revoked key still authenticates")
	}
	// Revoking the session's own key ends the session.
	a = c.post("/dashboard/api-keys/"+e.keyRec.ID.String()+"/revoke", nil)
	if a.url != "/dashboard/login" {
		t.Fatalf("after revoking its own key: %s", a.url)
	}
}

func TestDemoReceiverVerifies(t *testing.T) {
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	recvURL, recv, err := fakegraph.ListenTLS("127.0.0.1:0", caFile, &fakegraph.Receiver{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = recv.Close() })
	client := testenv.TLSClient(t, caFile)
	e := newEnv(t, func(o *dashboard.Options) {
		o.Demo = &dashboard.Demo{FakeUpstream: "http://127.0.0.1:1", Receiver: recvURL, Client: client}
	})
	c := e.client()
	c.signIn(e.key)
	wantStatus(t, c.get("/dashboard/demo"), http.StatusOK, "Create the demo webhook")
	wantStatus(t, c.post("/dashboard/demo/webhook", nil), http.StatusCreated, "Demo webhook created", "Nothing received yet.")
	hooks, _ := e.Store.ListWebhooks(context.Background(), e.org.ID)
	if len(hooks) != 1 || hooks[0].URL != recvURL+"/"+e.org.ID.String() {
		t.Fatalf("demo webhook = %+v", hooks)
	}
	secret, err := e.Store.WebhookSecret(context.Background(), hooks[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	// Two deliveries reach the receiver as the dispatcher sends them: one signed with the
	// webhook's secret, one with another.
	post := func(secret, id, text string) {
		body := []byte(`{"id":"` + id + `","type":"messages","data":{"text":"` + text + `"}}`)
		svc, wid, _, _ := dispatcher.Sign(secret, uuid.Must(uuid.NewV7()), time.Now(), body)
		req, _ := http.NewRequest(http.MethodPost, hooks[0].URL, strings.NewReader(string(body)))
		req.Header.Set("X-Svc-Signature", svc)
		req.Header.Set("webhook-id", wid)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	post(secret, "e1", "genuine")
	post("whsec_other", "e2", "forged")
	a := c.get("/dashboard/demo")
	wantStatus(t, a, http.StatusOK, "signature verified", "not verified: signature mismatch", "genuine", "forged")
	if strings.Index(a.body, "forged") > strings.Index(a.body, "genuine") {
		t.Fatal("received deliveries are not newest first")
	}
	// The emit button reaches the fake upstream only for the org's own connected numbers.
	wantStatus(t, c.post("/dashboard/demo/emit", url.Values{"phone_number_id": {"999"}}), http.StatusUnprocessableEntity)
	// Without demo mode there is no demo page.
	e2 := newEnv(t)
	c2 := e2.client()
	c2.signIn(e2.key)
	wantStatus(t, c2.get("/dashboard/demo"), http.StatusNotFound)
}

// TestOddPaths: signed in, the dashboard takes paths segment by segment as decoded, never
// cleaning or redirecting them; a wrong method (HEAD included) is answered like an unknown path,
// except on the sign-in page.
func TestOddPaths(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	wantStatus(t, c.signIn(e.key), http.StatusOK, "New channel")
	u, _ := url.Parse(e.srv.URL + "/dashboard/")
	cookies := c.http.Jar.Cookies(u)
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/dashboard/channels/", 200, ""},
		{"GET", "//dashboard/channels", 404, ""},
		{"GET", "/dashboard//", 404, ""},
		{"GET", "/dashboard/./channels", 404, ""},
		{"GET", "/dashboard/webhooks/../channels", 404, ""},
		{"GET", "/dashboard/webhooks/x%2Fy", 404, ""},
		{"GET", "/dashboard/webhooks/..", 404, ""},
		{"GET", "/dashboard/logout", 404, ""},
		{"HEAD", "/dashboard/channels", 404, ""},
		{"PUT", "/dashboard/channels", 404, ""},
		{"HEAD", "/dashboard/login", 405, "GET, POST"},
		{"GET", "/dashboard", 303, ""}, // to the channels page
	} {
		// straight to the handler: the test server's own ServeMux would clean the path
		req := httptest.NewRequest(tc.method, e.srv.URL+tc.path, nil)
		for _, ck := range cookies {
			req.AddCookie(ck)
		}
		rec := httptest.NewRecorder()
		e.dash.ServeHTTP(rec, req)
		if rec.Code != tc.status || rec.Header().Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d Allow %q Location %q, want %d Allow %q", tc.method, tc.path, rec.Code, rec.Header().Get("Allow"),
				rec.Header().Get("Location"), tc.status, tc.allow)
		}
	}
}
