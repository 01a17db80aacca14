package caddymodule

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/wabarelay/wabarelay/dashboard"
)

func init() {
	caddy.RegisterModule(new(DashboardHandler))
	httpcaddyfile.RegisterHandlerDirective("wabarelay_dashboard", parseDashboardHandler)
	httpcaddyfile.RegisterDirectiveOrder("wabarelay_dashboard", httpcaddyfile.Before, "reverse_proxy")
}

// DashboardHandler serves the operators' web dashboard (package dashboard) under BasePath.
// Mount it without stripping the path: `handle /dashboard* { wabarelay_dashboard }`. It needs the
// `wabarelay` app, whose store, management API rules and rate limit it uses.
type DashboardHandler struct {
	// BasePath is the path the dashboard is mounted at. Default: /dashboard.
	BasePath string `json:"base_path,omitempty"`
	// SessionTTL is how long a sign-in lasts (never past its key's expiry). Default: 12h.
	SessionTTL caddy.Duration `json:"session_ttl,omitempty"`
	// Demo turns on the demo page, for a service running against the fake upstream.
	Demo *DashboardDemo `json:"demo,omitempty"`

	handler *dashboard.Handler
}

// DashboardDemo configures the dashboard's demo page. Values may be {env.*} placeholders; an
// empty FakeUpstream after resolution leaves the demo off, so one Caddyfile serves both the
// demo and a real deployment.
type DashboardDemo struct {
	// FakeUpstream is the fake upstream's base URL (scheme and host), whose POST /_fake/inbound
	// sends the service an incoming message.
	FakeUpstream string `json:"fake_upstream,omitempty"`
	// ReceiverBase is the HTTPS origin serving this dashboard for the demo receiver, e.g.
	// https://localhost:8443 (webhook URLs must be https).
	ReceiverBase string `json:"receiver_base,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (*DashboardHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.wabarelay_dashboard", New: func() caddy.Module { return new(DashboardHandler) }}
}

// Provision sets up the handler.
func (h *DashboardHandler) Provision(ctx caddy.Context) error {
	app, err := appFrom(ctx)
	if err != nil {
		return err
	}
	logger := ctx.Logger()
	opt := dashboard.Options{
		Store: app.store, API: app.managementHandler(logger), BasePath: h.BasePath,
		ConnectBase: app.ConnectBase, SessionTTL: time.Duration(h.SessionTTL), AuthGuard: app.authGuard, Logger: logger,
	}
	if h.Demo != nil {
		repl := caddy.NewReplacer()
		fake, err := resolveSecret(repl, "demo fake_upstream", h.Demo.FakeUpstream, false)
		if err != nil {
			return err
		}
		recv, err := resolveSecret(repl, "demo receiver_base", h.Demo.ReceiverBase, false)
		if err != nil {
			return err
		}
		if fake != "" {
			opt.Demo = &dashboard.Demo{FakeUpstream: fake, ReceiverBase: recv}
		}
	}
	h.handler, err = dashboard.New(opt)
	return err
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *DashboardHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	h.handler.ServeHTTP(w, withClient(r))
	return nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	wabarelay_dashboard {
//		base_path   /dashboard
//		session_ttl 12h
//		demo {
//			fake_upstream <url>
//			receiver_base <https origin>
//		}
//	}
func (h *DashboardHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "base_path":
			if !d.AllArgs(&h.BasePath) {
				return d.ArgErr()
			}
		case "session_ttl":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("session_ttl: %q is not a positive duration", v)
			}
			h.SessionTTL = caddy.Duration(dur)
		case "demo":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.Demo = new(DashboardDemo)
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				switch d.Val() {
				case "fake_upstream":
					if !d.AllArgs(&h.Demo.FakeUpstream) {
						return d.ArgErr()
					}
				case "receiver_base":
					if !d.AllArgs(&h.Demo.ReceiverBase) {
						return d.ArgErr()
					}
				default:
					return d.Errf("unknown demo option %q", d.Val())
				}
			}
		default:
			return d.Errf("unknown wabarelay_dashboard option %q", d.Val())
		}
	}
	return nil
}

func parseDashboardHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(DashboardHandler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*DashboardHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*DashboardHandler)(nil)
	_ caddyfile.Unmarshaler       = (*DashboardHandler)(nil)
)
