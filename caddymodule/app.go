// Package caddymodule is the Caddy glue of wabarelay: the `wabarelay` app (shared Postgres pool,
// Redis client and secrets, lifecycle), its HTTP handler modules, their Caddyfile directives and
// global option, and the `caddy wabarelay` CLI. Domain logic lives in the other packages; this
// package only wires them into Caddy.
package caddymodule

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/dispatcher"
	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/authguard"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/relay"
	"github.com/wabarelay/wabarelay/relaylog"
	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

func init() {
	caddy.RegisterModule(new(App))
}

// Defaults of the app's options.
const (
	DefaultUpstream            = "https://graph.facebook.com/v26.0"
	DefaultConnectLinkTTL      = 168 * time.Hour
	DefaultManagementRateLimit = 600
	DefaultManagementWindow    = time.Minute
	startTimeout               = 30 * time.Second
)

// App is the `wabarelay` Caddy app: it holds the configuration shared by every wabarelay
// handler, owns the Postgres pool and Redis client (shared across config reloads through usage
// pools), applies schema migrations at start, and runs background work.
//
// Secret-bearing fields (database, redis, encryption_key, meta.app_secret, meta.verify_token,
// register_pin) should be given as `{env.NAME}` or `{file./path}` placeholders: they are
// resolved at provision time and so never appear in the saved or served JSON config.
type App struct {
	// Database is the Postgres connection string (URL or key=value DSN). Required.
	Database string `json:"database,omitempty"`

	// Redis is where rate limits and idempotency keys are shared by every instance: a
	// redis:// or rediss:// URL, or a Cluster or Sentinel (see RedisConfig). Optional: without
	// it they are kept in memory and are correct for a single instance only. A URL placeholder
	// that resolves empty (`redis {env.X}`, X unset) is no Redis, logged at start.
	Redis *RedisConfig `json:"redis,omitempty"`

	// EncryptionKey is base64 of 32 random bytes, or a list of such keys separated by commas
	// and/or whitespace (after placeholders are resolved). The first key encrypts channel
	// tokens, upstream access tokens and webhook signing secrets at rest (AES-256-GCM); every
	// listed key decrypts, so the key can be rotated (see `caddy wabarelay rekey`). Required.
	EncryptionKey string `json:"encryption_key,omitempty"`

	// Upstream is the base URL of the upstream Graph API, including its version segment.
	// Default: https://graph.facebook.com/v26.0.
	Upstream string `json:"upstream,omitempty"`

	// ConnectBase is the address prefix of connect links ({connect_base}); connect_url is
	// `{connect_base}/connect/<channel_token>`. Default: the scheme and host of each request.
	ConnectBase string `json:"connect_base,omitempty"`

	// ProxyURL is the public base address of the relay ({proxy_url}), used to rewrite upstream
	// paging links. Default: derived from each relay request.
	ProxyURL string `json:"proxy_url,omitempty"`

	// ConnectLinkTTL is how long a new channel's connect link stays valid. Default: 168h.
	ConnectLinkTTL caddy.Duration `json:"connect_link_ttl,omitempty"`

	// Meta holds the upstream app's credentials and Embedded Signup settings.
	Meta *MetaConfig `json:"meta,omitempty"`

	// RegisterPIN is the 6-digit two-step verification PIN used to register numbers. Default:
	// a random PIN per channel, stored encrypted.
	RegisterPIN string `json:"register_pin,omitempty"`

	// Delivery configures webhook delivery.
	Delivery *DeliveryConfig `json:"delivery,omitempty"`

	// ManagementRateLimit limits management API requests per API key. Default: 600 per 1m.
	ManagementRateLimit *RateLimitConfig `json:"management_rate_limit,omitempty"`

	// Limits caps what one organization may create through the management API (and so the
	// dashboard).
	Limits *LimitsConfig `json:"limits,omitempty"`

	// RelayLog configures the relay log: every call on the relay's send path, written to
	// Postgres in batches off the request path (docs/relay.md#relay-log). On by default.
	RelayLog *RelayLogConfig `json:"relay_log,omitempty"`

	// SkipMigrations, when true, does not apply schema migrations at start (run
	// `caddy wabarelay migrate` instead). Default: false (migrations run at start under a
	// Postgres advisory lock, so concurrent starts are safe).
	SkipMigrations bool `json:"skip_migrations,omitempty"`

	database    string // resolved
	upstream    *url.URL
	meta        MetaConfig // resolved
	registerPIN string     // resolved
	// upstreamDial is the upstream's host:port for reverse_proxy.
	upstreamDial string
	pool         *pgxpool.Pool
	inbound      *inbound.Handler
	poolKey      string
	redis        redis.UniversalClient
	redisKey     string
	box          *secretbox.Box
	store        *store.Store
	cache        *relay.Cache
	idem         idemStore
	idemKey      string
	mgmtLimiter  limiterHandle
	// authGuard refuses client addresses that present too many bad credentials, before any
	// lookup (relay, management API, connect links).
	authGuard *authguard.Guard
	metrics   *metrics
	logger    *zap.Logger
	released  bool
	// relayLog is the relay log's writer (nil: relay_log off), started and stopped with the app.
	relayLog *relaylog.Writer

	stopListener context.CancelFunc
	listenerDone chan struct{}
	// dispatcher and dispatcherDone are nil until Start, and when this instance runs no
	// dispatcher (delivery { workers 0 }).
	dispatcher     *dispatcher.Dispatcher
	dispatcherDone chan struct{}
	// pendingStores counts idempotency stores still running after their response was sent.
	pendingStores atomic.Int64
	// allowPrivateTargets and rootCAs are delivery's allow_private_targets and root_ca, resolved.
	allowPrivateTargets bool
	rootCAs             *x509.CertPool
}

// MetaConfig holds the upstream (Meta) app's credentials and Embedded Signup settings.
type MetaConfig struct {
	// AppID is the upstream app id (Embedded Signup, code exchange).
	AppID string `json:"app_id,omitempty"`
	// AppSecret is the upstream app secret: it verifies inbound X-Hub-Signature-256 and
	// authenticates the code exchange.
	AppSecret string `json:"app_secret,omitempty"`
	// ConfigID is the Embedded Signup configuration id.
	ConfigID string `json:"config_id,omitempty"`
	// VerifyToken answers the upstream's webhook verification GET.
	VerifyToken string `json:"verify_token,omitempty"`
	// SDKURL is the URL of the upstream JS SDK the connect page loads. Default:
	// https://connect.facebook.net/en_US/sdk.js.
	SDKURL string `json:"sdk_url,omitempty"`
}

// DeliveryConfig configures webhook delivery.
type DeliveryConfig struct {
	// RetryDelays are the delays after failed attempts 1..n; attempts = len+1.
	// Default: 30s 2m 10m (4 attempts).
	RetryDelays []caddy.Duration `json:"retry_delays,omitempty"`
	// Timeout is the time a receiver has to answer one attempt with a 2xx. Default: 10s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// Workers is the number of concurrent delivery attempts per instance. 0 means this instance
	// runs no dispatcher (inbound/relay only): the deliveries its inbound handler stores are left pending,
	// announced, for the dispatchers of the other instances on the same database. Negative is
	// an error. Default (unset): 256 (dispatcher.DefaultWorkers).
	Workers *int `json:"workers,omitempty"`
	// PerWebhook caps concurrent attempts to one webhook per instance (its connections to the
	// receiver). Default: 64 (dispatcher.DefaultPerWebhook).
	PerWebhook int `json:"per_webhook,omitempty"`
	// PerOrg caps concurrent attempts to all the webhooks of one org per instance, so that one
	// tenant (any number of receivers that never answer) cannot hold every worker. Default:
	// half of Workers (dispatcher.Config.PerOrg explains the choice).
	PerOrg int `json:"per_org,omitempty"`
	// Lease is how long a claimed delivery stays reserved; it must exceed Timeout. Default: 60s.
	Lease caddy.Duration `json:"lease,omitempty"`
	// Retention is how long events, their deliveries and attempts are kept: whole days are
	// dropped (daily partitions) once every delivery of the day has finished. At least 168h (the
	// events are also the record of upstream items already seen). Default: 720h.
	Retention caddy.Duration `json:"retention,omitempty"`
	// MaxHold is how long a paused webhook's deliveries are held: older ones fail, with the
	// reason in the delivery log. Must be shorter than Retention. Default: 168h, or a day less
	// than Retention if that is shorter.
	MaxHold caddy.Duration `json:"max_hold,omitempty"`
	// FailureThreshold is the number of consecutive failed attempts, across a webhook's
	// deliveries, after which the webhook is failing: its deliveries are held and one probe goes
	// out per probe interval. Default: 10.
	FailureThreshold int `json:"failure_threshold,omitempty"`
	// DisableAfter is how long a webhook may stay failing before it is paused (paused_reason
	// "failing"). Default: 120h.
	DisableAfter caddy.Duration `json:"disable_after,omitempty"`
	// ProbeInterval is the gap before a failing webhook's first probe and, optionally, the
	// longest gap (each failed probe doubles it). Default: 30s 5m.
	ProbeInterval []caddy.Duration `json:"probe_interval,omitempty"`
	// RootCA is a PEM file of an extra CA to trust for receivers (tests, private PKI).
	RootCA string `json:"root_ca,omitempty"`
	// AllowPrivateTargets permits receivers on loopback and private addresses (dev and test
	// only): true, false, or an {env.NAME} placeholder resolved at provision (empty: false).
	// When on, every start and reload logs a warning. Default: false.
	AllowPrivateTargets Switch `json:"allow_private_targets,omitempty"`
}

// LimitsConfig caps what one organization may create through the management API and the
// dashboard; at a cap, a creation is answered 422 naming the limit. The operator's CLI
// (`apikey create`) is not capped.
type LimitsConfig struct {
	// WebhooksPerOrg is the most webhooks an organization may have. Default: 100.
	WebhooksPerOrg int `json:"webhooks_per_org,omitempty"`
	// APIKeysPerOrg is the most API keys an organization may have that are neither revoked nor
	// expired. Default: 100.
	APIKeysPerOrg int `json:"api_keys_per_org,omitempty"`
}

// RelayLogConfig configures the relay log's writer (relaylog.Config): calls wait in a bounded
// buffer and are written in batches; a call that finds the buffer full, or whose batch fails,
// is dropped and counted (caddy_wabarelay_relay_log_dropped_total).
type RelayLogConfig struct {
	// Off turns the relay log off (`relay_log off`): no call is recorded. Default: false (the
	// log is on).
	Off bool `json:"off,omitempty"`
	// Buffer is the most calls waiting to be written. Default: 16384 (relaylog.DefaultBuffer).
	Buffer int `json:"buffer,omitempty"`
	// Batch is the most calls written at once. Default: 1000 (relaylog.DefaultBatch).
	Batch int `json:"batch,omitempty"`
	// Interval is the longest a call waits before its batch is written. Default: 1s
	// (relaylog.DefaultInterval).
	Interval caddy.Duration `json:"interval,omitempty"`
	// PerChannel is the most calls of one channel written as rows of their own in one second
	// (per instance); its further calls in that second are counted, like refusals. Default: 100
	// (relaylog.DefaultPerChannel).
	PerChannel int `json:"per_channel,omitempty"`
}

// RateLimitConfig is a request limit per window.
type RateLimitConfig struct {
	// Requests is the most requests accepted in any rolling window.
	Requests int `json:"requests,omitempty"`
	// Window is the length of the rolling window.
	Window caddy.Duration `json:"window,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (*App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "wabarelay", New: func() caddy.Module { return new(App) }}
}

// resolveSecret resolves {env.*}/{file.*} placeholders in a config value. Errors name the
// option, never its value.
func resolveSecret(repl *caddy.Replacer, name, val string, required bool) (string, error) {
	out, err := repl.ReplaceOrErr(val, false, true)
	if err != nil {
		return "", fmt.Errorf("%s: unknown placeholder", name)
	}
	out = strings.TrimSpace(out)
	if required && out == "" {
		if env := envName(val); env != "" {
			return "", fmt.Errorf("%s is required: its environment variable %s is unset or empty", name, env)
		}
		return "", fmt.Errorf("%s is required (it may be set from an unset environment variable)", name)
	}
	return out, nil
}

// Provision resolves secrets and acquires the shared clients. It does not dial anything, so
// `caddy validate` works with no database running.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	repl := caddy.NewReplacer()
	var err error
	if a.database, err = resolveSecret(repl, "database", a.Database, true); err != nil {
		return err
	}
	rawKey, err := resolveSecret(repl, "encryption_key", a.EncryptionKey, true)
	if err != nil {
		return err
	}
	keys, err := secretbox.ParseKeys(rawKey)
	if err != nil {
		return fmt.Errorf("encryption_key: %w", err)
	}
	if a.box, err = secretbox.NewKeyring(keys...); err != nil {
		return fmt.Errorf("encryption_key: %w", err)
	}
	if ids := a.box.KeyIDs(); len(ids) > 1 {
		a.logger.Info("encryption_key lists several keys: the first encrypts, all decrypt; run `caddy wabarelay rekey`, then drop the old ones",
			zap.String("encrypting_key_id", ids[0]), zap.Strings("decrypt_only_key_ids", ids[1:]))
	}
	var redisCfg RedisConfig
	redisNote := "no redis configured: rate limits and idempotency keys are kept in memory, correct for a single instance only"
	if a.Redis.isSet() {
		if url, uerr := resolveSecret(repl, "redis url", a.Redis.URL, false); uerr == nil && url == "" && a.Redis.isURLOnly() {
			// `redis {env.X}` with X unset or empty: no Redis, as if the line were absent
			from := "its value"
			if env := envName(a.Redis.URL); env != "" {
				from = env
			}
			redisNote = "redis: not configured (" + from + " empty); limits in memory, correct for a single instance only"
		} else if redisCfg, err = a.Redis.resolve(repl); err != nil {
			return err
		}
	}
	if !redisCfg.isSet() {
		// at every start and reload (and `caddy validate`)
		a.logger.Warn(redisNote)
	}
	if err := a.provisionDelivery(repl); err != nil {
		return err
	}
	for name, p := range map[string]*string{"upstream": &a.Upstream, "connect_base": &a.ConnectBase, "proxy_url": &a.ProxyURL} {
		if *p, err = resolveSecret(repl, name, *p, false); err != nil {
			return err
		}
	}
	if a.Meta != nil {
		a.meta = *a.Meta
	}
	for name, p := range map[string]*string{"meta.app_id": &a.meta.AppID, "meta.app_secret": &a.meta.AppSecret,
		"meta.config_id": &a.meta.ConfigID, "meta.verify_token": &a.meta.VerifyToken, "meta.sdk_url": &a.meta.SDKURL} {
		if *p, err = resolveSecret(repl, name, *p, false); err != nil {
			return err
		}
	}
	if a.meta.SDKURL == "" {
		a.meta.SDKURL = DefaultSDKURL
	}
	if a.registerPIN, err = resolveSecret(repl, "register_pin", a.RegisterPIN, false); err != nil {
		return err
	}
	if a.registerPIN != "" && (len(a.registerPIN) != 6 || strings.Trim(a.registerPIN, "0123456789") != "") {
		// checked here, once resolved, rather than in Validate: a placeholder hides the value
		return errors.New("register_pin must be 6 digits")
	}
	if a.Upstream == "" {
		a.Upstream = DefaultUpstream
	}
	if a.upstream, err = url.Parse(a.Upstream); err != nil || a.upstream.Host == "" ||
		(a.upstream.Scheme != "https" && a.upstream.Scheme != "http") {
		return fmt.Errorf("upstream: %q is not an http(s) URL", a.Upstream)
	}
	a.upstreamDial = a.upstream.Host
	if a.upstream.Port() == "" {
		a.upstreamDial = net.JoinHostPort(a.upstream.Hostname(), map[string]string{"https": "443", "http": "80"}[a.upstream.Scheme])
	}
	if a.ConnectLinkTTL <= 0 {
		a.ConnectLinkTTL = caddy.Duration(DefaultConnectLinkTTL)
	}
	if a.ManagementRateLimit == nil {
		a.ManagementRateLimit = &RateLimitConfig{}
	}
	if a.ManagementRateLimit.Requests <= 0 {
		a.ManagementRateLimit.Requests = DefaultManagementRateLimit
	}
	if a.ManagementRateLimit.Window <= 0 {
		a.ManagementRateLimit.Window = caddy.Duration(DefaultManagementWindow)
	}
	if l := a.Limits; l != nil && (l.WebhooksPerOrg < 0 || l.APIKeysPerOrg < 0) {
		return errors.New("limits: webhooks_per_org and api_keys_per_org must be positive")
	}

	if a.pool, a.poolKey, err = acquirePool(a.database); err != nil {
		return err
	}
	if redisCfg.isSet() {
		if a.redis, a.redisKey, err = acquireRedis(redisCfg); err != nil {
			a.Cleanup()
			return err
		}
	}
	a.store = store.New(a.pool, a.box)
	a.cache = relay.NewCache(a.store, relay.DefaultTTL)
	a.cache.SetLogger(a.logger)
	a.authGuard = newAuthGuard()
	a.idem, a.idemKey = acquireIdempotency(a.redis, a.redisKey, a.logger)
	a.metrics = registerMetrics(ctx.GetMetricsRegistry())
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := reg.Register(newQueueCollector(a.pool)); err != nil {
			a.logger.Warn("delivery queue metrics not registered", zap.Error(err))
		}
	}
	if a.inbound, err = a.newInbound(); err != nil {
		a.Cleanup()
		return err
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
	return nil
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

// provisionDelivery resolves delivery's allow_private_targets and root_ca (placeholders, the
// CA file read and parsed here, so that `caddy validate` checks it) and warns, at every start
// and reload, while private targets are allowed.
func (a *App) provisionDelivery(repl *caddy.Replacer) error {
	d := a.Delivery
	if d == nil {
		return nil
	}
	var err error
	if a.allowPrivateTargets, err = d.AllowPrivateTargets.resolve(repl, "delivery allow_private_targets"); err != nil {
		return err
	}
	if a.allowPrivateTargets {
		a.logger.Warn("delivery allow_private_targets is on: webhooks may deliver to loopback and private addresses (development and tests only)")
	}
	file, err := resolveSecret(repl, "delivery root_ca", d.RootCA, false)
	if err != nil || file == "" {
		return err
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("delivery root_ca: %w", err)
	}
	a.rootCAs = x509.NewCertPool()
	if !a.rootCAs.AppendCertsFromPEM(pem) {
		return fmt.Errorf("delivery root_ca: no certificate in %s", file)
	}
	return nil
}

// limiterHandle is a rate limiter acquired from the app; release it in Cleanup.
type limiterHandle struct {
	ratelimit.Limiter
	memKey string
}

func (l limiterHandle) release() {
	if l.memKey != "" {
		releaseMemoryLimiter(l.memKey)
	}
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

// Validate checks the configuration.
func (a *App) Validate() error {
	if d := a.Delivery; d != nil && d.Workers != nil && *d.Workers < 0 {
		return fmt.Errorf("delivery: workers must be 0 (no dispatcher on this instance) or more, got %d", *d.Workers)
	}
	if d := a.Delivery; d != nil {
		// the dispatcher's own rule (dispatcher.New refuses the same at start), so that
		// `caddy validate` fails as `caddy run` would
		if err := (dispatcher.Config{Lease: time.Duration(d.Lease), Timeout: time.Duration(d.Timeout)}).Validate(); err != nil {
			return fmt.Errorf("delivery: %w", err)
		}
		if err := d.AllowPrivateTargets.check(); err != nil {
			return fmt.Errorf("delivery: allow_private_targets: %w", err)
		}
		if n := len(d.ProbeInterval); n > 2 || n == 2 && d.ProbeInterval[1] < d.ProbeInterval[0] {
			return fmt.Errorf("delivery: probe_interval takes the first gap and, optionally, a longest gap not shorter than it")
		}
	}
	if err := a.retentionPolicy().Check(); err != nil {
		return fmt.Errorf("delivery: %w", err)
	}
	return nil
}

// Start checks that Postgres answers and applies pending migrations (unless skip_migrations).
// A Redis that does not answer is logged, not fatal: limits fall back to memory until it does.
func (a *App) Start() error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := a.store.Ping(ctx); err != nil {
		return fmt.Errorf("wabarelay: %w", err)
	}
	if !a.SkipMigrations {
		conn, err := a.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("wabarelay: migrations: %w", err)
		}
		err = store.Migrate(ctx, conn.Conn())
		conn.Release()
		if err != nil {
			return fmt.Errorf("wabarelay: %w", err)
		}
	}
	if a.redis != nil {
		if err := pingRedis(ctx, a.redis); err != nil {
			a.logger.Warn("redis does not answer; limiting in memory until it does", zap.Error(err))
		}
	}
	lctx, cancel := context.WithCancel(context.Background())
	a.stopListener, a.listenerDone = cancel, make(chan struct{})
	go func() {
		defer close(a.listenerDone)
		defer func() {
			if v := recover(); v != nil {
				a.logger.Error("channel change listener panicked", zap.Any("panic", v))
			}
		}()
		a.cache.Listen(lctx, a.database, a.logger, func() {
			a.logger.Info("listening for channel changes; relay cache flushed")
		})
	}()
	go a.maintainLoop(lctx)
	if a.relayLog != nil {
		a.relayLog.Start()
	}
	if err := a.startDispatcher(lctx); err != nil {
		cancel()
		<-a.listenerDone
		return fmt.Errorf("wabarelay: delivery: %w", err)
	}
	a.logger.Info("wabarelay started", zap.String("upstream", a.Upstream))
	return nil
}

// Stop stops background work (bounded wait). Shared clients stay open for in-flight requests;
// Cleanup releases them.
func (a *App) Stop() error {
	// Idempotency stores of answered sends (each bounded to 5 s): a process about to exit
	// should not leave their keys in flight until the lease ends.
	for deadline := time.Now().Add(5 * time.Second); a.pendingStores.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if a.relayLog != nil {
		a.relayLog.Stop() // writes what is buffered (bounded); later calls are dropped and counted
	}
	if a.stopListener != nil {
		a.stopListener()
		select {
		case <-a.listenerDone:
		case <-time.After(5 * time.Second):
			a.logger.Warn("channel change listener did not stop in time")
		}
		if a.dispatcherDone != nil {
			// Run waits for attempts in flight (bounded by the delivery timeout) and records them.
			select {
			case <-a.dispatcherDone:
			case <-time.After(a.deliveryTimeout() + 5*time.Second):
				a.logger.Warn("delivery dispatcher did not stop in time; its leases will expire")
			}
		}
	}
	return nil
}

func (a *App) deliveryTimeout() time.Duration {
	if a.Delivery != nil && a.Delivery.Timeout > 0 {
		return time.Duration(a.Delivery.Timeout)
	}
	return dispatcher.DefaultTimeout
}

// startDispatcher starts webhook delivery for this config. During a reload the new config's
// dispatcher starts before the old one stops; claims are leased rows, so both may run. With
// delivery { workers 0 } it starts none: a.dispatcher stays nil, and the inbound handler leaves
// every delivery pending for the dispatchers of other instances.
func (a *App) startDispatcher(ctx context.Context) error {
	if d := a.Delivery; d != nil && d.Workers != nil && *d.Workers == 0 {
		a.logger.Info("delivery workers 0: this instance runs no dispatcher; deliveries it stores are left to the dispatchers of other instances")
		return nil
	}
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
		cfg.FailureThreshold, cfg.DisableAfter = d.FailureThreshold, time.Duration(d.DisableAfter)
		if len(d.ProbeInterval) > 0 {
			cfg.ProbeInterval = time.Duration(d.ProbeInterval[0])
		}
		if len(d.ProbeInterval) > 1 {
			cfg.ProbeIntervalMax = time.Duration(d.ProbeInterval[1])
		}
		cfg.AllowPrivateTargets, cfg.RootCAs = a.allowPrivateTargets, a.rootCAs
	}
	secrets := func(ctx context.Context, id uuid.UUID) (string, error) {
		s, err := a.store.WebhookSecret(ctx, id)
		if errors.Is(err, secretbox.ErrOpen) {
			err = fmt.Errorf("%w: %w", dispatcher.ErrSecretUnusable, err)
		}
		return s, err
	}
	cfg.PreviousSecrets = func(ctx context.Context, id uuid.UUID) (string, time.Time, error) {
		s, until, err := a.store.PreviousWebhookSecret(ctx, id)
		if errors.Is(err, secretbox.ErrOpen) {
			err = fmt.Errorf("%w: %w", dispatcher.ErrSecretUnusable, err)
		}
		return s, until, err
	}
	disp, err := dispatcher.New(a.pool, secrets, cfg, a.logger.Named("dispatcher"))
	if err != nil {
		return err
	}
	a.dispatcher, a.dispatcherDone = disp, make(chan struct{})
	go func() {
		defer close(a.dispatcherDone)
		defer func() {
			if v := recover(); v != nil {
				a.logger.Error("delivery dispatcher panicked", zap.Any("panic", v))
			}
		}()
		disp.Run(ctx, a.database)
	}()
	return nil
}

// retentionPolicy is delivery's retention and max_hold (defaults: store.RetentionPolicy).
func (a *App) retentionPolicy() store.RetentionPolicy {
	if d := a.Delivery; d != nil {
		return store.RetentionPolicy{Retention: time.Duration(d.Retention), MaxHold: time.Duration(d.MaxHold)}
	}
	return store.RetentionPolicy{}
}

// maintainLoop runs the store's maintenance (store.Store.Maintain) at start and then every
// store.MaintenanceInterval until ctx ends (a config reload restarts it, and it runs at once,
// so frequent reloads cannot starve it).
func (a *App) maintainLoop(ctx context.Context) {
	defer func() {
		if v := recover(); v != nil {
			a.logger.Error("maintenance panicked", zap.Any("panic", v))
		}
	}()
	tick := time.NewTicker(store.MaintenanceInterval)
	defer tick.Stop()
	for {
		a.store.Maintain(ctx, a.retentionPolicy(), a.logger)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// caddyInstanceID names this process in delivery claims.
func caddyInstanceID() string {
	id, err := caddy.InstanceID()
	host, _ := os.Hostname()
	if err != nil {
		return host + "-" + strconv.Itoa(os.Getpid())
	}
	return host + "-" + id.String()[:8] + "-" + strconv.Itoa(os.Getpid())
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

// Cleanup releases the shared clients. It is safe to call more than once and without Start.
func (a *App) Cleanup() error {
	if a.released {
		return nil
	}
	a.released = true
	a.mgmtLimiter.release()
	if a.idemKey != "" {
		releaseIdempotency(a.idemKey)
	}
	if a.redisKey != "" {
		releaseRedis(a.redisKey)
	}
	if a.poolKey != "" {
		releasePool(a.poolKey)
	}
	return nil
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

// Interface guards.
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
