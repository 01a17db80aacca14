package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/broadcast"
	"github.com/wabarelay/wabarelay/relay"
)

// The broadcast sender's glue (package broadcast): its option, the relay it sends through, its
// start and stop.

// BroadcastsConfig configures the broadcast sender: the goroutines of this instance that send
// the broadcasts' recipients through the relay, each broadcast paced by its rate_per_minute
// across every instance (docs/broadcasts.md).
type BroadcastsConfig struct {
	// Workers is the number of broadcast sends in flight on this instance. The pace of a
	// broadcast is its rate, not this; a few workers keep up with any rate whose sends take
	// less than workers × 60 s / rate each. 0 means this instance sends no broadcasts (other
	// instances on the same database do); negative is an error. Default (unset): 4.
	Workers *int `json:"workers,omitempty"`
	// Lease is how long a claimed recipient stays reserved for the send; one whose instance
	// died meanwhile becomes `unknown` (never sent again) once its lease has run out. It must
	// be longer than the relay's send deadline (90s). Default: 2m.
	Lease caddy.Duration `json:"lease,omitempty"`
}

func (c *BroadcastsConfig) unmarshal(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch opt := d.Val(); opt {
		case "workers":
			// 0 is meaningful (no broadcast sends on this instance), so it is kept as a pointer.
			var v string
			if err := oneArg(d, &v); err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return d.Errf("broadcasts: workers must be 0 (no broadcast sends on this instance) or more, got %q", v)
			}
			c.Workers = &n
		case "lease":
			if err := durationArg(d, &c.Lease); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized broadcasts option %q", opt)
		}
	}
	return nil
}

// validate checks the options (App.Validate).
func (c *BroadcastsConfig) validate() error {
	if c == nil {
		return nil
	}
	if c.Workers != nil && *c.Workers < 0 {
		return fmt.Errorf("broadcasts: workers must be 0 (no broadcast sends on this instance) or more, got %d", *c.Workers)
	}
	if c.Lease != 0 && time.Duration(c.Lease) <= relay.SendDeadline {
		return fmt.Errorf("broadcasts: lease must be longer than the relay's send deadline (%s), got %s",
			relay.SendDeadline, time.Duration(c.Lease))
	}
	return nil
}

// broadcastConfig is the worker's configuration and whether this instance runs it.
func (a *App) broadcastConfig() (cfg broadcast.Config, run bool) {
	c := a.Broadcasts
	if c == nil {
		return cfg, true
	}
	if c.Workers != nil {
		if *c.Workers == 0 {
			return cfg, false
		}
		cfg.Workers = *c.Workers
	}
	cfg.Lease = time.Duration(c.Lease)
	return cfg, true
}

// relaySender is the relay a wabarelay_proxy handler registered for the broadcasts, with its
// rate limit.
type relaySender struct {
	relay  *relay.Relay
	limit  int           // calls per window
	window time.Duration // of the limit
}

// registerRelay records the relay of a wabarelay_proxy handler (RelayHandler.Provision): the
// broadcasts send through it, sharing its per-channel limit with the callers, and the
// management API's rate_per_minute is bounded by that limit. The first handler provisioned
// wins: a configuration with several relay handlers should give them the same limit.
func (a *App) registerRelay(r *relay.Relay, limit int, window time.Duration) {
	a.relayMu.Lock()
	defer a.relayMu.Unlock()
	if a.sender.relay == nil {
		a.sender = relaySender{relay: r, limit: limit, window: window}
	}
}

// relayLimitPerMinute is the registered relay's per-channel limit in calls per minute (at
// least 1), or 0 when no relay handler is provisioned.
func (a *App) relayLimitPerMinute() int {
	a.relayMu.Lock()
	defer a.relayMu.Unlock()
	s := a.sender
	if s.relay == nil || s.limit <= 0 || s.window <= 0 {
		return 0
	}
	return max(1, int(int64(s.limit)*int64(time.Minute)/int64(s.window)))
}

// startBroadcasts starts the broadcast sender until ctx ends; Stop waits for it (broadcastDone).
// It starts none with broadcasts { workers 0 } or when no relay handler is configured.
func (a *App) startBroadcasts(ctx context.Context) {
	cfg, run := a.broadcastConfig()
	if !run {
		a.logger.Info("broadcasts workers 0: this instance sends no broadcasts; other instances on the database do")
		return
	}
	a.relayMu.Lock()
	r := a.sender.relay
	a.relayMu.Unlock()
	if r == nil {
		a.logger.Info("no wabarelay_proxy handler in this configuration: this instance sends no broadcasts")
		return
	}
	sender := broadcast.RelaySender{Relay: r, Channels: a.cache, Upstream: a.broadcastUpstream(newUpstreamClient())}
	w := broadcast.New(a.store, sender, cfg, a.logger.Named("broadcast"))
	a.broadcastDone = make(chan struct{})
	go func() {
		defer close(a.broadcastDone)
		defer func() {
			if v := recover(); v != nil {
				a.logger.Error("broadcast sender panicked", zap.Any("panic", v))
			}
		}()
		w.Run(ctx)
	}()
}

// stopBroadcasts waits (bounded) for the sender, whose context Stop has cancelled: its sends in
// flight run to their end (at most the relay's send deadline) and their outcomes are written.
func (a *App) stopBroadcasts() {
	if a.broadcastDone == nil {
		return
	}
	select {
	case <-a.broadcastDone:
	case <-time.After(relay.SendDeadline + 5*time.Second):
		a.logger.Warn("broadcast sender did not stop in time; its recipients in flight become unknown when their leases end")
	}
}

// newUpstreamClient returns the HTTP client of the broadcasts' upstream calls. It has no
// overall timeout (each send's context carries the relay's send deadline) and follows no
// redirect (the upstream does not redirect sends; one would carry the access token elsewhere).
func newUpstreamClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 16
	t.ResponseHeaderTimeout = relay.SendDeadline
	return &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
}

// broadcastUpstream is the relay.Upstream of the broadcasts: the prepared request (path with
// the upstream's version, the channel's access token) sent to the app's upstream with hc, and
// the answer copied to w. A timeout is reported as relay.ErrUpstreamTimeout; an error after
// the answer began is a cut answer (relay.forward tells them apart).
func (a *App) broadcastUpstream(hc *http.Client) relay.Upstream {
	return func(w http.ResponseWriter, r *http.Request) error {
		out := r.Clone(r.Context())
		out.URL.Scheme, out.URL.Host = a.upstream.Scheme, a.upstream.Host
		out.Host, out.RequestURI = "", ""
		resp, err := hc.Do(out)
		if err != nil {
			if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("%w: %w", relay.ErrUpstreamTimeout, err)
			}
			return err
		}
		defer resp.Body.Close()
		h := w.Header()
		for k, v := range resp.Header {
			h[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, err = io.Copy(w, resp.Body)
		return err
	}
}
