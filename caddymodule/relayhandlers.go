package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/relay"
	"github.com/wabarelay/wabarelay/store"
)

func init() {
	caddy.RegisterModule(new(ChannelAuth))
	caddy.RegisterModule(new(RelayRateLimit))
	caddy.RegisterModule(new(Idempotency))
	caddy.RegisterModule(new(UpstreamAuth))
}

// Relay error messages.
const (
	msgAuthRequired      = "Authorization header required"
	msgInvalidToken      = "Invalid channel token"
	msgNotActive         = "Channel is not active"
	msgDisconnected      = "CHANNEL_DISCONNECTED"
	msgPathNotAllowed    = "Path not allowed for this channel"
	msgIdemUnavailable   = "Idempotency store unavailable"
	msgIdemInProgress    = "Request with this idempotency_key is in progress"
	msgIdemMismatch      = "idempotency_key was already used with a different request"
	msgUpstreamDown      = "Upstream unavailable"
	msgUpstreamTimeout   = "Upstream timeout"
	maxRelayBody         = 4 << 20
	maxIdempotencyKeyLen = 255
)

var writeError = httpx.WriteError

func relayState(w http.ResponseWriter, r *http.Request) (*relay.State, bool) {
	st := relay.StateFrom(r.Context())
	if st == nil || st.Channel == nil {
		// A chain configured without wabarelay_channel_auth first: a configuration bug.
		writeError(w, http.StatusInternalServerError, "Relay misconfigured: channel authentication must come first")
		return nil, false
	}
	return st, true
}

// ChannelAuth authenticates relay calls by channel token (`Authorization: Bearer
// <channel_token>`) and enforces the relay scope: the first path segment must be the channel's
// phone number id or business account id, or an object handed to the channel. Channels are
// resolved through an in-memory cache that Postgres notifications keep current.
//
// It sets `{http.auth.user.id}` to the channel id.
type ChannelAuth struct {
	app *App
}

// CaddyModule returns the Caddy module information.
func (*ChannelAuth) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.wabarelay_channel_auth", New: func() caddy.Module { return new(ChannelAuth) }}
}

// Provision sets up the handler.
func (h *ChannelAuth) Provision(ctx caddy.Context) (err error) {
	h.app, err = appFrom(ctx)
	return err
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *ChannelAuth) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	r = withClient(r)
	authz := r.Header.Get("Authorization")
	if authz == "" {
		h.app.metrics.relayRequests.WithLabelValues("unauthorized").Inc()
		writeError(w, http.StatusUnauthorized, msgAuthRequired)
		return nil
	}
	// An address that presented too many bad tokens is refused before any lookup.
	addr := httpx.ClientAddr(r)
	if retry, ok := h.app.authGuard.Check(addr); !ok {
		h.app.metrics.relayRequests.WithLabelValues("auth_throttled").Inc()
		writeRetryAfter(w, retry)
		writeError(w, http.StatusTooManyRequests, httpx.MsgRateLimited)
		return nil
	}
	scheme, token, _ := strings.Cut(authz, " ")
	token = strings.TrimSpace(token)
	if !strings.EqualFold(scheme, "Bearer") || !store.ValidChannelToken(token) {
		h.app.authGuard.Fail(addr)
		h.app.metrics.relayRequests.WithLabelValues("unauthorized").Inc()
		writeError(w, http.StatusUnauthorized, msgInvalidToken)
		return nil
	}
	ch, err := h.app.cache.Lookup(r.Context(), token)
	switch {
	case errors.Is(err, relay.ErrUnknownToken):
		h.app.authGuard.Fail(addr)
		h.app.metrics.relayRequests.WithLabelValues("unauthorized").Inc()
		writeError(w, http.StatusUnauthorized, msgInvalidToken)
		return nil
	case err != nil:
		if r.Context().Err() != nil {
			return nil // the client went away
		}
		h.app.logger.Warn("relay: channel lookup failed", zap.Error(err))
		h.app.metrics.relayRequests.WithLabelValues("unavailable").Inc()
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, httpx.MsgUnavailable)
		return nil
	case ch.Status != "active":
		h.app.metrics.relayRequests.WithLabelValues("inactive").Inc()
		writeError(w, http.StatusForbidden, msgNotActive)
		return nil
	case ch.Disconnected:
		h.app.metrics.relayRequests.WithLabelValues("disconnected").Inc()
		writeError(w, http.StatusServiceUnavailable, msgDisconnected)
		return nil
	}
	// Decided from memory: the path's shape, then the channel's own ids and objects.
	if relay.CheckPath(r.URL.Path, r.URL.RawPath) != nil || !relay.InScope(ch, relay.UpstreamPath(r.URL.Path)) {
		h.app.metrics.relayRequests.WithLabelValues("forbidden").Inc()
		writeError(w, http.StatusForbidden, msgPathNotAllowed)
		return nil
	}
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Set("http.auth.user.id", ch.ID.String())
	}
	return next.ServeHTTP(w, r.WithContext(relay.WithState(r.Context(), &relay.State{Channel: ch})))
}

// writeRetryAfter sets Retry-After to d in whole seconds, rounded up.
func writeRetryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int((d+time.Second-1)/time.Second)))
}

// RelayRateLimit limits relay calls per channel: never more than Requests in any rolling
// Window, shared by every instance when the app has Redis. Rejected calls get 429 with
// Retry-After; every answer carries RateLimit-Limit/Remaining/Reset.
type RelayRateLimit struct {
	// Requests is the most calls accepted per channel in any rolling window. Default: 100.
	Requests int `json:"requests,omitempty"`
	// Window is the rolling window. Default: 1m.
	Window caddy.Duration `json:"window,omitempty"`

	app     *App
	limiter limiterHandle
}

// CaddyModule returns the Caddy module information.
func (*RelayRateLimit) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.wabarelay_rate_limit", New: func() caddy.Module { return new(RelayRateLimit) }}
}

// Provision sets up the handler.
func (h *RelayRateLimit) Provision(ctx caddy.Context) (err error) {
	if h.app, err = appFrom(ctx); err != nil {
		return err
	}
	if h.Requests <= 0 {
		h.Requests = 100
	}
	if h.Window <= 0 {
		h.Window = caddy.Duration(time.Minute)
	}
	h.limiter = h.app.newLimiter("wabarelay:relay:", h.Requests, time.Duration(h.Window))
	return nil
}

// Cleanup releases the limiter.
func (h *RelayRateLimit) Cleanup() error {
	h.limiter.release()
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *RelayRateLimit) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	st, ok := relayState(w, r)
	if !ok {
		return nil
	}
	d, err := h.limiter.Allow(r.Context(), st.Channel.ID.String())
	if err != nil {
		h.app.logger.Warn("relay rate limiter failed; request allowed", zap.Error(err))
		return next.ServeHTTP(w, r)
	}
	d.SetHeaders(w.Header())
	if !d.Allowed {
		h.app.metrics.relayRequests.WithLabelValues("rate_limited").Inc()
		h.app.metrics.rateLimited.Inc()
		writeError(w, http.StatusTooManyRequests, httpx.MsgRateLimited)
		return nil
	}
	return next.ServeHTTP(w, r)
}

// Idempotency de-duplicates sends: a JSON `POST …/messages` body may carry a top-level
// `idempotency_key`. It is removed (the rest of the body byte-for-byte intact) and at most one
// upstream send happens per (channel, key) for 24 h across all instances. Repeats get the stored
// response with `Idempotent-Replayed: true`; a repeat while the first is in flight waits for it,
// then 409; the same key with another body gets 422. An upstream 4xx (or a request that never
// reached the upstream) releases the key; a 2xx, 5xx or timeout is stored. Without a working
// idempotency store, sends with a key get 503; sends without a key pass.
type Idempotency struct {
	app *App
}

// CaddyModule returns the Caddy module information.
func (*Idempotency) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.wabarelay_idempotency", New: func() caddy.Module { return new(Idempotency) }}
}

// Provision sets up the handler.
func (h *Idempotency) Provision(ctx caddy.Context) (err error) {
	h.app, err = appFrom(ctx)
	return err
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Idempotency) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.Method != http.MethodPost || !strings.HasSuffix(strings.TrimRight(r.URL.Path, "/"), "/messages") {
		return next.ServeHTTP(w, r)
	}
	st, ok := relayState(w, r)
	if !ok {
		return nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRelayBody))
	if err != nil {
		// Nothing was sent: the body is too large, or the caller went away before it arrived.
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "Request body too large")
		} else {
			writeError(w, http.StatusBadRequest, "Request body could not be read")
		}
		return nil
	}
	stripped, key, found, err := relay.RemoveKey(body, relay.IdempotencyKeyField)
	setBody(r, stripped)
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, err.Error())
		return nil
	}
	// From here on a send runs to its end even if the caller hangs up: cancelling it midway
	// would leave the caller unable to know whether the message went out.
	sendCtx, cancelSend := context.WithTimeout(context.WithoutCancel(r.Context()), relay.SendDeadline)
	defer cancelSend()
	if !found {
		return next.ServeHTTP(w, r.WithContext(sendCtx))
	}
	if key == "" || len(key) > maxIdempotencyKeyLen {
		writeError(w, http.StatusUnprocessableEntity, `"idempotency_key" must be 1 to 255 characters`)
		return nil
	}
	idem := h.app.idem
	if idem == nil {
		writeError(w, http.StatusServiceUnavailable, msgIdemUnavailable)
		return nil
	}
	k := st.Channel.ID.String() + ":" + key
	res, err := idem.Begin(r.Context(), k, idempotency.Fingerprint(r.Method, relay.UpstreamPath(r.URL.Path), stripped))
	if err != nil {
		if r.Context().Err() != nil {
			return nil
		}
		h.app.logger.Warn("idempotency store unavailable; refusing send with a key", zap.Error(err))
		h.app.metrics.relayRequests.WithLabelValues("idempotency_unavailable").Inc()
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, msgIdemUnavailable)
		return nil
	}
	switch res.Outcome {
	case idempotency.Replay:
		h.app.metrics.replays.Inc()
		h.app.metrics.relayRequests.WithLabelValues("replayed").Inc()
		resp := *res.Response
		if !relay.ValidStatus(resp.Status) {
			resp = upstreamUnavailable() // a record of a release before this check existed
		}
		for name, vals := range resp.Header {
			w.Header()[name] = vals
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("Content-Length", strconv.Itoa(len(resp.Body)))
		w.WriteHeader(resp.Status)
		w.Write(resp.Body)
		return nil
	case idempotency.InProgress:
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusConflict, msgIdemInProgress)
		return nil
	case idempotency.Mismatch:
		writeError(w, http.StatusUnprocessableEntity, msgIdemMismatch)
		return nil
	}

	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufPool.Put(buf)
	own := w.Header().Clone()
	rec := caddyhttp.NewResponseRecorder(w, buf, func(int, http.Header) bool { return true })
	err = next.ServeHTTP(rec, r.WithContext(sendCtx))
	status := rec.Status()
	// Finish with the store on a context that outlives a client that hung up.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	if relay.ReleaseKey(status, st.UpstreamAnswered, st.NotSent) {
		defer cancel()
		if rerr := idem.Release(sctx, k, res.Token); rerr != nil && !errors.Is(rerr, idempotency.ErrNotOwner) {
			h.app.logger.Warn("idempotency: release failed", zap.Error(rerr))
		}
		if err != nil {
			return err
		}
		return rec.WriteResponse()
	}
	var resp idempotency.Response
	if err != nil || !relay.ValidStatus(status) {
		// Nothing usable was written and nothing proves the upstream did not send: the caller
		// and every retry get the relay's 502 (a status below 100 is never stored).
		if err != nil {
			h.app.logger.Warn("relay: send failed without an answer", zap.Error(err))
		}
		resp = upstreamUnavailable()
		resetHeaders(w, own)
		for name, vals := range resp.Header {
			w.Header()[name] = vals
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(resp.Body)))
		w.WriteHeader(resp.Status)
		w.Write(resp.Body)
	} else {
		resp = idempotency.Response{Status: status, Header: replayHeaders(rec.Header()), Body: bytes.Clone(buf.Bytes())}
	}
	// Answer first, then store in the background: neither the caller nor the next request on
	// its connection waits for the second Redis round trip. Duplicates arriving meanwhile wait
	// on the in-flight claim and are woken by Complete. App.Stop waits for pending stores.
	h.app.pendingStores.Add(1)
	go func() {
		defer h.app.pendingStores.Add(-1)
		defer cancel()
		defer func() {
			if v := recover(); v != nil {
				h.app.logger.Error("idempotency: storing the response panicked", zap.Any("panic", v))
			}
		}()
		if cerr := idem.Complete(sctx, k, res.Token, resp); cerr != nil {
			h.app.logger.Warn("idempotency: storing the response failed", zap.Error(cerr))
		}
	}()
	if err != nil || !relay.ValidStatus(status) {
		return nil
	}
	return rec.WriteResponse()
}

// upstreamUnavailable is the relay's own 502 answer, as stored for replays.
func upstreamUnavailable() idempotency.Response {
	return idempotency.Response{Status: http.StatusBadGateway,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"error":"` + msgUpstreamDown + `"}`)}
}

// resetHeaders makes w's header exactly own: an answer the relay substitutes for the
// upstream's carries only the relay's own headers (DESIGN §5 "Substituted answers"), never the
// upstream's Content-Length, Content-Encoding or WWW-Authenticate.
func resetHeaders(w http.ResponseWriter, own http.Header) {
	h := w.Header()
	clear(h)
	for name, vals := range own {
		h[name] = vals
	}
}

// replayHeaders picks the response headers worth replaying.
func replayHeaders(h http.Header) http.Header {
	out := http.Header{}
	for _, name := range []string{"Content-Type", "X-Fb-Trace-Id", "X-Fb-Request-Id", "Www-Authenticate"} {
		if v := h.Values(name); len(v) > 0 {
			out[name] = v
		}
	}
	return out
}

func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// UpstreamAuth swaps the caller's channel token for the channel's upstream access token and
// prepares the request for reverse_proxy (upstream path with its version segment; the caller's
// credentials removed). On the way back it answers 503 CHANNEL_DISCONNECTED (and marks the
// channel) when the upstream rejects the token with code 190, rewrites paging links to
// {proxy_url} without any access token, records object ids handed to the channel, and turns
// reverse_proxy failures into JSON 502/504. Other upstream answers pass through untouched.
type UpstreamAuth struct {
	app *App
}

// CaddyModule returns the Caddy module information.
func (*UpstreamAuth) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.wabarelay_upstream_auth", New: func() caddy.Module { return new(UpstreamAuth) }}
}

// Provision sets up the handler.
func (h *UpstreamAuth) Provision(ctx caddy.Context) (err error) {
	h.app, err = appFrom(ctx)
	return err
}

// maxRewriteBody caps the JSON responses buffered for rewriting; larger ones stream through.
const maxRewriteBody = 8 << 20

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *UpstreamAuth) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	st, ok := relayState(w, r)
	if !ok {
		return nil
	}
	ch := st.Channel
	proxyBase := h.proxyBase(r)
	up := h.app.upstream

	r.Header.Set("Authorization", "Bearer "+ch.UpstreamToken)
	r.Header.Del("X-Api-Key")
	r.Header.Del("Cookie")
	if r.Method == http.MethodGet {
		// Reads can be large (template lists): the transport negotiates compression with the
		// upstream and decodes it itself.
		r.Header.Del("Accept-Encoding")
	} else {
		// Writes answer a few hundred bytes of JSON: compressing them costs both ends more
		// than it saves (bench/relay: decompressing was ~3% of the relay's CPU per send).
		r.Header.Set("Accept-Encoding", "identity")
	}
	r.URL.RawQuery = withoutAccessToken(r.URL.RawQuery)
	upath := relay.UpstreamPath(r.URL.Path)
	r.URL.Path = strings.TrimRight(up.Path, "/") + upath
	r.URL.RawPath = ""
	caddyhttp.SetVar(r.Context(), upstreamVar, h.app.upstreamDial)

	own := w.Header().Clone() // the relay's own headers so far (rate limit)
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufPool.Put(buf)
	rec := caddyhttp.NewResponseRecorder(w, buf, func(status int, hdr http.Header) bool {
		n, _ := strconv.Atoi(hdr.Get("Content-Length"))
		return isJSON(hdr.Get("Content-Type")) && n <= maxRewriteBody
	})
	start := time.Now()
	err := next.ServeHTTP(rec, r)
	h.app.metrics.upstreamLatency.Observe(time.Since(start).Seconds())
	if err != nil {
		resetHeaders(w, own)
		return h.proxyError(w, r, st, err)
	}
	if !rec.Buffered() {
		if relay.ValidStatus(rec.Status()) {
			st.UpstreamAnswered = true
		}
		h.app.metrics.relayRequests.WithLabelValues(outcomeOf(rec.Status())).Inc()
		return nil
	}
	body := buf.Bytes()
	status := rec.Status()
	if relay.TokenDead(status, body) {
		st.NotSent = true
		mctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
		err := h.app.cache.MarkDisconnected(mctx, ch.ID)
		cancel()
		if err != nil {
			h.app.logger.Error("relay: recording a dead upstream token failed", zap.Error(err))
		}
		h.app.logger.Warn("relay: upstream rejected the channel's access token (code 190); channel disconnected",
			zap.String("channel_id", ch.ID.String()))
		h.app.metrics.relayRequests.WithLabelValues("disconnected").Inc()
		resetHeaders(w, own)
		writeError(w, http.StatusServiceUnavailable, msgDisconnected)
		return nil
	}
	st.UpstreamAnswered = true
	if kind, ids := relay.Handed(ch, r.Method, upath, status, body); len(ids) > 0 {
		actx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
		err := relay.Admit(actx, h.app.store, ch, kind, ids)
		cancel()
		if err != nil {
			h.app.logger.Warn("relay: recording object ids failed", zap.Error(err))
		}
	}
	hdr := w.Header()
	if out := relay.RewriteLinks(body, proxyBase, ch.UpstreamToken); !bytes.Equal(out, body) {
		// A rewritten body is the relay's answer: the upstream's validators and
		// authentication challenge no longer describe it.
		body = out
		hdr.Del("Etag")
		hdr.Del("Www-Authenticate")
	}
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	hdr.Del("Content-Encoding")
	w.WriteHeader(status)
	w.Write(body)
	h.app.metrics.relayRequests.WithLabelValues(outcomeOf(status)).Inc()
	return nil
}

func outcomeOf(status int) string {
	switch {
	case status < 400:
		return "ok"
	case status < 500:
		return "upstream_4xx"
	default:
		return "upstream_5xx"
	}
}

// proxyError answers a reverse_proxy failure as JSON: 504 for a timeout, else 502. A failure
// to connect means nothing was sent.
func (h *UpstreamAuth) proxyError(w http.ResponseWriter, r *http.Request, st *relay.State, err error) error {
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		st.NotSent = true
	}
	status, msg := http.StatusBadGateway, msgUpstreamDown
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode == http.StatusGatewayTimeout || errors.Is(err, context.DeadlineExceeded) {
		status, msg = http.StatusGatewayTimeout, msgUpstreamTimeout
	}
	if r.Context().Err() != nil {
		return nil // the client went away
	}
	h.app.logger.Warn("relay: upstream request failed", zap.Int("status", status), zap.Error(err))
	h.app.metrics.relayRequests.WithLabelValues("upstream_error").Inc()
	writeError(w, status, msg)
	return nil
}

// proxyBase is {proxy_url}: configured, or the scheme, host and stripped path prefix of the
// original request.
func (h *UpstreamAuth) proxyBase(r *http.Request) string {
	if h.app.ProxyURL != "" {
		return h.app.ProxyURL
	}
	prefix := ""
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok {
		prefix = strings.TrimSuffix(orig.URL.Path, r.URL.Path)
	}
	return httpx.Origin(r) + prefix
}

func withoutAccessToken(q string) string {
	if !strings.Contains(q, "access_token") {
		return q
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return q
	}
	vals.Del("access_token")
	return vals.Encode()
}

// Interface guards.
var (
	_ caddyhttp.MiddlewareHandler = (*ChannelAuth)(nil)
	_ caddyhttp.MiddlewareHandler = (*RelayRateLimit)(nil)
	_ caddy.CleanerUpper          = (*RelayRateLimit)(nil)
	_ caddyhttp.MiddlewareHandler = (*Idempotency)(nil)
	_ caddyhttp.MiddlewareHandler = (*UpstreamAuth)(nil)
)
