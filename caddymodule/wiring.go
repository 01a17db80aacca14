package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/connect"
	"github.com/wabarelay/wabarelay/dispatcher"
	"github.com/wabarelay/wabarelay/graph"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/relay"
	"github.com/wabarelay/wabarelay/relaylog"
	"github.com/wabarelay/wabarelay/store"
)

// The app's wiring: what Provision builds from the resolved configuration and hands to the
// handlers (the store, the channel cache, the management Service, the limiters, the relay log)
// and the dispatcher's configuration.

// wire builds what the app shares with its handlers from the resolved configuration: the
// Postgres pool and Redis client (shared across reloads), the store, the relay's channel cache,
// the auth guard, the idempotency store, the metrics, the inbound handler, the management rate
// limiter, the relay log and the management Service. On error, what it acquired is released.
func (a *App) wire(ctx caddy.Context, redisCfg RedisConfig) (err error) {
	if a.pool, a.poolKey, err = acquirePool(a.database); err != nil {
		return err
	}
	if redisCfg.isSet() {
		if a.redis, a.redisKey, err = acquireRedis(redisCfg); err != nil {
			return errors.Join(err, a.Cleanup())
		}
	}
	a.store = store.New(a.pool, a.box)
	a.cache = relay.NewCache(a.store, relay.DefaultTTL)
	a.cache.SetLogger(a.logger)
	a.windows = relay.NewWindows(a.store, nil)
	a.windows.SetLogger(a.logger)
	a.cache.SetWindows(a.windows)
	a.authGuard = newAuthGuard()
	a.idem, a.idemKey = acquireIdempotency(a.redis, a.redisKey, a.logger)
	a.metrics = registerMetrics(ctx.GetMetricsRegistry())
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := reg.Register(newQueueCollector(a.pool)); err != nil {
			a.logger.Warn("delivery queue metrics not registered", zap.Error(err))
		}
	}
	if a.inbound, err = a.newInbound(); err != nil {
		return errors.Join(err, a.Cleanup())
	}
	mgmtLimit := a.ManagementRateLimit
	a.mgmtLimiter = a.newLimiter("wabarelay:mgmt:", mgmtLimit.Requests, time.Duration(mgmtLimit.Window))
	if c := a.RelayLog; c == nil || !c.Off {
		var cfg relaylog.Config
		if c != nil {
			cfg = relaylog.Config{Buffer: c.Buffer, Batch: c.Batch, Interval: time.Duration(c.Interval), PerChannel: c.PerChannel}
		}
		a.relayLog = relaylog.New(a.store, cfg, relayLogObserver{a.metrics}, a.logger.Named("relay_log"))
	}
	a.service = managementapi.NewService(a.managementOptions())
	return nil
}

// managementOptions are the management Service's options: the app's store, limiter, limits and
// connect settings. Its hooks set the access log's user, count refused replays, and undo a
// deleted channel's upstream subscription (connect.Unsubscriber).
func (a *App) managementOptions() managementapi.Options {
	var limits LimitsConfig // zero: managementapi's defaults
	if a.Limits != nil {
		limits = *a.Limits
	}
	logger := a.logger.Named("management")
	return managementapi.Options{
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
		AfterChannelDeleted: connect.Unsubscriber(graph.New(a.Upstream, nil), logger),
		AuthGuard:           a.authGuard,
		OnAuthenticated: func(r *http.Request, key store.APIKey) {
			if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
				repl.Set("http.auth.user.id", key.ID.String())
			}
		},
		MaxWebhooksPerOrg: limits.WebhooksPerOrg,
		MaxAPIKeysPerOrg:  limits.APIKeysPerOrg,
		Retention:         a.retentionPolicy().Retention,
		RateCard:          a.rateCard,
		// the most a broadcast's rate_per_minute may be, and twice its default
		RelayLimitPerMinute: a.relayLimitPerMinute,
	}
}

// callLog is the relay's call log: the relay log's writer, or nil when it is off.
func (a *App) callLog() relay.CallLog {
	if a.relayLog == nil {
		return nil
	}
	return a.relayLog
}

// relayLogObserver feeds the relay log's metrics.
type relayLogObserver struct{ m *metrics }

func (o relayLogObserver) Written(n int) { o.m.relayLogWritten.Add(float64(n)) }
func (o relayLogObserver) Dropped(n int) { o.m.relayLogDropped.Add(float64(n)) }

// limiterHandle is a rate limiter acquired from the app; release it in Cleanup.
type limiterHandle struct {
	ratelimit.Limiter
	memKey string
}

func (l limiterHandle) release() error {
	if l.memKey == "" {
		return nil
	}
	return releaseMemoryLimiter(l.memKey)
}

// newLimiter returns a rate limiter: Redis-backed with an in-memory fallback when Redis is
// configured, in memory otherwise. The memory limiter is shared across reloads (so a reload does
// not reset counts).
func (a *App) newLimiter(prefix string, limit int, window time.Duration) limiterHandle {
	mem, key := acquireMemoryLimiter(prefix, limit, window)
	if a.redis == nil {
		return limiterHandle{mem, key}
	}
	return limiterHandle{ratelimit.NewFallback(ratelimit.NewRedis(a.redis, limit, window, prefix), mem, a.logger), key}
}

// dispatcherConfig is the dispatcher's configuration from the delivery options, and the
// webhooks' secrets it signs with.
func (a *App) dispatcherConfig() (dispatcher.Config, dispatcher.Secrets) {
	cfg := dispatcher.Config{InstanceID: caddyInstanceID(), Observer: deliveryObserver{a.metrics}, Traces: &tracerProvider}
	if d := a.Delivery; d != nil {
		for _, r := range d.RetryDelays {
			cfg.RetryDelays = append(cfg.RetryDelays, time.Duration(r))
		}
		cfg.Timeout, cfg.Lease = time.Duration(d.Timeout), time.Duration(d.Lease)
		if d.Workers != nil {
			cfg.Workers = *d.Workers
		}
		cfg.PerOrg = d.PerOrg
		cfg.PerWebhook = d.PerWebhook
		cfg.HandOffWaitPerWebhook, cfg.HandOffWait = d.HandOffWaitPerWebhook, d.HandOffWait
		cfg.FailureThreshold, cfg.DisableAfter = d.FailureThreshold, time.Duration(d.DisableAfter)
		if len(d.ProbeInterval) > 0 {
			cfg.ProbeInterval = time.Duration(d.ProbeInterval[0])
		}
		if len(d.ProbeInterval) > 1 {
			cfg.ProbeIntervalMax = time.Duration(d.ProbeInterval[1])
		}
		cfg.AllowPrivateTargets, cfg.RootCAs = a.allowPrivateTargets, a.rootCAs
	}
	// The dispatcher takes a secret that no encryption key opens as unusable by itself.
	cfg.PreviousSecrets = a.store.PreviousWebhookSecret
	return cfg, a.store.WebhookSecret
}

// deliveryObserver feeds the delivery metrics.
type deliveryObserver struct{ m *metrics }

func (o deliveryObserver) Attempt(outcome string, d time.Duration) {
	o.m.deliveries.WithLabelValues(outcome).Inc()
	o.m.attemptLatency.Observe(d.Seconds())
}

// HealthChange counts webhook health changes (dispatcher.HealthObserver).
func (o deliveryObserver) HealthChange(change string) {
	o.m.healthChanges.WithLabelValues(change).Inc()
}

// Store returns the data layer.
func (a *App) Store() *store.Store { return a.store }

// Health reports the first unavailable dependency.
func (a *App) Health(ctx context.Context) error {
	if err := a.store.Ping(ctx); err != nil {
		return errors.New("Postgres unavailable")
	}
	if a.redis != nil {
		if err := pingRedis(ctx, a.redis); err != nil {
			return errors.New("Redis unavailable")
		}
	}
	return nil
}
