// Package caddymodule is the Caddy glue of wabarelay: the `wabarelay` app, its HTTP handler
// modules, their Caddyfile directives and global option, and the `caddy wabarelay` CLI. Domain
// logic lives in the other packages; this package only wires them into Caddy.
//
// The app is split by concern: its configuration and its resolution (app.go), what it builds
// from it and shares with its handlers — the shared Postgres pool and Redis client, the store,
// the one management Service (wiring.go) — and the background work it starts and stops
// (lifecycle.go).
package caddymodule

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/dispatcher"
	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/authguard"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/relay"
	"github.com/wabarelay/wabarelay/relaylog"
	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
	"github.com/wabarelay/wabarelay/usage"
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

	// Broadcasts configures the broadcast sender (its workers and lease).
	Broadcasts *BroadcastsConfig `json:"broadcasts,omitempty"`

	// ManagementRateLimit limits management API requests per API key. Default: 600 per 1m.
	ManagementRateLimit *RateLimitConfig `json:"management_rate_limit,omitempty"`

	// Limits caps what one organization may create through the management API (and so the
	// dashboard).
	Limits *LimitsConfig `json:"limits,omitempty"`

	// RelayLog configures the relay log: every call on the relay's send path, written to
	// Postgres in batches off the request path (docs/relay.md#relay-log). On by default.
	RelayLog *RelayLogConfig `json:"relay_log,omitempty"`

	// HealthRefresh is how often each connected number's health (quality rating, messaging
	// limit, throughput, name status) is read from the upstream, each channel at its own moment
	// of the interval so that many channels never burst the upstream; `off` turns the periodic
	// read off (the reads at connect and after account webhooks go on). Default: 6h.
	HealthRefresh string `json:"health_refresh,omitempty"`
	// RateCard is a CSV file of prices that turns the usage's counts into costs (GET /usage,
	// the dashboard's usage page): header `country,category,price`, then one price of one
	// billable message per line, in one currency (usage.ParseRateCard). Read and checked at
	// every start and reload (`caddy validate` names the bad line); placeholders are resolved.
	// Default: none, every cost is null.
	RateCard string `json:"rate_card,omitempty"`

	// SkipMigrations, when true, does not apply schema migrations at start (run
	// `caddy wabarelay migrate` instead). Default: false (migrations run at start under a
	// Postgres advisory lock, so concurrent starts are safe).
	SkipMigrations bool `json:"skip_migrations,omitempty"`

	database    string // resolved
	upstream    *url.URL
	meta        MetaConfig // resolved
	registerPIN string     // resolved
	// rateCard is rate_card, parsed (nil: none).
	rateCard *usage.RateCard
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
	windows      *relay.Windows // the relay's customer-service windows, kept current by cache's listener
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
	// healthDone is closed when the number health worker has stopped (nil until Start).
	healthDone chan struct{}
	// relayMu guards sender, the relay the first wabarelay_proxy handler registered
	// (registerRelay); the broadcasts send through it.
	relayMu sync.Mutex
	sender  relaySender
	// stopBroadcast cancels the broadcast sender, and broadcastDone is closed when it has
	// stopped (both nil until Start, and when this instance sends no broadcasts).
	stopBroadcast context.CancelFunc
	broadcastDone chan struct{}
	// afterAnswer tracks the relays' work left after their answers (relay.Pending); Stop
	// waits for it.
	afterAnswer relay.Pending
	// service is the management Service, shared by the API, the dashboard and every other
	// handler that needs it.
	service *managementapi.Service
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
	// HandOffWaitPerWebhook is how many deliveries of one webhook, handed off by the inbound
	// handler over a per_webhook or per_org cap, may wait in memory (still claimed) for a slot
	// per instance; beyond it they go back to the queue. Default: per_webhook (64;
	// dispatcher.Config.HandOffWaitPerWebhook explains the choice).
	HandOffWaitPerWebhook int `json:"handoff_wait_per_webhook,omitempty"`
	// HandOffWait is how many such deliveries of all webhooks may wait in memory per instance.
	// Default: workers (256; dispatcher.Config.HandOffWaitPerWebhook explains the choice).
	HandOffWait int `json:"handoff_wait,omitempty"`
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

// Provision resolves the configuration (resolve), then builds what the app shares with its
// handlers (wire): the clients, the store, the management Service. It does not dial anything,
// so `caddy validate` works with no database running.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	redisCfg, err := a.resolve()
	if err != nil {
		return err
	}
	return a.wire(ctx, redisCfg)
}

// resolve resolves the configuration's placeholders (secrets among them) and fills in the
// defaults; it returns the resolved Redis configuration (unset: no Redis).
func (a *App) resolve() (redisCfg RedisConfig, err error) {
	repl := caddy.NewReplacer()
	if a.database, err = resolveSecret(repl, "database", a.Database, true); err != nil {
		return redisCfg, err
	}
	rawKey, err := resolveSecret(repl, "encryption_key", a.EncryptionKey, true)
	if err != nil {
		return redisCfg, err
	}
	keys, err := secretbox.ParseKeys(rawKey)
	if err != nil {
		return redisCfg, fmt.Errorf("encryption_key: %w", err)
	}
	if a.box, err = secretbox.NewKeyring(keys...); err != nil {
		return redisCfg, fmt.Errorf("encryption_key: %w", err)
	}
	if ids := a.box.KeyIDs(); len(ids) > 1 {
		a.logger.Info("encryption_key lists several keys: the first encrypts, all decrypt; run `caddy wabarelay rekey`, then drop the old ones",
			zap.String("encrypting_key_id", ids[0]), zap.Strings("decrypt_only_key_ids", ids[1:]))
	}
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
			return redisCfg, err
		}
	}
	if !redisCfg.isSet() {
		// at every start and reload (and `caddy validate`)
		a.logger.Warn(redisNote)
	}
	if err := a.provisionDelivery(repl); err != nil {
		return redisCfg, err
	}
	for name, p := range map[string]*string{"upstream": &a.Upstream, "connect_base": &a.ConnectBase, "proxy_url": &a.ProxyURL} {
		if *p, err = resolveSecret(repl, name, *p, false); err != nil {
			return redisCfg, err
		}
	}
	if a.Meta != nil {
		a.meta = *a.Meta
	}
	for name, p := range map[string]*string{"meta.app_id": &a.meta.AppID, "meta.app_secret": &a.meta.AppSecret,
		"meta.config_id": &a.meta.ConfigID, "meta.verify_token": &a.meta.VerifyToken, "meta.sdk_url": &a.meta.SDKURL} {
		if *p, err = resolveSecret(repl, name, *p, false); err != nil {
			return redisCfg, err
		}
	}
	if a.meta.SDKURL == "" {
		a.meta.SDKURL = DefaultSDKURL
	}
	if a.registerPIN, err = resolveSecret(repl, "register_pin", a.RegisterPIN, false); err != nil {
		return redisCfg, err
	}
	if a.registerPIN != "" && (len(a.registerPIN) != 6 || strings.Trim(a.registerPIN, "0123456789") != "") {
		// checked here, once resolved, rather than in Validate: a placeholder hides the value
		return redisCfg, errors.New("register_pin must be 6 digits")
	}
	if a.rateCard, err = a.loadRateCard(repl); err != nil {
		return redisCfg, err
	}
	if a.Upstream == "" {
		a.Upstream = DefaultUpstream
	}
	if a.upstream, err = url.Parse(a.Upstream); err != nil || a.upstream.Host == "" ||
		(a.upstream.Scheme != "https" && a.upstream.Scheme != "http") {
		return redisCfg, fmt.Errorf("upstream: %q is not an http(s) URL", a.Upstream)
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
		return redisCfg, errors.New("limits: webhooks_per_org and api_keys_per_org must be positive")
	}
	return redisCfg, nil
}

// loadRateCard reads and parses rate_card (nil: none set).
func (a *App) loadRateCard(repl *caddy.Replacer) (*usage.RateCard, error) {
	file, err := resolveSecret(repl, "rate_card", a.RateCard, false)
	if err != nil || file == "" {
		return nil, err
	}
	return usage.LoadRateCard(file)
}

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
	if _, _, err := parseHealthRefresh(a.HealthRefresh); err != nil {
		return err
	}
	if err := a.Broadcasts.validate(); err != nil {
		return err
	}
	if err := a.retentionPolicy().Check(); err != nil {
		return fmt.Errorf("delivery: %w", err)
	}
	return nil
}

// retentionPolicy is delivery's retention and max_hold (defaults: store.RetentionPolicy).
func (a *App) retentionPolicy() store.RetentionPolicy {
	if d := a.Delivery; d != nil {
		return store.RetentionPolicy{Retention: time.Duration(d.Retention), MaxHold: time.Duration(d.MaxHold)}
	}
	return store.RetentionPolicy{}
}

func (a *App) deliveryTimeout() time.Duration {
	if a.Delivery != nil && a.Delivery.Timeout > 0 {
		return time.Duration(a.Delivery.Timeout)
	}
	return dispatcher.DefaultTimeout
}

// Interface guards.
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
