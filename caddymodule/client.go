package caddymodule

import (
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/wabarelay/wabarelay/internal/authguard"
	"github.com/wabarelay/wabarelay/internal/httpx"
)

// withClient returns r carrying Caddy's view of the client (see httpx.Client): the client IP
// Caddy determined (through `trusted_proxies` when configured), and HTTPS when Caddy terminated
// TLS itself or the request came from a trusted proxy that forwarded `X-Forwarded-Proto: https`.
// A header from an untrusted peer is ignored.
func withClient(r *http.Request) *http.Request {
	c := httpx.Client{HTTPS: r.TLS != nil}
	if ip, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok {
		c.Addr = ip
	}
	if trusted, _ := caddyhttp.GetVar(r.Context(), caddyhttp.TrustedProxyVarKey).(bool); trusted && !c.HTTPS {
		proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
		c.HTTPS = strings.EqualFold(strings.TrimSpace(proto), "https")
	}
	return r.WithContext(httpx.WithClient(r.Context(), c))
}

// Authentication-failure guard defaults: an address that presents this many bad credentials
// (API keys, channel tokens, connect links) within the window is refused with 429 until the
// window ends, before any lookup.
const (
	authFailures = 20
	authWindow   = time.Minute
)

// newAuthGuard returns the app's guard against credential floods, shared by every handler of
// the app.
func newAuthGuard() *authguard.Guard {
	return authguard.New(authFailures, authWindow, authguard.DefaultMaxAddrs)
}
