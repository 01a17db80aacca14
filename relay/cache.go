// Package relay holds the domain logic of wabarelay's relay: resolving channel tokens through an
// in-memory cache invalidated by Postgres notifications, the scope rule (which upstream objects a
// channel token may reach), removal of idempotency_key from send bodies, and the rewriting of
// upstream responses (paging links, dead-token detection). The Caddy handlers in caddymodule
// chain these pieces in front of reverse_proxy.
package relay

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"

	"github.com/wabarelay/wabarelay/store"
)

// ErrUnknownToken is returned for a token that belongs to no channel.
var ErrUnknownToken = errors.New("unknown channel token")

// NotifyChannel is the Postgres channel on which every channel change is announced (by trigger).
const NotifyChannel = "wabarelay_channels"

// Cache defaults.
const (
	DefaultTTL         = 30 * time.Second
	negativeTTL        = 5 * time.Second
	maxNegativeEntries = 100_000
)

type entry struct {
	ch      *store.RelayChannel // nil: no channel has this token
	fetched time.Time
}

// Cache resolves channel tokens without a Postgres query per request. Entries live TTL at most
// (a backstop); every change to a channel is announced by a Postgres trigger and, while Listen
// runs, drops the channel's entry on every instance at once.
type Cache struct {
	store *store.Store
	ttl   time.Duration
	now   func() time.Time

	mu        sync.RWMutex
	byHash    map[[32]byte]*entry
	byID      map[uuid.UUID][32]byte
	negatives int
	epoch     uint64 // bumped by every invalidation, so a fetch that raced one is not cached
	sf        singleflight.Group
}

// NewCache returns a cache over s whose entries live at most ttl (DefaultTTL if ttl <= 0).
func NewCache(s *store.Store, ttl time.Duration) *Cache {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	return &Cache{store: s, ttl: ttl, now: time.Now, byHash: map[[32]byte]*entry{}, byID: map[uuid.UUID][32]byte{}}
}

// Lookup returns the channel of token, or ErrUnknownToken.
func (c *Cache) Lookup(ctx context.Context, token string) (*store.RelayChannel, error) {
	h := sha256.Sum256([]byte(token))
	c.mu.RLock()
	e := c.byHash[h]
	c.mu.RUnlock()
	if e != nil {
		age := c.now().Sub(e.fetched)
		switch {
		case e.ch == nil && age < negativeTTL, e.ch != nil && age < c.ttl:
			return e.result()
		case e.ch != nil && age < 2*c.ttl:
			// Stale but within the grace period: serve it and refresh in the background, so no
			// request waits on Postgres for the TTL backstop (changes arrive by notification).
			go c.fetch(context.WithoutCancel(ctx), token, h)
			return e.result()
		}
	}
	return c.fetch(ctx, token, h)
}

func (e *entry) result() (*store.RelayChannel, error) {
	if e.ch == nil {
		return nil, ErrUnknownToken
	}
	return e.ch, nil
}

// fetch loads the token's channel from Postgres (one query per token at a time) and caches it.
func (c *Cache) fetch(ctx context.Context, token string, h [32]byte) (*store.RelayChannel, error) {
	v, err, _ := c.sf.Do(string(h[:]), func() (any, error) {
		c.mu.RLock()
		epoch := c.epoch
		c.mu.RUnlock()
		ch, err := c.store.RelayChannelByToken(ctx, token)
		if err != nil && !errors.Is(err, store.ErrChannelNotFound) {
			return nil, err
		}
		var cp *store.RelayChannel
		if err == nil {
			cp = &ch
		}
		c.put(h, cp, epoch)
		return cp, nil
	})
	if err != nil {
		return nil, err
	}
	if ch := v.(*store.RelayChannel); ch != nil {
		return ch, nil
	}
	return nil, ErrUnknownToken
}

func (c *Cache) put(h [32]byte, ch *store.RelayChannel, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch != epoch {
		return // invalidated while fetching: the result may be stale
	}
	if old := c.byHash[h]; old != nil && old.ch == nil {
		c.negatives--
	}
	if ch == nil {
		if c.negatives >= maxNegativeEntries {
			return
		}
		c.negatives++
	} else {
		c.byID[ch.ID] = h
	}
	c.byHash[h] = &entry{ch: ch, fetched: c.now()}
}

// Invalidate drops the channel's entry.
func (c *Cache) Invalidate(id uuid.UUID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	if h, ok := c.byID[id]; ok {
		delete(c.byHash, h)
		delete(c.byID, id)
	}
}

// Flush drops every entry.
func (c *Cache) Flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	c.byHash = map[[32]byte]*entry{}
	c.byID = map[uuid.UUID][32]byte{}
	c.negatives = 0
}

// MarkDisconnected records a dead upstream token for the channel and drops its entry.
func (c *Cache) MarkDisconnected(ctx context.Context, id uuid.UUID) error {
	err := c.store.MarkUpstreamDisconnected(ctx, id)
	c.Invalidate(id)
	return err
}

// Listen keeps a dedicated connection (not from the pool) listening for channel changes and
// invalidates entries as they arrive, until ctx ends. After every (re)connection it flushes the
// cache, since notifications may have been missed while disconnected. ready, if not nil, is
// called after each successful LISTEN.
func (c *Cache) Listen(ctx context.Context, dsn string, logger *zap.Logger, ready func()) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := c.listenOnce(ctx, dsn, ready)
		if ctx.Err() != nil {
			return
		}
		logger.Warn("channel change listener disconnected; retrying", zap.Error(err), zap.Duration("backoff", backoff))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (c *Cache) listenOnce(ctx context.Context, dsn string, ready func()) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		return err
	}
	c.Flush()
	if ready != nil {
		ready()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if id, err := uuid.Parse(n.Payload); err == nil {
			c.Invalidate(id)
		}
	}
}
