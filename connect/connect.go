// Package connect serves the connect link of a channel ({connect_base}/connect/<channel_token>):
// the page where a number's owner runs the upstream's Embedded Signup, and the completion that
// exchanges the signup code, subscribes the app to the business account, registers the number
// and activates the channel.
//
// The channel token never sits in the page's URL: GET /connect/<token> moves it into an
// HttpOnly, SameSite=Strict cookie scoped to /connect and redirects (303) to /connect/, which
// serves the page. The page posts the signup result to /connect/complete with that cookie;
// server-side callers may POST /connect/<token> with the same JSON instead.
package connect

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"math/big"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/graph"
	"github.com/wabarelay/wabarelay/internal/authguard"
	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// assets are served as they are under /connect/assets/; templates are rendered by the handler
// and never served.
var (
	//go:embed assets
	assets embed.FS
	//go:embed templates
	templates embed.FS
)

// CookieName is the cookie that carries the channel token between the link and the page.
const CookieName = "wabarelay_connect"

// Messages of the completion endpoint.
const (
	MsgLinkInvalid     = "This connect link is invalid or has expired"
	MsgOtherNumber     = "Reconnect must use the same phone number and business account"
	MsgAlreadyOther    = "Channel is already connected to another number"
	MsgNumberInUse     = "This phone number is already connected to another channel"
	MsgUpstreamDown    = "Upstream unavailable; please try again"
	MsgNotInAccount    = "This phone number does not belong to that business account"
	MsgDeactivated     = "This channel was deactivated by the operator"
	completionDeadline = 25 * time.Second // the upstream's code lives 30 s
)

// Options configure a Handler.
type Options struct {
	// Store is the data layer. Required.
	Store *store.Store
	// Graph calls the upstream. Required.
	Graph *graph.Client
	// AppID, AppSecret and ConfigID are the upstream app's credentials and Embedded Signup
	// configuration.
	AppID, AppSecret, ConfigID string
	// SDKURL is the upstream JS SDK the page loads.
	SDKURL string
	// GraphVersion is the upstream version the SDK is initialised with (e.g. "v26.0").
	GraphVersion string
	// RegisterPIN is the PIN numbers are registered with; "" means a random PIN per channel,
	// stored encrypted (and reused when the channel reconnects).
	RegisterPIN string
	// ConnectBase is {connect_base} for the Channel answered on completion ("" means the
	// request's origin).
	ConnectBase string
	// OriginSuffix is the origin suffix the page accepts signup messages from. Default
	// "facebook.com".
	OriginSuffix string
	// Logger receives failures (never tokens, codes or PINs).
	Logger *zap.Logger
	// AuthGuard, if set, counts unknown and expired links per client address
	// (httpx.ClientAddr) and refuses an address that presented too many with 429 before any
	// lookup, so a flood of guessed links costs no queries.
	AuthGuard *authguard.Guard
}

// Handler serves /connect/... . It must be mounted at /connect (paths are not stripped).
type Handler struct {
	opt     Options
	page    *template.Template
	expired *template.Template
	static  http.Handler
	csp     string
	mux     *http.ServeMux
}

// New returns a Handler.
func New(opt Options) (*Handler, error) {
	if opt.OriginSuffix == "" {
		opt.OriginSuffix = "facebook.com"
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	page, err := template.ParseFS(templates, "templates/page.html")
	if err != nil {
		return nil, fmt.Errorf("connect page template: %w", err)
	}
	expired, err := template.ParseFS(templates, "templates/expired.html")
	if err != nil {
		return nil, fmt.Errorf("expired page template: %w", err)
	}
	sub, _ := fs.Sub(assets, "assets")
	h := &Handler{opt: opt, page: page, expired: expired,
		static: http.StripPrefix("/connect/assets/", http.FileServerFS(sub))}
	sdkOrigin := "https://connect.facebook.net"
	if u, err := url.Parse(opt.SDKURL); err == nil && u.Host != "" {
		sdkOrigin = u.Scheme + "://" + u.Host
	}
	h.csp = "default-src 'none'; script-src 'self' " + sdkOrigin + "; style-src 'self'; " +
		"img-src 'self' data: https://*.facebook.com https://*.fbcdn.net; connect-src 'self' https://*.facebook.com; " +
		"frame-src https://*.facebook.com https://*.facebook.net " + sdkOrigin + "; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
	h.routes()
	return h, nil
}

// allow names the methods of each route's path, for the Allow header of a 405.
var allow = map[string]string{
	"/connect":          "GET, HEAD",
	"/connect/{$}":      "GET, HEAD",
	"/connect/assets/":  "GET, HEAD",
	"/connect/complete": "POST",
	"/connect/{token}":  "GET, HEAD, POST",
}

// routes registers the handler's routes on h.mux (a GET route answers HEAD too).
func (h *Handler) routes() {
	h.mux = http.NewServeMux()
	h.mux.HandleFunc("GET /connect/assets/", h.serveAsset)
	h.mux.HandleFunc("GET /connect", h.servePage)
	h.mux.HandleFunc("GET /connect/{$}", h.servePage)
	h.mux.HandleFunc("POST /connect/complete", h.completePage)
	// "complete" is not a link: GET /connect/complete is refused, not looked up.
	h.mux.HandleFunc("GET /connect/complete", h.noRoute)
	h.mux.HandleFunc("GET /connect/{token}", func(w http.ResponseWriter, r *http.Request) {
		h.openLink(w, r, r.PathValue("token"))
	})
	h.mux.HandleFunc("POST /connect/{token}", func(w http.ResponseWriter, r *http.Request) {
		h.complete(w, r, r.PathValue("token"))
	})
}

// ServeHTTP implements http.Handler: the routes of h.mux, with JSON 404 and 405 answers (the
// mux's own would be plain text, and name other methods in Allow).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Content-Type-Options", "nosniff")
	if r.URL.RawPath != "" {
		// Route on the decoded path: an escaped "/" separates segments, as it always has.
		r2 := r.WithContext(r.Context())
		u := *r.URL
		u.RawPath = ""
		r2.URL = &u
		r = r2
	}
	// A path that is not clean is not found (the mux would redirect it).
	if _, pattern := h.mux.Handler(r); pattern == "" || !cleanPath(r.URL.Path) {
		h.noRoute(w, r)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// noRoute answers a request that no route takes: 405 with the methods its path takes, else 404.
func (h *Handler) noRoute(w http.ResponseWriter, r *http.Request) {
	if cleanPath(r.URL.Path) {
		for _, m := range []string{http.MethodPost, http.MethodGet} {
			probe := r.WithContext(r.Context())
			probe.Method = m
			if _, pattern := h.mux.Handler(probe); pattern != "" {
				_, path, _ := strings.Cut(pattern, " ")
				w.Header().Set("Allow", allow[path])
				httpx.WriteError(w, http.StatusMethodNotAllowed, httpx.MsgMethod)
				return
			}
		}
	}
	httpx.WriteError(w, http.StatusNotFound, httpx.MsgNotFound)
}

// cleanPath reports whether p is its own path.Clean (a trailing slash kept).
func cleanPath(p string) bool {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

func (h *Handler) serveAsset(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "public, max-age=300")
	h.static.ServeHTTP(w, r)
}

// completePage completes the link whose token the page's cookie carries.
func (h *Handler) completePage(w http.ResponseWriter, r *http.Request) {
	c, err := r.Cookie(CookieName)
	if err != nil {
		httpx.WriteError(w, http.StatusGone, MsgLinkInvalid)
		return
	}
	h.complete(w, r, c.Value)
}

// errThrottled is returned by openChannel for a client address refused by the AuthGuard.
type errThrottled struct{ retry time.Duration }

func (e errThrottled) Error() string { return "too many bad connect links from this address" }

// openChannel returns the channel whose connect link token is open. A token that cannot be a
// channel token is refused without a lookup; unknown and expired ones count against the client
// address (see Options.AuthGuard).
func (h *Handler) openChannel(r *http.Request, token string) (store.Channel, bool, error) {
	addr := httpx.ClientAddr(r)
	if g := h.opt.AuthGuard; g != nil {
		if retry, ok := g.Check(addr); !ok {
			return store.Channel{}, false, errThrottled{retry}
		}
	}
	if !store.ValidChannelToken(token) {
		h.linkFailed(addr)
		return store.Channel{}, false, nil
	}
	c, err := h.opt.Store.ChannelByToken(r.Context(), token)
	if errors.Is(err, store.ErrChannelNotFound) {
		h.linkFailed(addr)
		return store.Channel{}, false, nil
	}
	if err != nil {
		return store.Channel{}, false, err
	}
	if !linkOpen(c) && c.Status != store.ChannelActive {
		h.linkFailed(addr)
	}
	return c, linkOpen(c), nil
}

func (h *Handler) linkFailed(addr string) {
	if h.opt.AuthGuard != nil {
		h.opt.AuthGuard.Fail(addr)
	}
}

func linkOpen(c store.Channel) bool {
	return c.TokenExpiresAt != nil && time.Now().Before(*c.TokenExpiresAt)
}

// openLink moves a valid token into the cookie and redirects to the token-free page.
func (h *Handler) openLink(w http.ResponseWriter, r *http.Request, token string) {
	_, open, err := h.openChannel(r, token)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if !open {
		h.renderExpired(w)
		return
	}
	// Secure whenever the client came over HTTPS, also through a trusted TLS-terminating proxy.
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: token, Path: "/connect", HttpOnly: true,
		Secure: httpx.IsHTTPS(r), SameSite: http.SameSiteStrictMode, MaxAge: 3600})
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, "/connect/", http.StatusSeeOther)
}

// pageData is what page.html renders.
type pageData struct {
	ChannelName, AppID, ConfigID, SDKURL, GraphVersion, PostURL, CSPNonce, AssetBase, OriginSuffix string
}

func (h *Handler) servePage(w http.ResponseWriter, r *http.Request) {
	var c store.Channel
	open := false
	if ck, err := r.Cookie(CookieName); err == nil {
		var err error
		if c, open, err = h.openChannel(r, ck.Value); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	if !open {
		h.renderExpired(w)
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", h.csp)
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("X-Frame-Options", "DENY")
	err := h.page.Execute(w, pageData{ChannelName: c.Name, AppID: h.opt.AppID, ConfigID: h.opt.ConfigID,
		SDKURL: h.opt.SDKURL, GraphVersion: h.opt.GraphVersion, PostURL: "/connect/complete",
		AssetBase: "/connect/assets/", OriginSuffix: h.opt.OriginSuffix})
	if err != nil {
		h.opt.Logger.Error("connect page render failed", zap.Error(err))
	}
}

func (h *Handler) renderExpired(w http.ResponseWriter) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(http.StatusGone)
	if err := h.expired.Execute(w, struct{ AssetBase string }{"/connect/assets/"}); err != nil {
		h.opt.Logger.Error("connect expired page render failed", zap.Error(err))
	}
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	var th errThrottled
	if errors.As(err, &th) {
		w.Header().Set("Retry-After", strconv.Itoa(int((th.retry+time.Second-1)/time.Second)))
		httpx.WriteError(w, http.StatusTooManyRequests, httpx.MsgRateLimited)
		return
	}
	if r.Context().Err() != nil {
		return // the client went away
	}
	h.opt.Logger.Error("connect request failed", zap.String("method", r.Method), zap.Error(err))
	w.Header().Set("Retry-After", "5")
	httpx.WriteError(w, http.StatusServiceUnavailable, httpx.MsgUnavailable)
}

// completion is the body posted by the page (or a server).
type completion struct {
	Code          string `json:"code"`
	PhoneNumberID string `json:"phone_number_id"`
	WabaID        string `json:"waba_id"`
}

func readCompletion(w http.ResponseWriter, r *http.Request) (completion, int, string) {
	var in completion
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		return in, http.StatusRequestEntityTooLarge, "Request body too large"
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(body, &raw) != nil || raw == nil {
		return in, http.StatusBadRequest, "Invalid JSON body"
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"code", &in.Code}, {"phone_number_id", &in.PhoneNumberID}, {"waba_id", &in.WabaID}} {
		v, ok := raw[f.name]
		if !ok || string(v) == "null" {
			return in, http.StatusUnprocessableEntity, fmt.Sprintf(`"%s" is required`, f.name)
		}
		if json.Unmarshal(v, f.dst) != nil {
			return in, http.StatusUnprocessableEntity, fmt.Sprintf(`"%s" must be a string`, f.name)
		}
		*f.dst = strings.TrimSpace(*f.dst)
		if *f.dst == "" {
			return in, http.StatusUnprocessableEntity, fmt.Sprintf(`"%s" is required`, f.name)
		}
		if f.name != "code" && strings.Trim(*f.dst, "0123456789") != "" {
			return in, http.StatusUnprocessableEntity, fmt.Sprintf(`"%s" must be a numeric id`, f.name)
		}
	}
	return in, 0, ""
}

// complete finishes a connection: exchange the code, subscribe, register, read the number,
// store. Upstream failures leave the channel as it was.
func (h *Handler) complete(w http.ResponseWriter, r *http.Request, token string) {
	in, status, msg := readCompletion(w, r)
	if status != 0 {
		httpx.WriteError(w, status, msg)
		return
	}
	c, open, err := h.openChannel(r, token)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	sameNumber := c.PhoneNumberID != nil && *c.PhoneNumberID == in.PhoneNumberID && c.WabaID != nil && *c.WabaID == in.WabaID
	switch {
	case c.ID.String() == "00000000-0000-0000-0000-000000000000":
		httpx.WriteError(w, http.StatusGone, MsgLinkInvalid)
		return
	case c.Status == store.ChannelActive && c.UpstreamDisconnectedAt == nil && !open:
		// already connected: a repeated post is answered with the channel
		if !sameNumber {
			httpx.WriteError(w, http.StatusConflict, MsgAlreadyOther)
			return
		}
		httpx.WriteJSON(w, http.StatusOK, managementapi.NewChannel(c, h.connectBase(r)))
		return
	case !open:
		httpx.WriteError(w, http.StatusGone, MsgLinkInvalid)
		return
	case c.PhoneNumberID != nil && !sameNumber:
		httpx.WriteError(w, http.StatusConflict, MsgOtherNumber)
		return
	}

	ctx, cancel := context.WithTimeout(r.Context(), completionDeadline)
	defer cancel()
	pin, err := h.pinFor(ctx, c)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	g := h.opt.Graph
	upstreamToken, err := g.ExchangeCode(ctx, h.opt.AppID, h.opt.AppSecret, in.Code)
	if err == nil {
		// The signup session reports both ids: the number must be one of the account's, or a
		// caller could tie the channel to a number of another account the token reaches.
		var belongs bool
		if belongs, err = g.PhoneNumberBelongsToWABA(ctx, upstreamToken, in.WabaID, in.PhoneNumberID); err == nil && !belongs {
			httpx.WriteError(w, http.StatusConflict, MsgNotInAccount)
			return
		}
	}
	if err == nil {
		err = g.SubscribeApp(ctx, upstreamToken, in.WabaID)
	}
	if err == nil {
		err = g.Register(ctx, upstreamToken, in.PhoneNumberID, pin)
	}
	var number graph.PhoneNumber
	if err == nil {
		number, err = g.GetPhoneNumber(ctx, upstreamToken, in.PhoneNumberID)
	}
	if err != nil {
		h.upstreamFailure(w, err)
		return
	}
	err = h.opt.Store.CompleteConnection(ctx, c.ID, store.Connection{PhoneNumberID: in.PhoneNumberID, WabaID: in.WabaID,
		DisplayPhoneNumber: number.DisplayPhoneNumber, VerifiedName: number.VerifiedName, UpstreamToken: upstreamToken})
	switch {
	case errors.Is(err, store.ErrNumberInUse):
		httpx.WriteError(w, http.StatusConflict, MsgNumberInUse)
		return
	case errors.Is(err, store.ErrLinkClosed):
		httpx.WriteError(w, http.StatusGone, MsgLinkInvalid)
		return
	case errors.Is(err, store.ErrOperatorDeactivated):
		httpx.WriteError(w, http.StatusConflict, MsgDeactivated)
		return
	case errors.Is(err, store.ErrOtherNumber):
		httpx.WriteError(w, http.StatusConflict, MsgOtherNumber)
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	c, err = h.opt.Store.GetChannel(ctx, c.OrgID, c.ID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.opt.Logger.Info("channel connected", zap.String("channel_id", c.ID.String()), zap.String("phone_number_id", in.PhoneNumberID))
	httpx.WriteJSON(w, http.StatusOK, managementapi.NewChannel(c, h.connectBase(r)))
}

func (h *Handler) upstreamFailure(w http.ResponseWriter, err error) {
	var ge *graph.Error
	if errors.As(err, &ge) {
		msg := ge.Message
		if ge.UserMsg != "" {
			msg = ge.UserMsg
		}
		h.opt.Logger.Warn("connect: upstream refused", zap.Int("status", ge.Status), zap.Int("code", ge.Code),
			zap.Int("subcode", ge.Subcode), zap.String("fbtrace_id", ge.FBTraceID))
		httpx.WriteError(w, http.StatusBadGateway, "Upstream refused the connection: "+msg)
		return
	}
	h.opt.Logger.Warn("connect: upstream unreachable", zap.Error(err))
	httpx.WriteError(w, http.StatusBadGateway, MsgUpstreamDown)
}

// pinFor returns the PIN to register the channel's number with: the configured one, else the
// channel's stored PIN, else a new random one (stored before use).
func (h *Handler) pinFor(ctx context.Context, c store.Channel) (string, error) {
	if h.opt.RegisterPIN != "" {
		return h.opt.RegisterPIN, nil
	}
	pin, err := h.opt.Store.ChannelPIN(ctx, c.ID)
	if err != nil || pin != "" {
		return pin, err
	}
	n, err := rand.Int(rand.Reader, big.NewInt(1_000_000))
	if err != nil {
		return "", err
	}
	pin = fmt.Sprintf("%06d", n.Int64())
	return pin, h.opt.Store.SetChannelPIN(ctx, c.ID, pin)
}

func (h *Handler) connectBase(r *http.Request) string {
	if h.opt.ConnectBase != "" {
		return h.opt.ConnectBase
	}
	return httpx.Origin(r)
}
