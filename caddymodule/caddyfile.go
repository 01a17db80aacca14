package caddymodule

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("wabarelay", parseGlobalOption)
}

// parseGlobalOption parses the `wabarelay { ... }` global option into the wabarelay app.
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		return nil, d.Err("the wabarelay global option may appear only once")
	}
	app := new(App)
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "wabarelay", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile sets up the app from Caddyfile tokens. Syntax:
//
//	wabarelay {
//		database        <dsn>
//		redis           <url>
//		redis {                              # or: Cluster / Sentinel
//			addresses   <host:port>...       # several: Cluster; with master_name: sentinels
//			master_name <name>
//			username    <user>
//			password    <password>
//			db          <n>
//			tls
//		}
//		encryption_key  <base64 32 bytes>...  # the first encrypts, all decrypt
//		upstream        <base url with version>
//		connect_base    <url>
//		proxy_url       <url>
//		connect_link_ttl <duration>
//		register_pin    <6 digits>
//		rate_card       <file.csv>            # prices of the usage: country,category,price
//		skip_migrations
//		health_refresh  <duration> | off     # number health read; default 6h
//		meta {
//			app_id       <id>
//			app_secret   <secret>
//			config_id    <id>
//			verify_token <token>
//			sdk_url      <url>
//		}
//		delivery {
//			retry_delays <duration>...
//			timeout      <duration>
//			workers      <n>              # 0: this instance runs no dispatcher
//			per_webhook  <n>
//			per_org      <n>
//			handoff_wait_per_webhook <n>  # over-cap hand-offs waiting in memory, per webhook
//			handoff_wait <n>              # … and in all
//			lease        <duration>
//			retention    <duration>
//			max_hold     <duration>       # held deliveries of paused webhooks fail after this
//			failure_threshold <n>         # failed attempts in a row that make a webhook failing
//			disable_after     <duration>  # a webhook failing this long is paused
//			probe_interval    <first> [<longest>]
//			root_ca      <pem file>
//			allow_private_targets
//		}
//		broadcasts {
//			workers      <n>              # 0: this instance sends no broadcasts; default 4
//			lease        <duration>       # longer than the relay's 90s send deadline; default 2m
//		}
//		management_rate_limit <requests> [<window>]
//		limits {
//			webhooks_per_org <n>
//			api_keys_per_org <n>              # neither revoked nor expired
//		}
//		relay_log off                         # or:
//		relay_log {
//			buffer   <n>
//			batch    <n>
//			interval <duration>
//			per_channel <n>                   # rows a second per channel; the rest counted
//		}
//	}
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // option name
	if d.NextArg() {
		return d.ArgErr()
	}
	strOpts := map[string]*string{
		"database": &a.Database,
		"upstream": &a.Upstream, "connect_base": &a.ConnectBase, "proxy_url": &a.ProxyURL,
		"register_pin": &a.RegisterPIN,
		"rate_card":    &a.RateCard,
	}
	for d.NextBlock(0) {
		opt := d.Val()
		switch {
		case strOpts[opt] != nil:
			if err := oneArg(d, strOpts[opt]); err != nil {
				return err
			}
		case opt == "encryption_key":
			keys := d.RemainingArgs()
			if len(keys) == 0 {
				return d.ArgErr()
			}
			a.EncryptionKey = strings.Join(keys, " ")
		case opt == "connect_link_ttl":
			if err := durationArg(d, &a.ConnectLinkTTL); err != nil {
				return err
			}
		case opt == "health_refresh":
			if err := oneArg(d, &a.HealthRefresh); err != nil {
				return err
			}
			if _, _, err := parseHealthRefresh(a.HealthRefresh); err != nil {
				return d.Err(err.Error())
			}
		case opt == "skip_migrations":
			if d.NextArg() {
				return d.ArgErr()
			}
			a.SkipMigrations = true
		case opt == "redis":
			a.Redis = new(RedisConfig)
			if err := a.Redis.unmarshal(d); err != nil {
				return err
			}
		case opt == "meta":
			a.Meta = new(MetaConfig)
			if err := a.Meta.unmarshal(d); err != nil {
				return err
			}
		case opt == "broadcasts":
			a.Broadcasts = new(BroadcastsConfig)
			if err := a.Broadcasts.unmarshal(d); err != nil {
				return err
			}
		case opt == "delivery":
			a.Delivery = new(DeliveryConfig)
			if err := a.Delivery.unmarshal(d); err != nil {
				return err
			}
		case opt == "management_rate_limit":
			mgmtLimit := new(RateLimitConfig)
			args := d.RemainingArgs()
			if len(args) < 1 || len(args) > 2 {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(args[0])
			if err != nil || n <= 0 {
				return d.Errf("management_rate_limit: requests must be a positive integer, got %q", args[0])
			}
			mgmtLimit.Requests = n
			if len(args) == 2 {
				w, err := caddy.ParseDuration(args[1])
				if err != nil || w <= 0 {
					return d.Errf("management_rate_limit: invalid window %q", args[1])
				}
				mgmtLimit.Window = caddy.Duration(w)
			}
			a.ManagementRateLimit = mgmtLimit
		case opt == "limits":
			a.Limits = new(LimitsConfig)
			if err := a.Limits.unmarshal(d); err != nil {
				return err
			}
		case opt == "relay_log":
			a.RelayLog = new(RelayLogConfig)
			if err := a.RelayLog.unmarshal(d); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized wabarelay option %q", opt)
		}
	}
	return nil
}

func (m *MetaConfig) unmarshal(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	opts := map[string]*string{
		"app_id": &m.AppID, "app_secret": &m.AppSecret, "config_id": &m.ConfigID,
		"verify_token": &m.VerifyToken, "sdk_url": &m.SDKURL,
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		p := opts[d.Val()]
		if p == nil {
			return d.Errf("unrecognized meta option %q", d.Val())
		}
		if err := oneArg(d, p); err != nil {
			return err
		}
	}
	return nil
}

func (c *DeliveryConfig) unmarshal(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "retry_delays":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			c.RetryDelays = make([]caddy.Duration, len(args))
			for i, s := range args {
				v, perr := caddy.ParseDuration(s)
				if perr != nil || v < 0 {
					return d.Errf("retry_delays: invalid duration %q", s)
				}
				c.RetryDelays[i] = caddy.Duration(v)
			}
		case "timeout":
			err = durationArg(d, &c.Timeout)
		case "lease":
			err = durationArg(d, &c.Lease)
		case "retention":
			err = durationArg(d, &c.Retention)
		case "max_hold":
			err = durationArg(d, &c.MaxHold)
		case "failure_threshold":
			err = intArg(d, &c.FailureThreshold)
		case "disable_after":
			err = durationArg(d, &c.DisableAfter)
		case "probe_interval":
			args := d.RemainingArgs()
			if len(args) == 0 || len(args) > 2 {
				return d.ArgErr()
			}
			c.ProbeInterval = make([]caddy.Duration, len(args))
			for i, s := range args {
				v, perr := caddy.ParseDuration(s)
				if perr != nil || v <= 0 {
					return d.Errf("probe_interval: invalid duration %q", s)
				}
				c.ProbeInterval[i] = caddy.Duration(v)
			}
		case "workers":
			// 0 is meaningful (no dispatcher on this instance), so it is kept as a pointer.
			var s string
			if err = oneArg(d, &s); err != nil {
				return err
			}
			n, perr := strconv.Atoi(s)
			if perr != nil || n < 0 {
				return d.Errf("workers: expected 0 (no dispatcher on this instance) or a positive integer, got %q", s)
			}
			c.Workers = &n
		case "per_webhook":
			err = intArg(d, &c.PerWebhook)
		case "per_org":
			err = intArg(d, &c.PerOrg)
		case "handoff_wait_per_webhook":
			err = intArg(d, &c.HandOffWaitPerWebhook)
		case "handoff_wait":
			err = intArg(d, &c.HandOffWait)
		case "root_ca":
			err = oneArg(d, &c.RootCA)
		case "allow_private_targets":
			c.AllowPrivateTargets = "true"
			if d.NextArg() {
				c.AllowPrivateTargets = Switch(d.Val())
				if d.NextArg() {
					return d.ArgErr()
				}
			}
			if err := c.AllowPrivateTargets.check(); err != nil {
				return d.Errf("allow_private_targets: %v", err)
			}
		default:
			return d.Errf("unrecognized delivery option %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *LimitsConfig) unmarshal(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "webhooks_per_org":
			err = intArg(d, &c.WebhooksPerOrg)
		case "api_keys_per_org":
			err = intArg(d, &c.APIKeysPerOrg)
		default:
			return d.Errf("unrecognized limits option %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshal reads `relay_log off` or `relay_log { buffer batch interval per_channel }`.
func (c *RelayLogConfig) unmarshal(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		if d.Val() != "off" || d.NextArg() {
			return d.Errf("relay_log: expected off or a block, got %q", d.Val())
		}
		c.Off = true
		if d.NextBlock(d.Nesting()) {
			return d.Err("relay_log off takes no block")
		}
		return nil
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "buffer":
			err = intArg(d, &c.Buffer)
		case "batch":
			err = intArg(d, &c.Batch)
		case "interval":
			err = durationArg(d, &c.Interval)
		case "per_channel":
			err = intArg(d, &c.PerChannel)
		default:
			return d.Errf("unrecognized relay_log option %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func oneArg(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	opt := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	v, err := caddy.ParseDuration(s)
	if err != nil || v <= 0 {
		return d.Errf("%s: invalid duration %q", opt, s)
	}
	*dst = caddy.Duration(v)
	return nil
}

func intArg(d *caddyfile.Dispenser, dst *int) error {
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	v, err := strconv.Atoi(s)
	if err != nil || v <= 0 {
		return d.Errf("expected a positive integer, got %q", s)
	}
	*dst = v
	return nil
}
