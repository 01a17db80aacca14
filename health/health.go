// Package health keeps every connected number's health (DESIGN §5c "Number health"): a small
// worker claims the channels whose read is due (store.Store.ClaimHealthReads: at connect and
// reconnect, after the account webhooks of the channel's business account, and periodically at
// each channel's own phase of the refresh interval), reads the number's quality rating,
// messaging limit, throughput and name status from the upstream with the channel's own token,
// and records them (store.Store.RecordHealthRead, which announces a change by a channel_health
// event). A dead token (code 190) is the relay's transition: store.Store.MarkUpstreamDisconnected.
//
// Due times live in Postgres, so any number of instances may run a worker: a claim moves the
// due time ahead under FOR UPDATE SKIP LOCKED, and no two instances read the same channel.
package health

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/graph"
	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/store"
)

// Defaults of Config.
const (
	// DefaultRefresh is the interval of the periodic read (wabarelay { health_refresh }).
	DefaultRefresh = 6 * time.Hour
	// DefaultPoll is how often the worker looks for due reads.
	DefaultPoll = 5 * time.Second
	// DefaultBatch is the most reads claimed at once.
	DefaultBatch = 50
	// DefaultConcurrency is the most reads in flight per instance.
	DefaultConcurrency = 4
	// DefaultLease is how long a claimed read is reserved: a read whose instance died is made
	// again after it. Longer than graph.DefaultTimeout.
	DefaultLease = 2 * time.Minute
	// qualityEvery is how often Run refreshes Observer.ChannelsByQuality (and after every
	// round that made reads).
	qualityEvery = time.Minute
)

// deadTokenCode is the upstream's error code of a dead access token.
const deadTokenCode = 190

// Reader reads a number's health from the upstream (*graph.Client).
type Reader interface {
	GetNumberHealth(ctx context.Context, token, phoneNumberID string) (graph.NumberHealth, error)
}

// Observer is told what the worker sees (metrics). Its methods must not block.
type Observer interface {
	// ChannelsByQuality reports the active channels by known quality rating (after each round
	// of reads, and at least once a minute).
	ChannelsByQuality(counts map[string]int)
}

// Config configures a Worker. Zero fields take their defaults.
type Config struct {
	// Refresh is the interval of the periodic read. Default: DefaultRefresh.
	Refresh time.Duration
	// NoRefresh turns the periodic read off (`health_refresh off`): reads happen only at
	// connect and after account webhooks.
	NoRefresh bool
	// Poll is how often due reads are looked for. Default: DefaultPoll.
	Poll time.Duration
	// Batch is the most reads claimed at once. Default: DefaultBatch.
	Batch int
	// Concurrency is the most reads in flight. Default: DefaultConcurrency.
	Concurrency int
	// Lease is how long a claim is reserved. Default: DefaultLease.
	Lease time.Duration
	// Clock is the time the worker waits by (nil: the real time); a clock.Notifier (a test's
	// clock.Stub) wakes it when it jumps. The store decides what is due by its own clock
	// (store.Store.SetClock).
	Clock clock.Clock
	// Observer, when set, receives the counts by quality.
	Observer Observer
}

// refresh is the periodic interval, 0 when off.
func (c Config) refresh() time.Duration {
	if c.NoRefresh {
		return 0
	}
	if c.Refresh > 0 {
		return c.Refresh
	}
	return DefaultRefresh
}

func (c Config) withDefaults() Config {
	if c.Poll <= 0 {
		c.Poll = DefaultPoll
	}
	if c.Batch <= 0 {
		c.Batch = DefaultBatch
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	return c
}

// Worker reads the numbers' health when due. Create it with New; Run runs it.
type Worker struct {
	st   *store.Store
	rd   Reader
	cfg  Config
	log  *zap.Logger
	wake chan struct{}
}

// New returns a Worker reading with rd and recording in st. A nil logger logs nothing.
func New(st *store.Store, rd Reader, cfg Config, logger *zap.Logger) *Worker {
	if logger == nil {
		logger = zap.NewNop()
	}
	w := &Worker{st: st, rd: rd, cfg: cfg.withDefaults(), log: logger, wake: make(chan struct{}, 1)}
	if n, ok := cfg.Clock.(clock.Notifier); ok {
		n.OnChange(w.Wake)
	}
	return w
}

// Wake makes a running worker look for due reads now.
func (w *Worker) Wake() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Run schedules the periodic reads under the configured interval (store.Store.ScheduleHealth),
// then makes the due reads every Poll (or when woken) until ctx ends; it returns once the reads
// in flight are done.
func (w *Worker) Run(ctx context.Context) {
	if err := w.st.ScheduleHealth(ctx, w.cfg.refresh()); err != nil && ctx.Err() == nil {
		w.log.Warn("health: scheduling the periodic reads failed; reads at connect and after account webhooks go on", zap.Error(err))
	}
	tick := time.NewTicker(w.cfg.Poll)
	defer tick.Stop()
	var counted time.Time
	for {
		n, err := w.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			w.log.Warn("health: claiming due reads failed", zap.Error(err))
		}
		if o := w.cfg.Observer; o != nil && (n > 0 || time.Since(counted) >= qualityEvery) {
			if counts, err := w.st.ChannelsByQuality(ctx); err == nil {
				o.ChannelsByQuality(counts)
				counted = time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-w.wake:
		}
	}
}

// RunOnce makes every read due now, Concurrency at a time, and returns how many reads it
// finished. A failed read is recorded (tried again after a back-off) and logged, not returned;
// the error is a failed claim.
func (w *Worker) RunOnce(ctx context.Context) (int, error) {
	done := 0
	for ctx.Err() == nil {
		reads, err := w.st.ClaimHealthReads(ctx, w.cfg.Batch, w.cfg.Lease)
		if err != nil {
			return done, err
		}
		if len(reads) == 0 {
			return done, nil
		}
		sem := make(chan struct{}, w.cfg.Concurrency)
		var wg sync.WaitGroup
		for _, r := range reads {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				w.read(ctx, r)
			}()
		}
		wg.Wait()
		done += len(reads)
		if len(reads) < w.cfg.Batch {
			return done, nil
		}
	}
	return done, ctx.Err()
}

// read makes one claimed read and records its outcome.
func (w *Worker) read(ctx context.Context, r store.HealthRead) {
	log := w.log.With(zap.Stringer("channel_id", r.ChannelID))
	refresh := w.cfg.refresh()
	if !r.Readable {
		if err := w.st.SkipHealthRead(ctx, r, refresh); err != nil {
			log.Warn("health: ending a skipped read failed", zap.Error(err))
		}
		return
	}
	got, err := w.rd.GetNumberHealth(ctx, r.UpstreamToken, r.PhoneNumberID)
	if ge, ok := errors.AsType[*graph.Error](err); ok && ge.Code == deadTokenCode {
		// the relay's transition: one channel_status upstream_disconnected, however many meet it
		if err := w.st.MarkUpstreamDisconnected(ctx, r.ChannelID); err != nil {
			log.Warn("health: recording the dead upstream token failed", zap.Error(err))
			return // the claim's lease runs out and the read is made again
		}
		log.Warn("health: the upstream rejected the channel's token (code 190); channel marked upstream_disconnected")
		if err := w.st.SkipHealthRead(ctx, r, refresh); err != nil {
			log.Warn("health: ending the read failed", zap.Error(err))
		}
		return
	}
	if err != nil {
		if ctx.Err() != nil {
			return // stopping: the lease runs out and another read is made
		}
		log.Warn("health: reading the number's health failed; trying again later", zap.Error(err))
		if err := w.st.FailHealthRead(ctx, r); err != nil {
			log.Warn("health: recording the failed read failed", zap.Error(err))
		}
		return
	}
	out, err := w.st.RecordHealthRead(ctx, r, toStore(got), refresh)
	if err != nil {
		log.Warn("health: recording the read failed", zap.Error(err))
		return
	}
	if len(out.Changed) > 0 {
		log.Info("health: the number's health changed", zap.Strings("changed", out.Changed))
	}
}

// toStore is a read's answer as the store takes it: an empty string is a field the answer lacked.
func toStore(h graph.NumberHealth) store.ChannelHealth {
	opt := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	return store.ChannelHealth{QualityRating: opt(h.QualityRating), MessagingLimit: opt(h.MessagingLimit),
		Throughput: opt(h.Throughput), NameStatus: opt(h.NameStatus)}
}
