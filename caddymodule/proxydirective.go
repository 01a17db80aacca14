package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/wabarelay/wabarelay/relay"
)

func init() {
	httpcaddyfile.RegisterDirective("wabarelay_proxy", parseProxyDirective)
	httpcaddyfile.RegisterDirectiveOrder("wabarelay_proxy", httpcaddyfile.Before, "reverse_proxy")
}

// upstreamTimeout bounds the wait for the upstream's response headers.
const upstreamTimeout = 30 * time.Second

// upstreamIdleConns is the most idle connections kept to the upstream. The relay sends every
// channel's calls to that one host, so over HTTP/1.1 it needs about as many connections as
// calls in flight; with Caddy's default (32 per host) every call beyond 32 at once would open a
// connection and close it after. Idle connections still close after the transport's idle
// timeout (2 min).
const upstreamIdleConns = 1024

// upstreamVar is the request variable holding the upstream's dial address, set by
// wabarelay_relay from the app's resolved `upstream` option.
const upstreamVar = "wabarelay_upstream"

// parseProxyDirective expands `wabarelay_proxy`, like php_fastcgi, into a subroute:
//
//	wabarelay_relay (auth, scope, rate limit, idempotency, token swap) → reverse_proxy (to the
//	app's `upstream`)
//
// Syntax:
//
//	wabarelay_proxy [<matcher>] {
//		rate_limit <requests> [<window>]   # per channel; default 100 1m
//		window_guard annotate|enforce|off  # the customer-service window; default annotate
//		<any reverse_proxy subdirective>    # e.g. flush_interval, transport http { ... }
//	}
//
// The upstream comes from the wabarelay global option. When it is a literal URL its scheme
// decides TLS; when it is a placeholder, TLS is assumed (the upstream is HTTPS in production).
func parseProxyDirective(h httpcaddyfile.Helper) ([]httpcaddyfile.ConfigValue, error) {
	h.Next() // directive name
	userMatcherSet, err := h.ExtractMatcherSet()
	if err != nil {
		return nil, err
	}
	// ExtractMatcherSet rewinds the dispenser: consume the directive name again (as
	// php_fastcgi does), or the segment below starts before it and reverse_proxy, seeing no
	// block, would drop every line passed to it.
	h.Next()
	relayHandler := new(RelayHandler)
	dispenser := h.NewFromNextSegment()
	for dispenser.Next() {
		if dispenser.NextArg() {
			return nil, dispenser.Err("wabarelay_proxy takes no arguments; its upstream is the wabarelay global option's `upstream`")
		}
		for dispenser.NextBlock(0) {
			switch dispenser.Val() {
			case "rate_limit":
				args := dispenser.RemainingArgs()
				if len(args) < 1 || len(args) > 2 {
					return nil, dispenser.ArgErr()
				}
				n, err := strconv.Atoi(args[0])
				if err != nil || n <= 0 {
					return nil, dispenser.Errf("rate_limit: requests must be a positive integer, got %q", args[0])
				}
				relayHandler.Requests = n
				if len(args) == 2 {
					w, err := caddy.ParseDuration(args[1])
					if err != nil || w <= 0 {
						return nil, dispenser.Errf("rate_limit: invalid window %q", args[1])
					}
					relayHandler.Window = caddy.Duration(w)
				}
				dispenser.DeleteN(len(args) + 1)
			case "window_guard":
				args := dispenser.RemainingArgs()
				if len(args) != 1 {
					return nil, dispenser.ArgErr()
				}
				if _, err := relay.ParseWindowGuard(args[0]); err != nil || args[0] == "" {
					return nil, dispenser.Errf("window_guard: annotate, enforce or off, not %q", args[0])
				}
				relayHandler.WindowGuard = args[0]
				dispenser.DeleteN(len(args) + 1)
			case "to":
				return nil, dispenser.Err("wabarelay_proxy takes its upstream from the wabarelay global option's `upstream`")
			}
		}
	}
	dispenser.Reset()

	useTLS := true
	if app, ok := h.Option("wabarelay").(httpcaddyfile.App); ok {
		var cfg App
		if json.Unmarshal(app.Value, &cfg) == nil && cfg.Upstream != "" && !strings.Contains(cfg.Upstream, "{") {
			u, err := url.Parse(cfg.Upstream)
			if err != nil || u.Host == "" {
				return nil, h.Errf("wabarelay upstream %q is not a URL", cfg.Upstream)
			}
			useTLS = u.Scheme == "https"
		}
	}

	rp := new(reverseproxy.Handler)
	if err := rp.UnmarshalCaddyfile(dispenser); err != nil {
		return nil, err
	}
	if err := rp.FinalizeUnmarshalCaddyfile(h); err != nil {
		return nil, err
	}
	rp.Upstreams = reverseproxy.UpstreamPool{{Dial: "{http.vars." + upstreamVar + "}"}}
	if rp.TransportRaw == nil {
		transport := &reverseproxy.HTTPTransport{ResponseHeaderTimeout: caddy.Duration(upstreamTimeout),
			KeepAlive: &reverseproxy.KeepAlive{MaxIdleConnsPerHost: upstreamIdleConns}}
		if useTLS {
			transport.TLS = new(reverseproxy.TLSConfig)
		}
		rp.TransportRaw = caddyconfig.JSONModuleObject(transport, "protocol", "http", nil)
	} else if rp.TransportRaw, err = withRelayTransportDefaults(rp.TransportRaw, useTLS); err != nil {
		return nil, h.Errf("wabarelay_proxy transport: %v", err)
	}
	if rp.Headers == nil {
		rp.Headers = new(headers.Handler)
	}
	if rp.Headers.Request == nil {
		rp.Headers.Request = new(headers.HeaderOps)
	}
	if rp.Headers.Request.Set == nil {
		rp.Headers.Request.Set = http.Header{}
	}
	rp.Headers.Request.Set.Set("Host", "{http.reverse_proxy.upstream.hostport}")

	route := caddyhttp.Route{HandlersRaw: []json.RawMessage{
		caddyconfig.JSONModuleObject(relayHandler, "handler", "wabarelay_relay", nil),
		caddyconfig.JSONModuleObject(rp, "handler", "reverse_proxy", nil),
	}}
	subroute := caddyhttp.Subroute{Routes: caddyhttp.RouteList{route}}
	if userMatcherSet != nil {
		return []httpcaddyfile.ConfigValue{{Class: "route", Value: caddyhttp.Route{
			MatcherSetsRaw: []caddy.ModuleMap{userMatcherSet},
			HandlersRaw:    []json.RawMessage{caddyconfig.JSONModuleObject(subroute, "handler", "subroute", nil)},
		}}}, nil
	}
	return []httpcaddyfile.ConfigValue{{Class: "route", Value: subroute}}, nil
}

// withRelayTransportDefaults completes a `transport http { ... }` given in wabarelay_proxy with
// what the relay needs and the lines do not say: TLS to an https upstream, the upstream
// response header timeout and the idle connections kept (upstreamIdleConns). Every setting
// given is kept; other transports are left as they are.
func withRelayTransportDefaults(raw json.RawMessage, useTLS bool) (json.RawMessage, error) {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if m["protocol"] != "http" {
		return raw, nil
	}
	if _, ok := m["tls"]; !ok && useTLS {
		m["tls"] = map[string]any{}
	}
	if _, ok := m["response_header_timeout"]; !ok {
		m["response_header_timeout"] = upstreamTimeout
	}
	keepAlive, _ := m["keep_alive"].(map[string]any)
	if keepAlive == nil {
		keepAlive = map[string]any{}
	}
	if _, ok := keepAlive["max_idle_conns_per_host"]; !ok {
		keepAlive["max_idle_conns_per_host"] = upstreamIdleConns
		m["keep_alive"] = keepAlive
	}
	return json.Marshal(m)
}
