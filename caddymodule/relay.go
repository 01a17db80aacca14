package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/wabarelay/wabarelay/admission"
	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/relay"
	"github.com/wabarelay/wabarelay/store"
)

func init() {
	caddy.RegisterModule(new(RelayHandler))
}

// Relay rate-limit defaults: per channel, in any rolling window.
const (
	defaultRelayRequests = 100
	defaultRelayWindow   = time.Minute
)

// RelayHandler is the relay (package relay) as a Caddy HTTP handler: it authenticates channel
// tokens and checks the relay scope, applies the per-channel rate limit and idempotency keys,
// swaps the channel token for the channel's upstream access token and hands the call to the
// next handler — the reverse_proxy that `wabarelay_proxy` puts after it — whose answer it
// inspects only where it must. It sets `{http.auth.user.id}` to the channel id.
type RelayHandler struct {
	// Requests is the most calls accepted per channel in any rolling Window, shared by every
	// instance when the app has Redis. Default: 100.
	Requests int `json:"requests,omitempty"`
	// Window is the rolling window of the rate limit. Default: 1m.
	Window caddy.Duration `json:"window,omitempty"`
	// WindowGuard is what the relay does with the customer-service window of a send's
	// recipient: "annotate" (the Wabarelay-Window header on every send with a "to"),
	// "enforce" (the header, and a free-form send to a closed window answered locally with
	// the upstream's 131047 error, no upstream call) or "off" (neither). Default: annotate.
	WindowGuard string `json:"window_guard,omitempty"`

	app     *App
	relay   *relay.Relay
	limiter limiterHandle
}

// CaddyModule returns the Caddy module information.
func (*RelayHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.wabarelay_relay", New: func() caddy.Module { return new(RelayHandler) }}
}

// Provision sets up the handler on the app's channel cache, stores and clients, and registers
// its relay and limit with the app: the broadcasts send through the first relay handler
// provisioned, sharing its per-channel limit with its callers (App.registerRelay).
func (h *RelayHandler) Provision(ctx caddy.Context) (err error) {
	if h.app, err = appFrom(ctx); err != nil {
		return err
	}
	if h.Requests <= 0 {
		h.Requests = defaultRelayRequests
	}
	if h.Window <= 0 {
		h.Window = caddy.Duration(defaultRelayWindow)
	}
	guard, err := relay.ParseWindowGuard(h.WindowGuard)
	if err != nil {
		return err
	}
	a := h.app
	adm, limiter := a.newRelayAdmission(h.Requests, time.Duration(h.Window))
	h.limiter = limiter
	h.relay = &relay.Relay{
		Channels:      a.cache,
		Objects:       a.store,
		Admission:     adm,
		Guard:         a.authGuard,
		UpstreamBase:  strings.TrimRight(a.upstream.Path, "/"),
		ProxyBase:     a.proxyBase,
		Authenticated: setAuthUser,
		Pending:       &a.afterAnswer,
		Metrics:       newRelayMetrics(a.metrics),
		CallLog:       a.callLog(),
		Logger:        a.logger,
		Windows:       a.windows,
		WindowGuard:   guard,
	}
	a.registerRelay(h.relay, h.Requests, time.Duration(h.Window))
	return nil
}

// Cleanup releases the rate limiter.
func (h *RelayHandler) Cleanup() error {
	return h.limiter.release()
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *RelayHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	r = withClient(r)
	caddyhttp.SetVar(r.Context(), upstreamVar, h.app.upstreamDial)
	h.relay.Serve(w, r, func(w http.ResponseWriter, r *http.Request) error {
		err := next.ServeHTTP(w, r)
		var he caddyhttp.HandlerError
		if errors.As(err, &he) && he.StatusCode == http.StatusGatewayTimeout {
			return fmt.Errorf("%w: %w", relay.ErrUpstreamTimeout, err)
		}
		return err
	})
	return nil
}

// newRelayAdmission returns the relay's admission for a limit of limit calls per window: on
// Redis (limit log and idempotency claim in one script; the limit falls back to memory while
// Redis is down) when the app has Redis, else in memory.
func (a *App) newRelayAdmission(limit int, window time.Duration) (*admission.Admission, limiterHandle) {
	const prefix = "wabarelay:relay:"
	mem, key := acquireMemoryLimiter(prefix, limit, window)
	if a.idem.redis == nil {
		return admission.NewMemory(mem, a.idem), limiterHandle{mem, key}
	}
	limitLog := ratelimit.NewRedis(a.redis, limit, window, prefix)
	return admission.NewRedis(a.redis, limitLog, a.idem.redis, mem, a.logger), limiterHandle{mem, key}
}

// proxyBase is {proxy_url}: configured, or the scheme, host and path prefix of the original
// request that `handle_path` stripped before relayPath.
func (a *App) proxyBase(r *http.Request, relayPath string) string {
	if a.ProxyURL != "" {
		return a.ProxyURL
	}
	prefix := ""
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok {
		prefix = strings.TrimSuffix(orig.URL.Path, relayPath)
	}
	return httpx.Origin(r) + prefix
}

// setAuthUser sets {http.auth.user.id} to the channel id, for Caddy's access logs.
func setAuthUser(r *http.Request, ch *store.RelayChannel) {
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Set("http.auth.user.id", ch.ID.String())
	}
}

// relayMetrics records the relay's outcomes in the app's collectors.
type relayMetrics struct {
	m        *metrics
	outcomes map[relay.Outcome]prometheus.Counter // the relay_requests_total child of each known outcome
}

func newRelayMetrics(m *metrics) relayMetrics {
	rm := relayMetrics{m: m, outcomes: map[relay.Outcome]prometheus.Counter{}}
	for _, o := range relay.Outcomes() {
		rm.outcomes[o] = m.relayRequests.WithLabelValues(string(o))
	}
	return rm
}

func (rm relayMetrics) Answered(outcome relay.Outcome) {
	c, ok := rm.outcomes[outcome]
	if !ok {
		c = rm.m.relayRequests.WithLabelValues(string(outcome))
	}
	c.Inc()
	switch outcome {
	case relay.OutcomeRateLimited:
		rm.m.rateLimited.Inc()
	case relay.OutcomeReplayed:
		rm.m.replays.Inc()
	}
}

func (rm relayMetrics) UpstreamLatency(d time.Duration) { rm.m.upstreamLatency.Observe(d.Seconds()) }

func (rm relayMetrics) MediaBytes(direction string, n int64) {
	rm.m.mediaBytes.WithLabelValues(direction).Add(float64(n))
}

func (rm relayMetrics) MediaFirstByte(d time.Duration) { rm.m.mediaFirstByte.Observe(d.Seconds()) }

// Interface guards.
var (
	_ caddyhttp.MiddlewareHandler = (*RelayHandler)(nil)
	_ caddy.Provisioner           = (*RelayHandler)(nil)
	_ caddy.CleanerUpper          = (*RelayHandler)(nil)
	_ relay.Metrics               = relayMetrics{}
	_ relay.Admission             = (*admission.Admission)(nil)
)
