// Package dashboard serves wabarelay's web dashboard for an org's operators: channels (with
// their connect links), webhooks, a webhook's delivery log and charts, and API keys. It is a
// plain net/http handler, server-rendered with html/template and embedded assets (no build
// step); the Caddy module wabarelay_dashboard mounts it.
//
// Sign-in takes an API key of the org and starts a server-side session (store
// DashboardSession): the cookie is HttpOnly, SameSite=Strict, scoped to the dashboard's path
// and, over HTTPS, Secure and named with the __Secure- prefix; the session ends on sign-out and
// the moment its key is revoked or expires. A session cookie that names no live session counts
// as an authentication failure in the AuthGuard (like a bad API key), so a flood of guessed
// cookies is refused with 429 before it costs queries.
//
// Every state-changing request (sign-in included) must come from the dashboard's own origin:
// Go's http.CrossOriginProtection (Sec-Fetch-Site, else Origin against Host), and an Origin of
// "null" is refused outright. With SameSite=Strict cookies this is the whole CSRF defence; there
// are no per-form tokens. Pages are served with a strict Content-Security-Policy (no inline
// script or style).
//
// Reads go to the store, each page load counted against the signed-in key's management rate
// limit (Options.Limiter, the API's own limiter); every change goes through the management
// API's own handler (managementapi.Handler.ServeAuthenticated) as the signed-in key, so the
// dashboard applies exactly the API's checks, messages and rate limit, not a second copy of
// them.
package dashboard

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"html/template"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/internal/authguard"
	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/store"
)

// Defaults of Options.
const (
	DefaultBasePath   = "/dashboard"
	DefaultSessionTTL = 12 * time.Hour
)

// sessionCookie is the name of the cookie holding the session token; over HTTPS it carries the
// __Secure- prefix (securePrefix), so a browser only accepts it from a secure origin with the
// Secure attribute.
const (
	sessionCookie = "wabarelay_dashboard"
	securePrefix  = "__Secure-"
)

// maxFormBytes caps a form post's body.
const maxFormBytes = 64 << 10

// contentSecurityPolicy allows the dashboard's own scripts, styles and images only; QR codes
// and charts are inline SVG elements, not scripts.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// API is the management API's handler, serving a request as an already authenticated key.
// *managementapi.Handler implements it.
type API interface {
	ServeAuthenticated(w http.ResponseWriter, r *http.Request, key store.APIKey)
}

// Options configure a Handler.
type Options struct {
	// Store is the data layer. Required.
	Store *store.Store
	// API serves the changes the dashboard makes, as the signed-in key. Required.
	API API
	// BasePath is the path the dashboard is mounted at, unstripped. Default: /dashboard.
	BasePath string
	// ConnectBase is the prefix of connect links. Empty means the scheme and host of each request.
	ConnectBase string
	// SessionTTL is how long a sign-in lasts (never past its key's expiry). Default: 12h.
	SessionTTL time.Duration
	// AuthGuard, if set, counts failed sign-ins and session cookies that name no live session
	// per client address, like the API's bad keys, and refuses an address that failed too often
	// with 429 before any lookup. Share the API's guard.
	AuthGuard *authguard.Guard
	// Limiter, if set, is the management API's per-key rate limiter (the same instance): every
	// page load of a signed-in key counts against that key's management rate limit, and a load
	// over it is answered 429 with Retry-After. Changes are counted by the API they call. Nil
	// means page reads are not limited.
	Limiter ratelimit.Limiter
	// Demo, if set, turns on the demo page: a built-in webhook receiver that verifies each
	// delivery's signature, and a button making the fake upstream send an incoming message.
	Demo *Demo
	// Logger receives failures (never keys, tokens or secrets). Nil means no logging.
	Logger *zap.Logger
}

// Handler serves the dashboard.
type Handler struct {
	opt    Options
	logger *zap.Logger
	pages  map[string]*template.Template
	assets http.Handler
	// origins refuses cross-origin state-changing requests.
	origins *http.CrossOriginProtection
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// New returns a Handler.
func New(opt Options) (*Handler, error) {
	if opt.Store == nil || opt.API == nil {
		return nil, errors.New("dashboard: Store and API are required")
	}
	if opt.BasePath == "" {
		opt.BasePath = DefaultBasePath
	}
	opt.BasePath = "/" + strings.Trim(opt.BasePath, "/")
	if opt.SessionTTL <= 0 {
		opt.SessionTTL = DefaultSessionTTL
	}
	h := &Handler{opt: opt, logger: opt.Logger, pages: map[string]*template.Template{}, origins: http.NewCrossOriginProtection()}
	if h.logger == nil {
		h.logger = zap.NewNop()
	}
	funcs := template.FuncMap{"fmtTime": fmtTime, "deref": deref, "join": strings.Join}
	layout := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html"))
	names, _ := fs.Glob(templateFS, "templates/*.html")
	for _, name := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(name, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		t := template.Must(template.Must(layout.Clone()).ParseFS(templateFS, name))
		h.pages[base] = t
	}
	sub, _ := fs.Sub(assetFS, "assets")
	h.assets = http.StripPrefix(opt.BasePath+"/assets/", http.FileServer(http.FS(sub)))
	return h, nil
}

// session is the signed-in user of a request.
type session struct {
	store.DashboardSession
}

// page is what every template gets.
type page struct {
	Base    string
	Title   string
	Nav     string
	Session *session
	Demo    bool
	Notice  string
	Error   string
	Data    any
}

// ServeHTTP serves the dashboard under BasePath.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", contentSecurityPolicy)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	// Not no-referrer: under it browsers send "Origin: null" on the dashboard's own form posts,
	// which are refused (see sameOrigin).
	hdr.Set("Referrer-Policy", "same-origin")
	rest, ok := strings.CutPrefix(r.URL.Path, h.opt.BasePath)
	if !ok || (rest != "" && rest[0] != '/') {
		h.notFound(w, r, nil)
		return
	}
	if strings.HasPrefix(rest, "/assets/") && r.Method == http.MethodGet {
		hdr.Set("Cache-Control", "public, max-age=3600")
		h.assets.ServeHTTP(w, r)
		return
	}
	hdr.Set("Cache-Control", "no-store")
	if !safeMethod(r.Method) && !h.sameOrigin(r) {
		h.render(w, r, http.StatusForbidden, "error", page{Title: "Refused",
			Error: "The request was refused: it did not come from this dashboard's own pages. Reload the page and try again."})
		return
	}
	if r.Method == http.MethodPost {
		// Forms are small; a larger body fails to parse.
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	}
	segs := strings.Split(strings.Trim(rest, "/"), "/")
	if rest == "" || rest == "/" {
		segs = nil
	}
	// Unauthenticated routes.
	switch {
	case len(segs) == 1 && segs[0] == "login":
		h.login(w, r)
		return
	}
	s, err := h.session(w, r)
	if errors.Is(err, errGuarded) {
		return
	}
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	if s == nil {
		if r.Method == http.MethodGet {
			http.Redirect(w, r, h.opt.BasePath+"/login", http.StatusSeeOther)
			return
		}
		h.render(w, r, http.StatusUnauthorized, "error", page{Title: "Signed out", Error: "Your session has ended. Sign in again."})
		return
	}
	// Page reads count against the key's management rate limit; changes, and the API keys
	// page (read through the API), are counted by the API calls they make.
	if safeMethod(r.Method) && !(len(segs) == 1 && segs[0] == "api-keys") && !h.allow(w, r, s) {
		return
	}
	if len(segs) == 0 {
		http.Redirect(w, r, h.opt.BasePath+"/channels", http.StatusSeeOther)
		return
	}
	h.route(w, r, s, segs)
}

// route dispatches a signed-in request.
func (h *Handler) route(w http.ResponseWriter, r *http.Request, s *session, segs []string) {
	get, post := r.Method == http.MethodGet, r.Method == http.MethodPost
	n := len(segs)
	switch {
	case n == 1 && segs[0] == "logout" && post:
		h.logout(w, r)
	case n == 1 && segs[0] == "channels" && get:
		h.channels(w, r, s)
	case n == 1 && segs[0] == "channels" && post:
		h.createChannel(w, r, s)
	case n == 3 && segs[0] == "channels" && segs[2] == "reconnect" && post:
		h.reconnectChannel(w, r, s, segs[1])
	case n == 3 && segs[0] == "channels" && segs[2] == "delete" && post:
		h.deleteChannel(w, r, s, segs[1])
	case n == 1 && segs[0] == "webhooks" && get:
		h.webhooks(w, r, s)
	case n == 1 && segs[0] == "webhooks" && post:
		h.createWebhook(w, r, s)
	case n == 2 && segs[0] == "webhooks" && get:
		h.webhook(w, r, s, segs[1])
	case n == 3 && segs[0] == "webhooks" && segs[2] == "status" && post:
		h.setWebhookStatus(w, r, s, segs[1])
	case n == 3 && segs[0] == "webhooks" && segs[2] == "delete" && post:
		h.deleteWebhook(w, r, s, segs[1])
	case n == 3 && segs[0] == "webhooks" && segs[2] == "channels" && post:
		h.assignChannel(w, r, s, segs[1])
	case n == 3 && segs[0] == "webhooks" && segs[2] == "recover" && post:
		h.recoverDeliveries(w, r, s, segs[1])
	case n == 5 && segs[0] == "webhooks" && segs[2] == "deliveries" && segs[4] == "retry" && post:
		h.retryDelivery(w, r, s, segs[1], segs[3])
	case n == 1 && segs[0] == "api-keys" && get:
		h.apiKeys(w, r, s)
	case n == 1 && segs[0] == "api-keys" && post:
		h.createAPIKey(w, r, s)
	case n == 3 && segs[0] == "api-keys" && segs[2] == "revoke" && post:
		h.revokeAPIKey(w, r, s, segs[1])
	case n == 1 && segs[0] == "demo" && get && h.opt.Demo != nil:
		h.demo(w, r, s)
	case n == 2 && segs[0] == "demo" && segs[1] == "emit" && post && h.opt.Demo != nil:
		h.demoEmit(w, r, s)
	case n == 2 && segs[0] == "demo" && segs[1] == "webhook" && post && h.opt.Demo != nil:
		h.demoWebhook(w, r, s)
	default:
		h.notFound(w, r, s)
	}
}

// errGuarded means the request was answered 429 by the AuthGuard.
var errGuarded = errors.New("refused by the auth guard")

// session returns the request's live session, or nil when it has none. A session cookie that
// names no live session (unknown, signed out, expired, malformed) is an authentication failure
// of the client address: once the AuthGuard refuses the address, the request is answered 429
// before any lookup and errGuarded returned. Such a cookie is deleted.
func (h *Handler) session(w http.ResponseWriter, r *http.Request) (*session, error) {
	c, err := r.Cookie(h.cookieName(r))
	if err != nil {
		return nil, nil
	}
	addr := httpx.ClientAddr(r)
	if !h.guardAllows(w, r, addr) {
		return nil, errGuarded
	}
	ds, err := h.opt.Store.DashboardSession(r.Context(), c.Value)
	if errors.Is(err, store.ErrNoSession) {
		if g := h.opt.AuthGuard; g != nil {
			g.Fail(addr)
		}
		h.setCookie(w, r, "", -1)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &session{ds}, nil
}

// guardAllows reports whether the AuthGuard lets addr attempt to authenticate; if not, it
// answers 429 with Retry-After.
func (h *Handler) guardAllows(w http.ResponseWriter, r *http.Request, addr string) bool {
	g := h.opt.AuthGuard
	if g == nil {
		return true
	}
	wait, ok := g.Check(addr)
	if !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
		h.render(w, r, http.StatusTooManyRequests, "error", page{Title: "Too many attempts",
			Error: "Too many failed sign-ins from your address. Wait a minute and try again."})
	}
	return ok
}

// allow counts a page load against the signed-in key's management rate limit, answering 429
// with Retry-After (and the RateLimit headers, like the API) when it is over. A limiter failure
// lets the page through, as the API does.
func (h *Handler) allow(w http.ResponseWriter, r *http.Request, s *session) bool {
	if h.opt.Limiter == nil {
		return true
	}
	d, err := h.opt.Limiter.Allow(r.Context(), managementapi.LimitKey(s.Key.ID))
	if err != nil {
		h.logger.Warn("management rate limiter unavailable; page allowed", zap.Error(err))
		return true
	}
	d.SetHeaders(w.Header())
	if !d.Allowed {
		h.render(w, r, http.StatusTooManyRequests, "error", page{Title: "Too many requests", Session: s,
			Error: httpx.MsgRateLimited + ". Wait a moment and reload the page."})
		return false
	}
	return true
}

// safeMethod reports a method that changes nothing.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// sameOrigin reports whether a state-changing request comes from the dashboard's own origin:
// http.CrossOriginProtection decides (Sec-Fetch-Site, else Origin against Host; a request with
// neither is not a browser's and passes), and an Origin of "null" (a sandboxed or opaque
// origin, or a forged header) is refused whatever else the request says.
func (h *Handler) sameOrigin(r *http.Request) bool {
	if r.Header.Get("Origin") == "null" {
		return false
	}
	return h.origins.Check(r) == nil
}

// cookieName is the session cookie's name for r: with the __Secure- prefix over HTTPS (as
// Caddy sees the client, through trusted proxies); plain over http (make run on localhost),
// where browsers would refuse a prefixed cookie.
func (h *Handler) cookieName(r *http.Request) string {
	if httpx.IsHTTPS(r) {
		return securePrefix + sessionCookie
	}
	return sessionCookie
}

// setCookie sets the session cookie: HttpOnly, SameSite=Strict, Secure and __Secure- named over
// HTTPS, scoped to the dashboard. maxAge < 0 deletes it.
func (h *Handler) setCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: h.cookieName(r), Value: value, Path: h.opt.BasePath, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: httpx.IsHTTPS(r)})
}

// render writes a page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	t := h.pages[name]
	p.Base = h.opt.BasePath
	p.Demo = h.opt.Demo != nil
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout.html", p); err != nil {
		h.logger.Error("dashboard: rendering a page failed", zap.String("page", name), zap.Error(err))
		http.Error(w, "Internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (h *Handler) notFound(w http.ResponseWriter, r *http.Request, s *session) {
	h.render(w, r, http.StatusNotFound, "error", page{Title: "Not found", Session: s, Error: "There is nothing here."})
}

// serverError answers a failure of the store: 503 when Postgres cannot be reached (like the
// API), the cause logged, never shown.
func (h *Handler) serverError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	h.logger.Error("dashboard: request failed", zap.String("path", r.URL.Path), zap.Error(err))
	w.Header().Set("Retry-After", "5")
	h.render(w, r, http.StatusServiceUnavailable, "error", page{Title: "Unavailable",
		Error: "The service is unavailable right now. Try again in a few seconds."})
}

// redirect answers a successful form with a redirect to a page, with a fixed notice code.
func (h *Handler) redirect(w http.ResponseWriter, r *http.Request, path, notice string) {
	u := h.opt.BasePath + path
	if notice != "" {
		u += "?done=" + url.QueryEscape(notice)
	}
	http.Redirect(w, r, u, http.StatusSeeOther)
}

// notices are the messages a redirect may ask a page to show (never text from the request).
var notices = map[string]string{
	"channel-created": "Channel created. Send its connect link to the number's owner.",
	"reconnected":     "The connect link is open again.",
	"channel-deleted": "Channel deleted.",
	"webhook-updated": "Webhook updated.",
	"webhook-deleted": "Webhook deleted.",
	"assigned":        "Channel assignment updated.",
	"retried":         "Delivery queued for a fresh attempt.",
	"key-revoked":     "API key revoked.",
	"emitted":         "The fake upstream sent an incoming message. It appears below once delivered.",
	"signed-out":      "Signed out.",
}

// apiResult is the outcome of a call to the management API.
type apiResult struct {
	Status int
	Body   []byte
	Header http.Header
}

// Err returns the API's error message, or "" for a 2xx.
func (a apiResult) Err() string {
	if a.Status >= 200 && a.Status < 300 {
		return ""
	}
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(a.Body, &e) != nil || e.Error == "" {
		return http.StatusText(a.Status)
	}
	return e.Error
}

// recorder captures the API's answer.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (rec *recorder) Header() http.Header { return rec.header }
func (rec *recorder) Write(b []byte) (int, error) {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return rec.body.Write(b)
}
func (rec *recorder) WriteHeader(code int) {
	if rec.status == 0 {
		rec.status = code
	}
}

// call makes one management API request as the session's key: path is relative to the API's
// base (e.g. "/channels"), body is marshalled as JSON unless nil.
func (h *Handler) call(r *http.Request, s *session, method, path string, body any) apiResult {
	var rd io.Reader = http.NoBody
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return apiResult{Status: http.StatusBadRequest, Body: []byte(`{"error":"Invalid JSON body"}`)}
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(r.Context(), method, path, rd)
	if err != nil {
		return apiResult{Status: http.StatusBadRequest, Body: []byte(`{"error":"Not found"}`)}
	}
	req.RemoteAddr, req.Host = r.RemoteAddr, r.Host
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := &recorder{header: http.Header{}}
	h.opt.API.ServeAuthenticated(rec, req, s.Key)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return apiResult{Status: rec.status, Body: rec.body.Bytes(), Header: rec.header}
}

func fmtTime(t any) string {
	switch v := t.(type) {
	case managementapi.Time:
		return fmtTime(time.Time(v))
	case *managementapi.Time:
		if v == nil {
			return "—"
		}
		return fmtTime(time.Time(*v))
	case time.Time:
		return v.UTC().Format("2006-01-02 15:04:05 UTC")
	case *time.Time:
		if v == nil {
			return "—"
		}
		return v.UTC().Format("2006-01-02 15:04:05 UTC")
	}
	return ""
}

func deref(v any) any {
	switch p := v.(type) {
	case *string:
		if p == nil {
			return ""
		}
		return *p
	case *int:
		if p == nil {
			return ""
		}
		return *p
	}
	return v
}
