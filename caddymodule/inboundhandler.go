package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/store"
	"github.com/wabarelay/wabarelay/traces"
)

func init() {
	caddy.RegisterModule(new(InboundHandler))
	httpcaddyfile.RegisterHandlerDirective("wabarelay_inbound", parseInboundHandler)
	httpcaddyfile.RegisterDirectiveOrder("wabarelay_inbound", httpcaddyfile.Before, "reverse_proxy")
}

// InboundHandler receives the upstream's webhooks (the callback URL given to the upstream app,
// e.g. `handle /webhooks/upstream { wabarelay_inbound }`). GET answers the verification with
// `meta.verify_token`; POST verifies X-Hub-Signature-256 with `meta.app_secret`, splits the
// batch into one event per message and status, and stores the events with their deliveries in
// one transaction before answering 200. It answers 503 (so the upstream retries) when the
// events could not be stored, and never 200 for anything it did not store. The work is the
// app's inbound.Handler's (one per config, shared by every wabarelay_inbound route).
type InboundHandler struct {
	app *App
}

// CaddyModule returns the Caddy module information.
func (*InboundHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.wabarelay_inbound", New: func() caddy.Module { return new(InboundHandler) }}
}

// Provision sets up the handler.
func (h *InboundHandler) Provision(ctx caddy.Context) (err error) {
	h.app, err = appFrom(ctx)
	return err
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *InboundHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	h.app.inbound.ServeHTTP(w, r)
	return nil
}

// newInbound makes the app's inbound handler: the inbound webhooks of this config take turns
// on half its database connections (inbound package documentation), hand off to the dispatcher
// this config starts, and feed the inbound metrics.
func (a *App) newInbound() (*inbound.Handler, error) {
	return inbound.New(inbound.Config{
		AppSecret:   a.meta.AppSecret,
		VerifyToken: a.meta.VerifyToken,
		Store:       a.store,
		HandOff: func() inbound.HandOff {
			if d := a.dispatcher; d != nil {
				return d
			}
			return nil // delivery { workers 0 }, or not started yet
		},
		Invalidate:  a.cache.Invalidate,
		Concurrency: max(1, int(a.pool.Config().MaxConns)/2),
		Observer:    inboundObserver{a.metrics},
		Logger:      a.logger,
		Traces:      &tracerProvider,
	})
}

// tracerProvider remembers Caddy's TracerProvider from the posts traced by its `tracing`
// directive, for the dispatcher's spans. Process-wide like Caddy's provider: it outlives
// config reloads (a reload that keeps a `tracing` directive keeps Caddy's provider).
var tracerProvider traces.Provider

// inboundObserver feeds the inbound metrics.
type inboundObserver struct{ m *metrics }

func (o inboundObserver) Rejected()  { o.m.inboundRejected.Inc() }
func (o inboundObserver) Malformed() { o.m.inboundMalformed.Inc() }
func (o inboundObserver) Overflow()  { o.m.inboundOverflow.Inc() }

func (o inboundObserver) Stored(res store.InboundResult) {
	for typ, n := range res.ByType {
		o.m.inboundEvents.WithLabelValues(typ).Add(float64(n))
	}
	o.m.inboundDuplicates.Add(float64(res.Duplicates))
	o.m.inboundUnknown.Add(float64(res.Unknown))
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax: `wabarelay_inbound`.
func (h *InboundHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() || d.NextBlock(0) {
		return d.ArgErr()
	}
	return nil
}

func parseInboundHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(InboundHandler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*InboundHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*InboundHandler)(nil)
	_ caddyfile.Unmarshaler       = (*InboundHandler)(nil)
	_ inbound.Observer            = inboundObserver{}
)
