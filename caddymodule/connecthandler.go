package caddymodule

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/wabarelay/wabarelay/connect"
	"github.com/wabarelay/wabarelay/graph"
)

func init() {
	caddy.RegisterModule(new(ConnectHandler))
	httpcaddyfile.RegisterHandlerDirective("wabarelay_connect", parseConnectHandler)
	httpcaddyfile.RegisterDirectiveOrder("wabarelay_connect", httpcaddyfile.Before, "reverse_proxy")
}

// DefaultSDKURL is the upstream JS SDK the connect page loads by default.
const DefaultSDKURL = "https://connect.facebook.net/en_US/sdk.js"

// ConnectHandler serves connect links ({connect_base}/connect/<channel_token>): the Embedded
// Signup page and its completion. Mount it without stripping the path:
// `handle /connect/* { wabarelay_connect }`. Settings come from the app's `meta` block.
type ConnectHandler struct {
	// OriginSuffix is the origin suffix the page accepts Embedded Signup messages from.
	// Default: facebook.com. (Tests point the SDK at a local stub.)
	OriginSuffix string `json:"origin_suffix,omitempty"`

	handler *connect.Handler
}

// CaddyModule returns the Caddy module information.
func (*ConnectHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.wabarelay_connect", New: func() caddy.Module { return new(ConnectHandler) }}
}

// Provision sets up the handler.
func (h *ConnectHandler) Provision(ctx caddy.Context) error {
	app, err := appFrom(ctx)
	if err != nil {
		return err
	}
	meta := app.meta
	version := ""
	if segs := strings.Split(strings.Trim(app.upstream.Path, "/"), "/"); len(segs) > 0 {
		version = segs[len(segs)-1]
	}
	h.handler, err = connect.New(connect.Options{
		Store: app.store, Graph: graph.New(app.Upstream, nil),
		AppID: meta.AppID, AppSecret: meta.AppSecret, ConfigID: meta.ConfigID, SDKURL: meta.SDKURL,
		GraphVersion: version, RegisterPIN: app.registerPIN, ConnectBase: app.ConnectBase,
		OriginSuffix: h.OriginSuffix, Logger: ctx.Logger(), AuthGuard: app.authGuard,
	})
	return err
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *ConnectHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	h.handler.ServeHTTP(w, withClient(r))
	return nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	wabarelay_connect {
//		origin_suffix <suffix>   # default facebook.com
//	}
func (h *ConnectHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "origin_suffix":
			if err := oneArg(d, &h.OriginSuffix); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized wabarelay_connect option %q", d.Val())
		}
	}
	return nil
}

func parseConnectHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(ConnectHandler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*ConnectHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*ConnectHandler)(nil)
	_ caddyfile.Unmarshaler       = (*ConnectHandler)(nil)
)
