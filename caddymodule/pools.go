package caddymodule

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/store"
)

// Shared clients, reference-counted across config reloads: a reload with the same database or
// Redis keeps using the same pool, and a pool is closed only when no config uses it.
var (
	pgPools      = caddy.NewUsagePool()
	redisClients = caddy.NewUsagePool()
	memLimiters  = caddy.NewUsagePool()
)

// closeDelay is how long a released client stays open, so that requests still running on an
// old config after a reload (Caddy does not wait for them) can finish.
const closeDelay = 10 * time.Second

// poolKeyFor keys pools by a hash of the connection string, so secrets are not kept as map keys.
func poolKeyFor(kind, dsn string) string {
	sum := sha256.Sum256([]byte(kind + "\x00" + dsn))
	return kind + ":" + hex.EncodeToString(sum[:8])
}

type pgPoolDestructor struct{ *pgxpool.Pool }

func (p pgPoolDestructor) Destruct() error {
	time.AfterFunc(closeDelay, p.Close)
	return nil
}

// acquirePool returns the shared pool for dsn, creating it (without connecting) if needed.
func acquirePool(dsn string) (*pgxpool.Pool, string, error) {
	key := poolKeyFor("pg", dsn)
	v, _, err := pgPools.LoadOrNew(key, func() (caddy.Destructor, error) {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			// pgx's parse errors can quote the connection string; do not pass them on.
			return nil, fmt.Errorf("database: invalid connection string")
		}
		cfg.MinConns = 0
		noJIT(cfg.ConnConfig.RuntimeParams)
		store.ConfigurePool(cfg)
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			return nil, fmt.Errorf("database: %w", err)
		}
		return pgPoolDestructor{pool}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(pgPoolDestructor).Pool, key, nil
}

// releasePool gives back a use of the pool under key; the last one closes the pool after
// closeDelay. The error is the destructor's.
func releasePool(key string) error {
	_, err := pgPools.Delete(key)
	return err
}

// noJIT turns Postgres's JIT compilation off for the product's sessions unless the connection
// string sets jit: every statement here is a short OLTP one, and under the server's default
// jit = on a statement planned per call whose estimated cost passes jit_above_cost (a delivery
// claim, once a backlog forms) is compiled at every call, which costs far more than running it.
func noJIT(params map[string]string) {
	if _, set := params["jit"]; !set {
		params["jit"] = "off"
	}
}

type redisDestructor struct{ redis.UniversalClient }

func (r redisDestructor) Destruct() error {
	// Closed after the delay whatever Close reports: no caller is left to tell.
	time.AfterFunc(closeDelay, func() { _ = r.Close() })
	return nil
}

// acquireRedis returns the shared client for the resolved cfg, creating it (without
// connecting) if needed.
func acquireRedis(cfg RedisConfig) (redis.UniversalClient, string, error) {
	canon, err := json.Marshal(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("redis: %w", err)
	}
	key := poolKeyFor("redis", string(canon))
	v, _, err := redisClients.LoadOrNew(key, func() (caddy.Destructor, error) {
		c, err := cfg.newClient()
		if err != nil {
			return nil, err
		}
		return redisDestructor{c}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(redisDestructor).UniversalClient, key, nil
}

// releaseRedis gives back a use of the client under key, as releasePool does.
func releaseRedis(key string) error {
	_, err := redisClients.Delete(key)
	return err
}

type memLimiterDestructor struct{ *ratelimit.MemoryLimiter }

func (m memLimiterDestructor) Destruct() error {
	m.Close()
	return nil
}

// acquireMemoryLimiter returns the in-memory limiter for (prefix, limit, window), shared across
// reloads that keep the same limit.
func acquireMemoryLimiter(prefix string, limit int, window time.Duration) (*ratelimit.MemoryLimiter, string) {
	key := fmt.Sprintf("%s%d/%s", prefix, limit, window)
	v, _, _ := memLimiters.LoadOrNew(key, func() (caddy.Destructor, error) {
		return memLimiterDestructor{ratelimit.NewMemory(limit, window)}, nil
	})
	return v.(memLimiterDestructor).MemoryLimiter, key
}

// releaseMemoryLimiter gives back a use of the limiter under key; the last one stops it.
func releaseMemoryLimiter(key string) error {
	_, err := memLimiters.Delete(key)
	return err
}

var idemStores = caddy.NewUsagePool()

// idemStore is the app's idempotency store: on Redis when the app has Redis (redis is then
// the same store, which the relay's admission counts and claims on in one round trip), else in
// memory (redis nil).
type idemStore struct {
	idempotency.Store
	redis *idempotency.Redis
}

type idemDestructor struct {
	idemStore
	close func() error
}

func (d idemDestructor) Destruct() error {
	// Closed after the delay whatever close reports: no caller is left to tell.
	time.AfterFunc(closeDelay, func() { _ = d.close() })
	return nil
}

// acquireIdempotency returns the idempotency store shared across reloads: on the Redis client
// (keyed by its pool key) when there is one, else in memory.
func acquireIdempotency(rdb redis.UniversalClient, redisKey string, logger *zap.Logger) (idemStore, string) {
	key := "idem:memory"
	if rdb != nil {
		key = "idem:" + redisKey
	}
	v, _, _ := idemStores.LoadOrNew(key, func() (caddy.Destructor, error) {
		if rdb != nil {
			s := idempotency.NewRedis(rdb, idempotency.Options{}, logger)
			return idemDestructor{idemStore{s, s}, s.Close}, nil
		}
		s := idempotency.NewMemory(idempotency.Options{})
		return idemDestructor{idemStore{Store: s}, s.Close}, nil
	})
	return v.(idemDestructor).idemStore, key
}

// releaseIdempotency gives back a use of the store under key, as releasePool does.
func releaseIdempotency(key string) error {
	_, err := idemStores.Delete(key)
	return err
}
