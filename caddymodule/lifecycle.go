package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/dispatcher"
	"github.com/wabarelay/wabarelay/store"
)

// The app's lifecycle: Start runs the background work of a configuration (migrations at start,
// the channel change listener, the maintenance, the number health worker, the broadcast
// sender, the relay log, the dispatcher), Stop ends it,
// Cleanup releases the shared clients.

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
	a.startHealth(lctx)
	if a.relayLog != nil {
		a.relayLog.Start()
	}
	a.startBroadcasts(lctx)
	if err := a.startDispatcher(lctx); err != nil {
		cancel()
		<-a.listenerDone
		a.stopBroadcasts()
		return fmt.Errorf("wabarelay: delivery: %w", err)
	}
	a.logger.Info("wabarelay started", zap.String("upstream", a.Upstream))
	return nil
}

// Stop stops background work (bounded wait). Shared clients stay open for in-flight requests;
// Cleanup releases them.
func (a *App) Stop() error {
	// The relays' work after their answers, the idempotency stores of answered sends (each
	// bounded to 5 s): a process about to exit should not leave their keys claimed until the
	// lease ends.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = a.afterAnswer.Wait(ctx)
	cancel()
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
		a.stopHealth()
		a.stopBroadcasts()
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

// startDispatcher starts webhook delivery for this config. During a reload the new config's
// dispatcher starts before the old one stops; claims are leased rows, so both may run. With
// delivery { workers 0 } it starts none: a.dispatcher stays nil, and the inbound handler leaves
// every delivery pending for the dispatchers of other instances.
func (a *App) startDispatcher(ctx context.Context) error {
	if d := a.Delivery; d != nil && d.Workers != nil && *d.Workers == 0 {
		a.logger.Info("delivery workers 0: this instance runs no dispatcher; deliveries it stores are left to the dispatchers of other instances")
		return nil
	}
	cfg, secrets := a.dispatcherConfig()
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

// Cleanup releases the shared clients. It is safe to call more than once and without Start.
// Every client is released; the error joins what their destructors returned.
func (a *App) Cleanup() error {
	if a.released {
		return nil
	}
	a.released = true
	errs := []error{a.mgmtLimiter.release()}
	if a.idemKey != "" {
		errs = append(errs, releaseIdempotency(a.idemKey))
	}
	if a.redisKey != "" {
		errs = append(errs, releaseRedis(a.redisKey))
	}
	if a.poolKey != "" {
		errs = append(errs, releasePool(a.poolKey))
	}
	return errors.Join(errs...)
}
