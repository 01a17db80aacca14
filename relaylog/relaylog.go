// Package relaylog writes the relay log (docs/relay.md, "Relay log"): the relay hands every call
// on its send path to a [Writer] ([relay.CallLog]), which keeps it in a bounded buffer and
// writes the buffer to Postgres in batches from a goroutine of its own. The relay never waits
// for its log: a call that finds the buffer full, or whose batch fails, is dropped and counted.
//
// What one channel can make the writer write is bounded: a refusal of the relay's own
// (store.KeepsRow false: a 429, an inactive channel, a bad body…) is never a row of its own but
// is counted, in memory, per channel, second, outcome and status, and written as one row with
// its count (store.RelayCall.Calls, relay_counts); so is every call of a channel beyond
// Config.PerChannel rows in one second. A flood of refusals takes no place in the buffer, and
// costs the database one row per channel, second and outcome.
package relaylog

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/relay"
	"github.com/wabarelay/wabarelay/store"
)

// Defaults of Config.
const (
	DefaultBuffer   = 16384
	DefaultBatch    = 1000
	DefaultInterval = time.Second
	// DefaultPerChannel is Config.PerChannel's default: as many rows a second as the relay's
	// default limit lets a channel send in a minute.
	DefaultPerChannel = 100
	// maxCounts bounds the counts kept in memory between two batches (rows of relay_counts to
	// write); a call that would need one more is dropped and counted.
	maxCounts = 65536
	// DefaultStopTimeout bounds Stop's final flush.
	DefaultStopTimeout = 5 * time.Second
	// writeTimeout bounds the write of one batch: a database slower than this loses the batch
	// (the buffer fills meanwhile, and further calls are dropped).
	writeTimeout = 10 * time.Second
	// failureLogEvery spaces the warnings about failed batches.
	failureLogEvery = 10 * time.Second
)

// Config sizes a Writer. Zero fields take their defaults.
type Config struct {
	// Buffer is the most calls waiting to be written; a call beyond it is dropped. Default:
	// 16384 (DefaultBuffer).
	Buffer int
	// Batch is the most calls written at once. Default: 1000 (DefaultBatch).
	Batch int
	// Interval is the longest a call waits before its batch is written. Default: 1s
	// (DefaultInterval).
	Interval time.Duration
	// StopTimeout bounds the final flush of Stop. Default: 5s (DefaultStopTimeout).
	StopTimeout time.Duration
	// PerChannel is the most calls of one channel that become rows of their own in one second
	// (of this instance's clock); the channel's further calls in that second are counted
	// (relay_counts) like refusals. Default: 100 (DefaultPerChannel).
	PerChannel int
}

func (c Config) withDefaults() Config {
	if c.Buffer <= 0 {
		c.Buffer = DefaultBuffer
	}
	if c.Batch <= 0 {
		c.Batch = DefaultBatch
	}
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = DefaultStopTimeout
	}
	if c.PerChannel <= 0 {
		c.PerChannel = DefaultPerChannel
	}
	return c
}

var _ Sink = (*store.Store)(nil)

// Sink is where batches go: [store.Store].
type Sink interface {
	// WriteRelayLog writes a batch.
	WriteRelayLog(ctx context.Context, calls []store.RelayCall) error
	// SettleMessages gives the messages whose first status came before their send's log row
	// their send's time (called after each batch, and once more an interval later).
	SettleMessages(ctx context.Context) error
}

// Observer is told what the writer did (metrics). Its methods must not block.
type Observer interface {
	// Written counts calls written to the database.
	Written(n int)
	// Dropped counts calls lost: the buffer was full, their batch failed, or the writer was
	// stopped.
	Dropped(n int)
}

// Writer is a [relay.CallLog] writing to a Sink in batches. Record never blocks. Start it once;
// Stop flushes what is buffered (bounded by Config.StopTimeout). It is safe for concurrent use.
type Writer struct {
	sink   Sink
	cfg    Config
	obs    Observer
	logger *zap.Logger

	buf      chan relay.Call
	stopping chan struct{}
	done     chan struct{}
	start    sync.Once
	stop     sync.Once
	stopped  atomic.Bool
	running  atomic.Bool // started

	written, dropped atomic.Int64
	lastWarn         time.Time // the run goroutine's

	mu sync.Mutex // guards what follows
	// second is the second (Unix time) rows counts the rows of; rows are the calls of each channel
	// that became rows of their own in it.
	second int64
	rows   map[uuid.UUID]int
	// counts are the calls counted since the last batch, by relay_counts row.
	counts map[countKey]int
}

// countKey is a row of relay_counts: calls of one channel in one second with one outcome and
// status.
type countKey struct {
	second  int64
	org     uuid.UUID
	channel uuid.UUID
	outcome relay.Outcome
	status  int
}

// New returns a writer to sink sized by cfg. obs and logger may be nil.
func New(sink Sink, cfg Config, obs Observer, logger *zap.Logger) *Writer {
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = zap.NewNop()
	}
	return &Writer{sink: sink, cfg: cfg, obs: obs, logger: logger,
		buf: make(chan relay.Call, cfg.Buffer), stopping: make(chan struct{}), done: make(chan struct{}),
		rows: map[uuid.UUID]int{}, counts: map[countKey]int{}}
}

// Config returns the writer's configuration, defaults applied.
func (w *Writer) Config() Config { return w.cfg }

// Record takes one call for the log without waiting. A call that keeps a row of its own
// (store.KeepsRow), within its channel's Config.PerChannel rows of the current second, goes to
// the buffer; any other is counted in memory and written with the next batch as a count. When
// the buffer (or the counts' table) is full, or the writer is stopped, the call is dropped and
// counted.
func (w *Writer) Record(c relay.Call) {
	if w.stopped.Load() {
		w.drop(1)
		return
	}
	if store.KeepsRow(string(c.Outcome)) && w.rowAllowed(c.ChannelID) {
		select {
		case w.buf <- c:
		default:
			w.drop(1)
		}
		return
	}
	k := countKey{second: c.At.Unix(), org: c.OrgID, channel: c.ChannelID, outcome: c.Outcome, status: c.Status}
	w.mu.Lock()
	n, ok := w.counts[k]
	counted := ok || len(w.counts) < maxCounts
	if counted {
		w.counts[k] = n + 1
	}
	w.mu.Unlock()
	if !counted {
		w.drop(1)
	}
}

// rowAllowed counts a row of its own for the channel in the current second, and reports whether
// it is within Config.PerChannel.
func (w *Writer) rowAllowed(channel uuid.UUID) bool {
	now := time.Now().Unix()
	w.mu.Lock()
	defer w.mu.Unlock()
	if now != w.second {
		w.second = now
		clear(w.rows)
	}
	n := w.rows[channel]
	if n >= w.cfg.PerChannel {
		return false
	}
	w.rows[channel] = n + 1
	return true
}

// takeCounts appends the calls counted since the last call to batch, one store.RelayCall per
// relay_counts row, and forgets them; it returns the batch and how many calls they stand for.
func (w *Writer) takeCounts(batch []store.RelayCall) ([]store.RelayCall, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	calls := 0
	for k, n := range w.counts {
		batch = append(batch, store.RelayCall{At: time.Unix(k.second, 0), OrgID: k.org, ChannelID: k.channel,
			Outcome: string(k.outcome), Status: k.status, Calls: n})
		calls += n
	}
	clear(w.counts)
	return batch, calls
}

// Written returns how many calls were written so far.
func (w *Writer) Written() int64 { return w.written.Load() }

// Dropped returns how many calls were dropped so far.
func (w *Writer) Dropped() int64 { return w.dropped.Load() }

// Start starts the flush goroutine (once).
func (w *Writer) Start() {
	w.start.Do(func() {
		w.running.Store(true)
		go w.run()
	})
}

// Stop stops taking calls and writes what is buffered, waiting at most Config.StopTimeout;
// what is left then is dropped. Calls recorded afterwards are dropped. A writer never started
// drops its buffer.
func (w *Writer) Stop() {
	w.stop.Do(func() {
		w.stopped.Store(true)
		w.start.Do(func() {}) // no start after Stop
		if !w.running.Load() {
			_, counted := w.takeCounts(nil)
			w.drop(len(w.buf) + counted)
			return
		}
		close(w.stopping)
		select {
		case <-w.done:
		case <-time.After(w.cfg.StopTimeout + time.Second):
			w.logger.Warn("relay log: the final flush did not end in time")
		}
	})
}

func (w *Writer) drop(n int) {
	if n <= 0 {
		return
	}
	w.dropped.Add(int64(n))
	if w.obs != nil {
		w.obs.Dropped(n)
	}
}

// run collects calls into batches and writes one, with the calls counted meanwhile, when it is
// full or the interval has passed, until Stop; then it writes what is buffered and counted
// within the stop timeout.
func (w *Writer) run() {
	defer close(w.done)
	tick := time.NewTicker(w.cfg.Interval)
	defer tick.Stop()
	batch := make([]store.RelayCall, 0, w.cfg.Batch)
	settle := false // a batch with rows was written at the last flush
	flush := func(ctx context.Context) {
		rows := len(batch)
		var counted int
		batch, counted = w.takeCounts(batch)
		if len(batch) > 0 {
			w.write(ctx, batch, rows+counted)
			batch = batch[:0]
		}
		switch {
		case rows > 0:
			settle = true
			w.settle(ctx)
		case settle:
			// The statuses stored while the last batch was written did not see its calls, nor
			// did the settle after it see them: settle once more.
			settle = false
			w.settle(ctx)
		}
	}
	for {
		select {
		case c := <-w.buf:
			batch = append(batch, row(c))
			if len(batch) >= w.cfg.Batch {
				flush(context.Background())
			}
		case <-tick.C:
			flush(context.Background())
		case <-w.stopping:
			ctx, cancel := context.WithTimeout(context.Background(), w.cfg.StopTimeout)
			defer cancel()
			for {
				select {
				case c := <-w.buf:
					batch = append(batch, row(c))
					if len(batch) < w.cfg.Batch {
						continue
					}
				default:
				}
				if ctx.Err() != nil {
					_, counted := w.takeCounts(nil)
					w.drop(len(batch) + len(w.buf) + counted)
					return
				}
				last := len(batch) == 0 // nothing buffered: the counts' flush is the last
				flush(ctx)
				if last {
					return
				}
			}
		}
	}
}

// settle runs the sink's SettleMessages; a failure is logged at debug level (the next settle
// retries, and a message's row keeps its status's arrival meanwhile).
func (w *Writer) settle(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	if err := w.sink.SettleMessages(ctx); err != nil {
		w.logger.Debug("relay log: settling messages failed", zap.Error(err))
	}
}

// write writes one batch of calls (rows and counts, standing for that many calls), counting
// them written or dropped.
func (w *Writer) write(ctx context.Context, batch []store.RelayCall, calls int) {
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	err := w.sink.WriteRelayLog(ctx, batch)
	cancel()
	if err != nil {
		w.drop(calls)
		if now := time.Now(); now.Sub(w.lastWarn) >= failureLogEvery {
			w.lastWarn = now
			w.logger.Warn("relay log: a batch could not be written; its calls are dropped (counted)",
				zap.Int("calls", calls), zap.Error(err))
		}
		return
	}
	w.written.Add(int64(calls))
	if w.obs != nil {
		w.obs.Written(calls)
	}
}

// row is c as the store writes it.
func row(c relay.Call) store.RelayCall {
	return store.RelayCall{At: c.At, OrgID: c.OrgID, ChannelID: c.ChannelID, Status: c.Status, Outcome: string(c.Outcome),
		ErrorCode: c.ErrorCode, ErrorSubcode: c.ErrorSubcode, Latency: c.Latency, IdempotencyKey: c.IdempotencyKey,
		Replayed: c.Replayed, Recipient: c.Recipient, WAMID: c.WAMID}
}

// Interface guards.
var (
	_ relay.CallLog = (*Writer)(nil)
	_ Sink          = (*store.Store)(nil)
)
