package caddymodule

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/dashboard"
)

func init() {
	caddy.RegisterModule(new(DashboardHandler))
	httpcaddyfile.RegisterHandlerDirective("wabarelay_dashboard", parseDashboardHandler)
	httpcaddyfile.RegisterDirectiveOrder("wabarelay_dashboard", httpcaddyfile.Before, "reverse_proxy")
}

// DashboardHandler serves the operators' web dashboard (package dashboard) under BasePath.
// Mount it without stripping the path: `handle /dashboard* { wabarelay_dashboard }`. It needs the
// `wabarelay` app, whose management Service (shared with the API: its rules and rate limit) it
// reads and changes through, and whose store keeps its sessions.
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
	// Receiver is the base URL of the fake's HTTPS webhook receiver, e.g.
	// https://127.0.0.1:8091: the org's demo webhook points under it, and the demo page reads
	// and verifies what it received.
	Receiver string `json:"receiver,omitempty"`
	// ReceiverCA is a PEM file of the CA that issued the receiver's certificate (trusted, in
	// addition to the system's, for the demo page's calls).
	ReceiverCA string `json:"receiver_ca,omitempty"`
	// Relay is the relay's base URL that the demo page's "Send 10 demo messages" calls with a
	// channel's token, as a customer's backend would (e.g.
	// http://localhost:8080/upstream-proxy); empty after resolution leaves the button off.
	// Default: the wabarelay app's proxy_url.
	Relay string `json:"relay,omitempty"`
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
		Store: app.store, API: app.service, BasePath: h.BasePath,
		SessionTTL: time.Duration(h.SessionTTL), AuthGuard: app.authGuard, Logger: logger,
	}
	if h.Demo != nil {
		repl := caddy.NewReplacer()
		fake, err := resolveSecret(repl, "demo fake_upstream", h.Demo.FakeUpstream, false)
		if err != nil {
			return err
		}
		recv, err := resolveSecret(repl, "demo receiver", h.Demo.Receiver, false)
		if err != nil {
			return err
		}
		caFile, err := resolveSecret(repl, "demo receiver_ca", h.Demo.ReceiverCA, false)
		if err != nil {
			return err
		}
		relay, err := resolveSecret(repl, "demo relay", h.Demo.Relay, false)
		if err != nil {
			return err
		}
		if relay == "" {
			relay = app.ProxyURL
		}
		if fake != "" {
			client, err := demoClient(caFile)
			if err != nil {
				return err
			}
			opt.Demo = &dashboard.Demo{FakeUpstream: fake, Receiver: recv, Relay: relay, Client: client}
			logger.Warn("dashboard demo page is on: it makes the fake upstream send messages and reads its receiver (development only)",
				zap.String("fake_upstream", fake))
		}
	}
	h.handler, err = dashboard.New(opt)
	return err
}

// demoClient is the demo page's client for the fake upstream and its receiver, trusting caFile
// (when set) besides the system's roots.
func demoClient(caFile string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("demo receiver_ca: %w", err)
		}
		roots, err := x509.SystemCertPool()
		if err != nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("demo receiver_ca: no certificate in %s", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr, Timeout: 15 * time.Second}, nil
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
//			receiver      <https url>
//			receiver_ca   <pem file>
//			relay         <url>
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
				case "receiver":
					if !d.AllArgs(&h.Demo.Receiver) {
						return d.ArgErr()
					}
				case "receiver_ca":
					if !d.AllArgs(&h.Demo.ReceiverCA) {
						return d.ArgErr()
					}
				case "relay":
					if !d.AllArgs(&h.Demo.Relay) {
						return d.ArgErr()
					}
				default:
					return d.Errf("unrecognized demo option %q", d.Val())
				}
			}
		default:
			return d.Errf("unrecognized wabarelay_dashboard option %q", d.Val())
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
