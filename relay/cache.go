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
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"

	"github.com/wabarelay/wabarelay/internal/pglisten"
	"github.com/wabarelay/wabarelay/store"
)

// ErrUnknownToken is returned for a token that belongs to no channel.
var ErrUnknownToken = errors.New("unknown channel token")

// NotifyChannel is the Postgres channel on which every channel change is announced (by trigger).
const NotifyChannel = "wabarelay_channels"

// Cache defaults.
const (
	// DefaultTTL is a backstop only: every change reaches the cache by notification, and a
	// listener that reconnects flushes the cache (notifications may have been missed). A
	// shorter TTL costs a Postgres load per active channel and TTL for no freshness gained.
	DefaultTTL = 5 * time.Minute
	// negativeTTL is how long a token known to be nobody's is answered from memory.
	negativeTTL = 5 * time.Second
	// maxNegativeEntries bounds the tokens known to be nobody's (two generations of half).
	maxNegativeEntries = 100_000
	// fetchTimeout bounds every load of a channel from Postgres, whoever waits for it.
	fetchTimeout = 5 * time.Second
)

// ChannelStore is what the cache reads and writes ([store.Store]).
type ChannelStore interface {
	RelayChannelByToken(ctx context.Context, token string) (store.RelayChannel, error)
	RelayChannelByID(ctx context.Context, id uuid.UUID) (store.RelayChannel, error)
	MarkUpstreamDisconnected(ctx context.Context, id uuid.UUID) error
}

type entry struct {
	ch         *store.RelayChannel
	fetched    time.Time
	refreshing atomic.Bool // a background refresh is under way
}

// Cache resolves channel tokens without a Postgres query per request. Entries live TTL at most
// (a backstop); every change to a channel is announced by a Postgres trigger and, while Listen
// runs, drops the channel's entry on every instance at once. Tokens that are nobody's are
// remembered for a few seconds in a bounded table: when it is full the oldest half is dropped,
// so the newest garbage is still answered from memory.
type Cache struct {
	store        ChannelStore
	ttl          time.Duration
	now          func() time.Time
	fetchTimeout time.Duration
	maxNegatives int
	logger       *zap.Logger

	mu     sync.RWMutex
	byHash map[[32]byte]*entry
	byID   map[uuid.UUID][32]byte
	// ids holds the channels looked up by id (ByID), whose tokens the cache does not know;
	// invalidated with the rest.
	ids map[uuid.UUID]*entry
	// neg and negOld are the two generations of tokens known to be nobody's, by hash, with
	// the time they were looked up.
	neg, negOld map[[32]byte]time.Time
	epoch       uint64 // bumped by every invalidation, so a fetch that raced one is not cached
	sf          singleflight.Group
	windows     *Windows // kept current by the same listener (SetWindows); nil: none
}

// SetWindows has Listen keep ws current too: intake's contact notifications, and the
// reconnections that drop its sets. Call it before Listen.
func (c *Cache) SetWindows(ws *Windows) { c.windows = ws }

// NewCache returns a cache over s whose entries live at most ttl (DefaultTTL if ttl <= 0).
func NewCache(s ChannelStore, ttl time.Duration) *Cache {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	return &Cache{store: s, ttl: ttl, now: time.Now, fetchTimeout: fetchTimeout, maxNegatives: maxNegativeEntries,
		logger: zap.NewNop(), byHash: map[[32]byte]*entry{}, byID: map[uuid.UUID][32]byte{}, ids: map[uuid.UUID]*entry{},
		neg: map[[32]byte]time.Time{}, negOld: map[[32]byte]time.Time{}}
}

// SetLogger sets where background failures (refreshes) are logged.
func (c *Cache) SetLogger(l *zap.Logger) { c.logger = l }

// Lookup returns the channel of token, or ErrUnknownToken. It waits for Postgres at most
// until ctx ends.
func (c *Cache) Lookup(ctx context.Context, token string) (*store.RelayChannel, error) {
	h := sha256.Sum256([]byte(token))
	now := c.now()
	c.mu.RLock()
	e := c.byHash[h]
	t, negative := c.neg[h]
	if !negative {
		t, negative = c.negOld[h]
	}
	c.mu.RUnlock()
	if e == nil && negative && now.Sub(t) < negativeTTL {
		return nil, ErrUnknownToken
	}
	if e != nil {
		age := now.Sub(e.fetched)
		switch {
		case age < c.ttl:
			return e.ch, nil
		case age < 2*c.ttl:
			// Stale but within the grace period: serve it and refresh it in the background,
			// once, so no request waits on Postgres for the TTL backstop (changes arrive by
			// notification).
			if e.refreshing.CompareAndSwap(false, true) {
				c.sf.DoChan(string(h[:]), func() (any, error) { return c.load(token, h) })
			}
			return e.ch, nil
		}
	}
	return c.fetch(ctx, token, h)
}

// ByID returns the channel id, or store.ErrChannelNotFound, for work the relay does on a
// channel's behalf with no caller's token (broadcasts, relay/broadcast.go): from memory while
// an entry (by token or by id) is younger than the TTL, else from Postgres. Entries by id are
// kept current by the same notifications as the rest.
func (c *Cache) ByID(ctx context.Context, id uuid.UUID) (*store.RelayChannel, error) {
	now := c.now()
	c.mu.RLock()
	e := c.ids[id]
	if h, ok := c.byID[id]; ok && e == nil {
		e = c.byHash[h]
	}
	epoch := c.epoch
	c.mu.RUnlock()
	if e != nil && now.Sub(e.fetched) < c.ttl {
		return e.ch, nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.fetchTimeout)
	defer cancel()
	ch, err := c.store.RelayChannelByID(ctx, id)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.epoch == epoch { // else invalidated while fetching: the result may be stale
		c.ids[id] = &entry{ch: &ch, fetched: now}
	}
	c.mu.Unlock()
	return &ch, nil
}

// Known reports whether token names a channel the cache holds, one that Lookup answers from
// memory: a credential known valid, which the auth guard never refuses (internal/authguard). It
// never queries.
func (c *Cache) Known(token string) bool {
	h := sha256.Sum256([]byte(token))
	c.mu.RLock()
	e := c.byHash[h]
	c.mu.RUnlock()
	return e != nil && c.now().Sub(e.fetched) < 2*c.ttl
}

// fetch loads the token's channel (one load per token at a time, shared by every waiter) and
// waits for it until ctx ends.
func (c *Cache) fetch(ctx context.Context, token string, h [32]byte) (*store.RelayChannel, error) {
	res := c.sf.DoChan(string(h[:]), func() (any, error) { return c.load(token, h) })
	select {
	case r := <-res:
		if r.Err != nil {
			return nil, r.Err
		}
		if ch := r.Val.(*store.RelayChannel); ch != nil {
			return ch, nil
		}
		return nil, ErrUnknownToken
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// load reads the token's channel from Postgres under its own deadline (no single waiter's
// context: the result serves them all) and caches the answer.
func (c *Cache) load(token string, h [32]byte) (v any, err error) {
	defer func() {
		if p := recover(); p != nil {
			c.logger.Error("relay: loading a channel panicked", zap.Any("panic", p))
			v, err = nil, fmt.Errorf("relay: loading a channel panicked: %v", p)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), c.fetchTimeout)
	defer cancel()
	c.mu.RLock()
	epoch := c.epoch
	c.mu.RUnlock()
	ch, err := c.store.RelayChannelByToken(ctx, token)
	if err != nil && !errors.Is(err, store.ErrChannelNotFound) {
		c.mu.RLock()
		if e := c.byHash[h]; e != nil {
			e.refreshing.Store(false) // let a later request try again
		}
		c.mu.RUnlock()
		c.logger.Warn("relay: loading a channel failed", zap.Error(err))
		return nil, err
	}
	var cp *store.RelayChannel
	if err == nil {
		cp = &ch
	}
	c.put(h, cp, epoch)
	return cp, nil
}

func (c *Cache) put(h [32]byte, ch *store.RelayChannel, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch != epoch {
		return // invalidated while fetching: the result may be stale
	}
	now := c.now()
	if ch == nil {
		if old := c.byHash[h]; old != nil {
			delete(c.byID, old.ch.ID)
			delete(c.byHash, h)
		}
		if len(c.neg) >= c.maxNegatives/2 {
			c.negOld, c.neg = c.neg, make(map[[32]byte]time.Time, len(c.neg))
		}
		c.neg[h] = now
		return
	}
	delete(c.neg, h)
	delete(c.negOld, h)
	c.byID[ch.ID] = h
	c.byHash[h] = &entry{ch: ch, fetched: now}
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
	delete(c.ids, id)
}

// Flush drops every entry.
func (c *Cache) Flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	c.byHash = map[[32]byte]*entry{}
	c.byID = map[uuid.UUID][32]byte{}
	c.ids = map[uuid.UUID]*entry{}
	c.neg, c.negOld = map[[32]byte]time.Time{}, map[[32]byte]time.Time{}
}

// MarkDisconnected records a dead upstream token for the channel and drops its entry.
func (c *Cache) MarkDisconnected(ctx context.Context, id uuid.UUID) error {
	err := c.store.MarkUpstreamDisconnected(ctx, id)
	c.Invalidate(id)
	return err
}

// Listen keeps a dedicated connection (not from the pool) listening for channel changes (and,
// with SetWindows, intake's contact notifications) and invalidates entries as they arrive,
// until ctx ends. After every (re)connection it flushes the cache (and the windows), since
// notifications may have been missed while disconnected. ready, if not nil, is
// called after each successful LISTEN and the flush that follows it.
func (c *Cache) Listen(ctx context.Context, dsn string, logger *zap.Logger, ready func()) {
	channels := []string{NotifyChannel}
	if c.windows != nil {
		channels = append(channels, store.ContactsNotifyChannel)
	}
	(&pglisten.Listener{
		DSN:      dsn,
		Channels: channels,
		OnConnect: func() {
			c.Flush()
			if c.windows != nil {
				c.windows.Flush()
			}
			if ready != nil {
				ready()
			}
		},
		OnNotify: func(channel, payload string) {
			if channel == store.ContactsNotifyChannel {
				c.windows.Apply(payload)
				return
			}
			if id, err := uuid.Parse(payload); err == nil {
				c.Invalidate(id) // (the windows need not be: see Windows)
			}
		},
		Logger: logger,
	}).Run(ctx)
}
