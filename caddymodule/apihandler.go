package caddymodule

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/wabarelay/wabarelay/managementapi"
)

func init() {
	caddy.RegisterModule(new(APIHandler))
	httpcaddyfile.RegisterHandlerDirective("wabarelay_api", parseAPIHandler)
	httpcaddyfile.RegisterDirectiveOrder("wabarelay_api", httpcaddyfile.Before, "reverse_proxy")
}

// APIHandler serves the management API ({base_url}): channels, webhooks and channel
// assignments, authenticated by the x-api-key header. Mount it where its path prefix is
// stripped, e.g. `handle_path /v1/* { wabarelay_api }`. It answers every request it receives
// (unknown paths get a JSON 404) and never calls the next handler.
//
// It needs the `wabarelay` app, whose management Service it serves (shared with the dashboard).
// It sets `{http.auth.user.id}` to the API key's id, so access logs show which key made a call
// (never the key itself).
type APIHandler struct {
	handler *managementapi.Handler
}

// CaddyModule returns the Caddy module information.
func (*APIHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.wabarelay_api", New: func() caddy.Module { return new(APIHandler) }}
}

// appFrom returns the configured wabarelay app.
func appFrom(ctx caddy.Context) (*App, error) {
	v, err := ctx.AppIfConfigured("wabarelay")
	if errors.Is(err, caddy.ErrNotConfigured) {
		return nil, fmt.Errorf("the wabarelay app is not configured (add a `wabarelay { ... }` global option): %w", err)
	}
	if err != nil {
		// configured but invalid: its own error names the setting
		return nil, err
	}
	return v.(*App), nil
}

// Provision sets up the handler.
func (h *APIHandler) Provision(ctx caddy.Context) error {
	app, err := appFrom(ctx)
	if err != nil {
		return err
	}
	h.handler = managementapi.NewHandler(app.service)
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *APIHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	h.handler.ServeHTTP(w, withClient(r))
	return nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	wabarelay_api
//
// The directive takes no arguments; everything is configured in the `wabarelay` global option.
func (h *APIHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("wabarelay_api takes no block; configure the wabarelay global option")
	}
	return nil
}

func parseAPIHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(APIHandler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*APIHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*APIHandler)(nil)
	_ caddyfile.Unmarshaler       = (*APIHandler)(nil)
)
