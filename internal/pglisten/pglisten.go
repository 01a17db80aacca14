// Package pglisten keeps a dedicated Postgres connection LISTENing on notification channels,
// reconnecting with backoff: the one listener every wabarelay component uses (the relay's
// channel cache, the delivery dispatcher).
//
// The connection string is parsed like the app's pool (pgxpool.ParseConfig), so pool-only
// parameters such as pool_max_conns are accepted and left out of the startup message.
package pglisten

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// Defaults of [Listener].
const (
	DefaultConnectTimeout = 10 * time.Second
	DefaultMinBackoff     = 100 * time.Millisecond
	DefaultMaxBackoff     = 5 * time.Second
)

// Listener listens on Channels until its Run's context ends.
type Listener struct {
	// DSN is the Postgres connection string (URL or key=value), as given to the pool.
	DSN string
	// Channels are the notification channels to LISTEN on.
	Channels []string
	// OnConnect, if set, is called after every successful (re)connection and LISTEN, before
	// any notification of that connection: notifications may have been missed meanwhile, so
	// callers flush what they cache or look for work.
	OnConnect func()
	// OnNotify is called for every notification, in order, from Run's goroutine.
	OnNotify func(channel, payload string)
	// Logger receives connection losses (never the DSN). Nil means no logging.
	Logger *zap.Logger
	// ConnectTimeout bounds each connection attempt. Default: 10s.
	ConnectTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between reconnection attempts (doubling from
	// min to max; reset after a successful connection). Defaults: 100ms and 5s.
	MinBackoff, MaxBackoff time.Duration
}

// Run listens until ctx ends, reconnecting after any failure. A panic in a callback is
// recovered, logged, and treated as a lost connection.
func (l *Listener) Run(ctx context.Context) {
	log := l.Logger
	if log == nil {
		log = zap.NewNop()
	}
	minB, maxB := l.MinBackoff, l.MaxBackoff
	if minB <= 0 {
		minB = DefaultMinBackoff
	}
	if maxB < minB {
		maxB = max(DefaultMaxBackoff, minB)
	}
	backoff := minB
	for ctx.Err() == nil {
		err := l.once(ctx, func() { backoff = minB })
		if ctx.Err() != nil {
			return
		}
		log.Warn("listen connection lost; reconnecting", zap.Strings("channels", l.Channels), zap.Error(err), zap.Duration("retry_in", backoff))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxB)
	}
}

func (l *Listener) once(ctx context.Context, connected func()) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("listener callback panicked: %v", v)
		}
	}()
	cfg, err := pgxpool.ParseConfig(l.DSN)
	if err != nil {
		return errors.New("invalid connection string") // never the string: it may hold a password
	}
	timeout := l.ConnectTimeout
	if timeout <= 0 {
		timeout = DefaultConnectTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	conn, err := pgx.ConnectConfig(cctx, cfg.ConnConfig)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx) // the connection is dropped either way; the next attempt dials anew
	}()
	for _, ch := range l.Channels {
		lctx, cancel := context.WithTimeout(ctx, timeout)
		_, err := conn.Exec(lctx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
		cancel()
		if err != nil {
			return err
		}
	}
	connected()
	if l.OnConnect != nil {
		l.OnConnect()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if l.OnNotify != nil {
			l.OnNotify(n.Channel, n.Payload)
		}
	}
}
