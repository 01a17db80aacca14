package caddymodule

import (
	"context"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/graph"
	"github.com/wabarelay/wabarelay/health"
)

// The number health worker's glue (package health): its option, its start and stop.

// healthRefreshOff is the value of health_refresh that turns the periodic read off.
const healthRefreshOff = "off"

// parseHealthRefresh reads health_refresh: "" (the default), "off", or a positive duration.
func parseHealthRefresh(v string) (refresh time.Duration, off bool, err error) {
	switch v {
	case "":
		return 0, false, nil
	case healthRefreshOff:
		return 0, true, nil
	}
	d, err := caddy.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, false, fmt.Errorf("health_refresh: want a positive duration or off, got %q", v)
	}
	return d, false, nil
}

// healthConfig is the worker's configuration from health_refresh (checked by Validate).
func (a *App) healthConfig() health.Config {
	refresh, off, _ := parseHealthRefresh(a.HealthRefresh)
	return health.Config{Refresh: refresh, NoRefresh: off, Observer: qualityObserver{a.metrics}}
}

// startHealth starts the number health worker until ctx ends; Stop waits for it (healthDone).
func (a *App) startHealth(ctx context.Context) {
	w := health.New(a.store, graph.New(a.Upstream, nil), a.healthConfig(), a.logger.Named("health"))
	a.healthDone = make(chan struct{})
	go func() {
		defer close(a.healthDone)
		defer func() {
			if v := recover(); v != nil {
				a.logger.Error("number health worker panicked", zap.Any("panic", v))
			}
		}()
		w.Run(ctx)
	}()
}

// stopHealth waits (bounded) for the worker, whose context Stop has cancelled.
func (a *App) stopHealth() {
	if a.healthDone == nil {
		return
	}
	select {
	case <-a.healthDone:
	case <-time.After(graph.DefaultTimeout + 5*time.Second):
		a.logger.Warn("number health worker did not stop in time; its claims will expire")
	}
}

// qualityObserver feeds caddy_wabarelay_channels_by_quality.
type qualityObserver struct{ m *metrics }

func (o qualityObserver) ChannelsByQuality(counts map[string]int) {
	if o.m == nil {
		return
	}
	o.m.channelsByQuality.Reset()
	for q, n := range counts {
		o.m.channelsByQuality.WithLabelValues(q).Set(float64(n))
	}
}
