package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/graph"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
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
// It needs the `wabarelay` app. It sets `{http.auth.user.id}` to the API key's id, so access
// logs show which key made a call (never the key itself).
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
	h.handler = app.managementHandler(ctx.Logger())
	return nil
}

// managementHandler returns the management API handler over the app's store, limiter and
// settings; the API module serves it, the dashboard makes its changes through its Service.
func (a *App) managementHandler(logger *zap.Logger) *managementapi.Handler {
	var limits LimitsConfig // zero: managementapi's defaults
	if a.Limits != nil {
		limits = *a.Limits
	}
	return managementapi.New(managementapi.Options{
		Store:          a.store,
		Limiter:        a.mgmtLimiter.Limiter,
		Health:         a.Health,
		ConnectBase:    a.ConnectBase,
		ConnectLinkTTL: time.Duration(a.ConnectLinkTTL),
		Logger:         logger,
		OnReplayBacklog: func() {
			if a.metrics != nil {
				a.metrics.replayBacklog.Inc()
			}
		},
		AfterChannelDeleted: func(d store.DeletedChannel) {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if err := graph.New(a.Upstream, nil).UnsubscribeApp(ctx, d.UpstreamToken, d.WabaID); err != nil {
				logger.Warn("unsubscribing a deleted channel's business account failed", zap.String("waba_id", d.WabaID), zap.Error(err))
			}
		},
		AuthGuard: a.authGuard,
		OnAuthenticated: func(r *http.Request, key store.APIKey) {
			if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
				repl.Set("http.auth.user.id", key.ID.String())
			}
		},
		MaxWebhooksPerOrg: limits.WebhooksPerOrg,
		MaxAPIKeysPerOrg:  limits.APIKeysPerOrg,
		Retention:         a.retentionPolicy().Retention,
	})
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
