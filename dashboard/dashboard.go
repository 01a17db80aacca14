// Package dashboard serves wabarelay's web dashboard for an org's operators: channels (with
// their connect links), a channel's recent messages and sends per minute, a message's timeline,
// webhooks, a webhook's delivery log and charts, and API keys. It is a
// plain net/http handler, server-rendered with html/template and embedded assets (no build
// step); the Caddy module wabarelay_dashboard mounts it.
//
// Sign-in takes an API key of the org and starts a server-side session (store
// DashboardSession): the cookie is HttpOnly, SameSite=Strict, scoped to the dashboard's path
// and, over HTTPS, Secure and named with the __Secure- prefix; the session ends on sign-out and
// the moment its key is revoked or expires. A session cookie that names no live session counts
// as an authentication failure in the AuthGuard (like a bad API key), so a flood of guessed
// cookies is refused with 429 before it costs queries; a key or cookie the guard knows valid is
// never refused by it. A sign-in costs a request of the key's management rate limit, and a key
// holds at most store.MaxDashboardSessions sessions (a sign-in beyond ends the oldest).
//
// Every state-changing request (sign-in included) must come from the dashboard's own origin:
// Go's http.CrossOriginProtection (Sec-Fetch-Site, else Origin against Host), and an Origin of
// "null" is refused outright. With SameSite=Strict cookies this is the whole CSRF defence; there
// are no per-form tokens. Pages are served with a strict Content-Security-Policy (no inline
// script or style).
//
// Every read and change goes through the management API's own Service
// (managementapi.Service) as the signed-in key's principal, so the dashboard applies exactly the
// API's scoping, rules, checks and messages, not a second copy of them. Each page load is
// counted against the key's management rate limit (the API's own); each change is admitted as
// the API admits a call of the key. The store serves what is authentication, not data: the
// sign-in's API key lookup and the sessions; and the demo page's check of its receiver's
// signatures, which needs a webhook's current secret (the Service hands a secret out only once,
// when it is made).
package dashboard

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/internal/authguard"
	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/managementapi"
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

// Options configure a Handler.
type Options struct {
	// Store authenticates: it checks the API keys of sign-ins and keeps the sessions (and gives
	// the demo page its webhook's secret). Required.
	Store *store.Store
	// API is the management API's Service, shared with the API: the dashboard reads its pages
	// and makes its changes through it, as the signed-in key (connect links take its
	// ConnectBase). Every page load of a signed-in key is charged to that key's management rate
	// limit too (Service.Charge), and a load over it is answered 429 with Retry-After. Required.
	API *managementapi.Service
	// BasePath is the path the dashboard is mounted at, unstripped. Default: /dashboard.
	BasePath string
	// SessionTTL is how long a sign-in lasts (never past its key's expiry). Default: 12h.
	SessionTTL time.Duration
	// AuthGuard, if set, counts failed sign-ins and session cookies that name no live session
	// per client address, like the API's bad keys, and refuses an address that failed too often
	// with 429 before any lookup. A key or session cookie that authenticated is known to it and
	// never refused (a shared address must not lock a valid user out). Share the API's guard.
	AuthGuard *authguard.Guard
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
	// mux routes the signed-in pages and actions.
	mux *http.ServeMux
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
	funcs := template.FuncMap{"fmtTime": fmtTime, "deref": deref, "join": strings.Join, "count": count, "qualityClass": qualityClass,
		"fmtMS": fmtMS, "lastAttempt": lastAttempt}
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
	h.routes()
	return h, nil
}

// signedIn is a handler of a signed-in request.
type signedIn func(w http.ResponseWriter, r *http.Request, s *session)

type sessionKey struct{}

// routes registers the signed-in pages and actions on h.mux (patterns under BasePath, whose
// segments are escaped so that they are matched literally).
func (h *Handler) routes() {
	h.mux = http.NewServeMux()
	base := strings.Split(h.opt.BasePath, "/")
	for i, seg := range base {
		base[i] = url.PathEscape(seg)
	}
	prefix := strings.Join(base, "/")
	handle := func(method, path string, fn signedIn) {
		h.mux.HandleFunc(method+" "+prefix+path, func(w http.ResponseWriter, r *http.Request) {
			fn(w, r, r.Context().Value(sessionKey{}).(*session))
		})
	}
	get, post := http.MethodGet, http.MethodPost
	handle(post, "/logout", func(w http.ResponseWriter, r *http.Request, _ *session) { h.logout(w, r) })
	handle(get, "/channels", h.channels)
	handle(post, "/channels", h.createChannel)
	handle(post, "/channels/{id}/reconnect", h.reconnectChannel)
	handle(post, "/channels/{id}/delete", h.deleteChannel)
	handle(get, "/channels/{id}", h.channel)
	handle(get, "/channels/{id}/broadcasts", h.broadcasts) // broadcasts.go
	handle(post, "/channels/{id}/broadcasts", h.createBroadcast)
	handle(get, "/broadcasts/{id}", h.broadcast)
	handle(post, "/broadcasts/{id}/pause", h.changeBroadcast("broadcast-paused", (*managementapi.Service).PauseBroadcast))
	handle(post, "/broadcasts/{id}/resume", h.changeBroadcast("broadcast-resumed", (*managementapi.Service).ResumeBroadcast))
	handle(post, "/broadcasts/{id}/cancel", h.changeBroadcast("broadcast-cancelled", (*managementapi.Service).CancelBroadcast))
	handle(get, "/messages/{wamid...}", h.message)
	handle(get, "/webhooks", h.webhooks)
	handle(post, "/webhooks", h.createWebhook)
	handle(get, "/webhooks/{id}", h.webhook)
	handle(post, "/webhooks/{id}/status", h.setWebhookStatus)
	handle(post, "/webhooks/{id}/ordering", h.setWebhookOrdering)
	handle(post, "/webhooks/{id}/delete", h.deleteWebhook)
	handle(post, "/webhooks/{id}/channels", h.assignChannel)
	handle(post, "/webhooks/{id}/recover", h.recoverDeliveries)
	handle(post, "/webhooks/{id}/replay", h.replay)
	handle(post, "/webhooks/{id}/rotate_secret", h.rotateSecret)
	handle(post, "/webhooks/{id}/deliveries/{did}/retry", h.retryDelivery)
	handle(get, "/usage", h.usage)
	handle(get, "/usage.csv", h.usageCSV)
	handle(get, "/api-keys", h.apiKeys)
	handle(post, "/api-keys", h.createAPIKey)
	handle(post, "/api-keys/{id}/revoke", h.revokeAPIKey)
	if h.opt.Demo != nil {
		handle(get, "/demo", h.demo)
		handle(post, "/demo/emit", h.demoEmit)
		handle(post, "/demo/webhook", h.demoWebhook)
		handle(post, "/demo/send", h.demoSend)
		handle(post, "/demo/quality", h.demoQuality) // demohealth.go
		handle(post, "/demo/window", h.demoWindow)
		handle(post, "/demo/broadcast", h.demoBroadcast) // demobroadcast.go
	}
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
	path := strings.Trim(rest, "/")
	if r.Method == http.MethodPost {
		// Forms are small, but for the new-broadcast form's CSV; a larger body fails to parse.
		limit := int64(maxFormBytes)
		if uploadPath(r.Method, path) {
			limit = maxUploadBytes
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
	}
	// Unauthenticated routes.
	if path == "login" {
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
	// page (read through the API's Service), are counted by the API calls they make.
	if safeMethod(r.Method) && path != "api-keys" && !h.allow(w, r, s) {
		return
	}
	if rest == "" || rest == "/" {
		http.Redirect(w, r, h.opt.BasePath+"/channels", http.StatusSeeOther)
		return
	}
	h.route(w, r, s, path)
}

// route serves a signed-in request for path (BasePath's rest without its outer slashes)
// through h.mux. Every segment counts: an empty, "." or ".." one becomes "-", which no pattern
// has and no id matches, so the ServeMux never redirects to a cleaned path. A wrong method, HEAD
// included, is answered like an unknown path.
func (h *Handler) route(w http.ResponseWriter, r *http.Request, s *session, path string) {
	segs := strings.Split(path, "/")
	for i, seg := range segs {
		if seg == "" || seg == "." || seg == ".." {
			segs[i] = "-"
		}
	}
	rr := r.Clone(context.WithValue(r.Context(), sessionKey{}, s))
	rr.URL.Path, rr.URL.RawPath = h.opt.BasePath+"/"+strings.Join(segs, "/"), ""
	if _, pattern := h.mux.Handler(rr); pattern == "" || r.Method == http.MethodHead {
		h.notFound(w, r, s)
		return
	}
	h.mux.ServeHTTP(w, rr)
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
	if !h.guardAllows(w, r, addr, c.Value) {
		return nil, errGuarded
	}
	ds, err := h.opt.Store.DashboardSession(r.Context(), c.Value)
	if errors.Is(err, store.ErrNoSession) {
		if g := h.opt.AuthGuard; g != nil {
			g.Forget(c.Value)
			g.Fail(addr)
		}
		h.setCookie(w, r, "", -1)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if g := h.opt.AuthGuard; g != nil {
		g.Valid(c.Value)
	}
	return &session{ds}, nil
}

// guardAllows reports whether the AuthGuard lets addr attempt to authenticate with
// credential (one it knows valid always may); if not, it answers 429 with Retry-After.
func (h *Handler) guardAllows(w http.ResponseWriter, r *http.Request, addr, credential string) bool {
	g := h.opt.AuthGuard
	if g == nil {
		return true
	}
	wait, ok := g.Admit(addr, credential)
	if !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
		h.render(w, r, http.StatusTooManyRequests, "error", page{Title: "Too many attempts",
			Error: "Too many failed sign-ins from your address. Wait a minute and try again."})
	}
	return ok
}

// allow charges a page load to the signed-in key's management rate limit (Service.Charge: the
// RateLimit headers, like the API), answering 429 with Retry-After when it is over.
func (h *Handler) allow(w http.ResponseWriter, r *http.Request, s *session) bool {
	if h.opt.API.Charge(r.Context(), s.Key, w.Header()) != nil {
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
	"channel-created":     "Channel created. Send its connect link to the number's owner.",
	"reconnected":         "The connect link is open again.",
	"channel-deleted":     "Channel deleted.",
	"webhook-updated":     "Webhook updated.",
	"webhook-deleted":     "Webhook deleted.",
	"assigned":            "Channel assignment updated.",
	"retried":             "Delivery queued for a fresh attempt.",
	"key-revoked":         "API key revoked.",
	"emitted":             "The fake upstream sent an incoming message. It appears below once delivered.",
	"signed-out":          "Signed out.",
	"broadcast-created":   "Broadcast created. It sends at its pace from its start time; this page follows its progress.",
	"broadcast-paused":    "Broadcast paused: nothing more is sent until it is resumed.",
	"broadcast-resumed":   "Broadcast resumed.",
	"broadcast-cancelled": "Broadcast cancelled: its recipients not sent yet will not be.",
	"demo-broadcast":      "Demo broadcast created. The fake upstream answers one recipient 130429 (rate limit hit) once, so it is retried a few seconds later and accepted, and another 131047 (re-engagement message), so it fails; the rest are accepted and reported sent, delivered and read.",
	"quality-lowered":     "The fake upstream lowered the number's quality to YELLOW and posted phone_number_quality_update to the service, which reads the number's health after it (30 s later, so that repeated webhooks join one read): within a minute the Channels page shows the badge.",
}

// act makes one change as the session's key through the management API's Service: the call is
// admitted as the API admits it (Service.Admit: the access-log hook and the key's rate limit,
// whose headers go to hdr, nil to drop them), then op runs. It returns the API's refusal or
// failure, with the status and message the API would answer; nil on success.
func (h *Handler) act(r *http.Request, s *session, hdr http.Header, op func(context.Context, managementapi.Principal) error) *managementapi.Error {
	if hdr == nil {
		hdr = http.Header{}
	}
	err := h.opt.API.Admit(r, s.Key, hdr)
	if err == nil {
		err = op(r.Context(), h.principal(r, s))
	}
	return h.opt.API.ErrorFor(r, err)
}

// principal is the session's key as the caller of the Service's operations and reads.
func (h *Handler) principal(r *http.Request, s *session) managementapi.Principal {
	return managementapi.Principal{Key: s.Key, Origin: httpx.Origin(r)}
}

// readError answers the error of a page's read through the Service: its refusal as
// apiError renders it (a 404 as the not-found page), any other error as a failure.
func (h *Handler) readError(w http.ResponseWriter, r *http.Request, s *session, err error) {
	if e, ok := errors.AsType[*managementapi.Error](err); ok {
		h.apiError(w, r, s, e)
		return
	}
	h.serverError(w, r, err)
}

// formText returns a form value as text for the API: each byte that is not UTF-8 becomes
// U+FFFD, as encoding/json writes such a string into a request body.
func formText(v string) string {
	if utf8.ValidString(v) {
		return v
	}
	var b strings.Builder
	for i := 0; i < len(v); {
		c, n := utf8.DecodeRuneInString(v[i:])
		b.WriteRune(c) // utf8.RuneError for an invalid byte
		i += n
	}
	return b.String()
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

// count writes n things: "1 upstream error", "2 upstream errors".
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
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
