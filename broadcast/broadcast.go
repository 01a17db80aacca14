// Package broadcast sends broadcasts (DESIGN §5c "Broadcasts", docs/broadcasts.md): paced
// template sends to many recipients, each sent at most once. A [Worker] claims one recipient at
// a time from Postgres (store.ClaimBroadcastSend: the broadcast's row is the pace gate shared by
// every instance, and the recipient is marked `sending` and committed before the upstream call)
// and hands it to one of a few goroutines per instance, which sends it through the relay's own
// path ([Sender], relay.Relay.SendFor) and writes what came of it (store.FinishBroadcastSend). A
// sweep turns the recipients whose lease ran out — their outcome lost with a crashed instance —
// into `unknown`: they are never sent again.
package broadcast

import (
	"context"
	"errors"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/relay"
	"github.com/wabarelay/wabarelay/store"
)

// Defaults of [Config].
const (
	// DefaultWorkers is the number of sends in flight per instance. The pace of each broadcast
	// is set by its rate, not by this: a few workers are enough for any rate whose sends take
	// less than workers × 60 s / rate each.
	DefaultWorkers = 4
	// DefaultLease is how long a claimed recipient stays `sending` before the sweep decides
	// its outcome was lost (`unknown`). It must exceed the longest send (relay.SendDeadline).
	DefaultLease = 2 * time.Minute
)

// Timing of the worker.
const (
	// maxNap caps a worker's sleep when nothing is due, so that a broadcast created or resumed
	// meanwhile (on any instance) starts within it.
	maxNap = time.Second
	// errorNap is the pause after a failed claim (Postgres down), so a worker does not spin.
	errorNap = 2 * time.Second
	// lookupRetry is when a send whose channel could not be looked up is tried again.
	lookupRetry = 5 * time.Second
	// finishTimeout bounds one write of an outcome; finishTries is how often it is tried.
	finishTimeout = 5 * time.Second
	finishTries   = 3
	// retryBase is the base of the retry backoff: retryBase^attempt seconds (4, 16, 64, 256,
	// 1024 s), after the upstream's throughput (130429) and pair rate (131056) errors, a 5xx,
	// or a network error that provably sent nothing.
	retryBase = 4
)

// Upstream error codes the sender treats apart (research/whatsapp-limits.md).
const (
	codeThroughput = 130429 // the number's throughput is exceeded: retried
	codePairRate   = 131056 // too many messages to the same recipient: retried
)

// Sender sends one broadcast message on behalf of a channel through the relay's path
// ([RelaySender]). An error means the channel could not be resolved and nothing was sent:
// store.ErrChannelNotFound for a channel that no longer exists.
type Sender interface {
	SendFor(ctx context.Context, channelID uuid.UUID, body []byte) (relay.SendResult, error)
}

// Store is what the worker needs of the store ([store.Store]).
type Store interface {
	ClaimBroadcastSend(ctx context.Context, lease time.Duration) (*store.BroadcastSend, time.Time, error)
	FinishBroadcastSend(ctx context.Context, send *store.BroadcastSend, o store.BroadcastOutcome) error
	ExpireBroadcastLeases(ctx context.Context) (int64, error)
}

// Config configures a [Worker]. Zero values take the defaults.
type Config struct {
	// Workers is the number of sends in flight on this instance. Default: DefaultWorkers.
	Workers int
	// Lease is how long a claimed recipient stays reserved; the sweep that turns expired
	// leases into `unknown` runs every Lease/4. Default: DefaultLease.
	Lease time.Duration
}

func (c Config) withDefaults() Config {
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	return c
}

// Worker sends the broadcasts' recipients, paced by the store's claim. See the package doc.
type Worker struct {
	store  Store
	sender Sender
	cfg    Config
	logger *zap.Logger
	now    func() time.Time
}

// New returns a worker over st that sends through s.
func New(st Store, s Sender, cfg Config, logger *zap.Logger) *Worker {
	if logger == nil {
		logger = zap.NewNop()
	}
	return &Worker{store: st, sender: s, cfg: cfg.withDefaults(), logger: logger, now: time.Now}
}

// Run sends until ctx ends, then waits for the sends in flight and writes their outcomes. One
// goroutine claims, and hands each claimed recipient to a goroutine of its own, at most Workers
// in flight: a claim waits for a free slot, and a claim that finds nothing due sleeps until the
// earliest broadcast's next send. One claimer per instance, not one per worker: workers that all
// woke at the same gate claimed in turn, the losers retrying until the winner committed — about
// 16 Postgres transactions per send at 6,000 a minute where 2 do (bench/broadcast).
func (w *Worker) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { w.sweep(ctx) })
	slots := make(chan struct{}, w.cfg.Workers)
	for ctx.Err() == nil {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		send, nap := w.claim(ctx)
		if send == nil {
			<-slots
			sleep(ctx, nap)
			continue
		}
		wg.Go(func() {
			defer func() { <-slots }()
			w.send(ctx, send)
		})
	}
	wg.Wait()
}

// claim claims one recipient; without one, it returns how long to sleep before the next claim.
func (w *Worker) claim(ctx context.Context) (send *store.BroadcastSend, nap time.Duration) {
	send, wake, err := w.store.ClaimBroadcastSend(ctx, w.cfg.Lease)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			w.logger.Warn("broadcast: claiming a send failed", zap.Error(err))
		}
		return nil, errorNap
	case send != nil:
		return send, 0
	case wake.IsZero():
		return nil, maxNap
	}
	// Nothing due: until the earliest broadcast's next send (another instance may hold a due
	// one: then again shortly), at most maxNap.
	return nil, min(max(wake.Sub(w.now()), time.Millisecond), maxNap)
}

// send sends one claimed recipient and writes what came of it. The claim is committed: from
// here the send runs to its end and its outcome is written even if ctx ends.
func (w *Worker) send(ctx context.Context, send *store.BroadcastSend) {
	defer func() {
		if v := recover(); v != nil {
			// (the lease's sweep will call the recipient unknown: never sent again)
			w.logger.Error("broadcast: a send panicked", zap.Any("panic", v))
		}
	}()
	at := w.now()
	res, err := w.sender.SendFor(ctx, send.ChannelID, send.Body)
	o := Classify(send.Attempt, res, err, w.now())
	o.At = at
	if o.WAMID == "" && res.WAMID != "" {
		o.WAMID = res.WAMID
	}
	if err != nil && !errors.Is(err, store.ErrChannelNotFound) {
		w.logger.Warn("broadcast: looking up the channel failed; the send is requeued",
			zap.String("channel_id", send.ChannelID.String()), zap.Error(err))
	}
	fctx := context.WithoutCancel(ctx)
	for try := 1; ; try++ {
		c, cancel := context.WithTimeout(fctx, finishTimeout)
		err := w.store.FinishBroadcastSend(c, send, o)
		cancel()
		if err == nil {
			return
		}
		if try == finishTries {
			// The lease's sweep will call it unknown; a later outcome still applies.
			w.logger.Error("broadcast: writing a send's outcome failed",
				zap.String("broadcast_id", send.BroadcastID.String()), zap.Int("seq", send.Seq),
				zap.String("kind", o.Kind), zap.Error(err))
			return
		}
		time.Sleep(time.Duration(try) * time.Second)
	}
}

// sweep turns expired leases into `unknown` every Lease/4 until ctx ends.
func (w *Worker) sweep(ctx context.Context) {
	t := time.NewTicker(w.cfg.Lease / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := w.store.ExpireBroadcastLeases(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			w.logger.Warn("broadcast: expiring leases failed", zap.Error(err))
		case n > 0:
			w.logger.Warn("broadcast: sends whose outcome was lost are now unknown (never sent again)", zap.Int64("recipients", n))
		}
	}
}

// Classify turns what came of a send (attempt: its number, 1 for the first) into the outcome
// to store, at now:
//   - accepted: a 2xx with the message's id;
//   - retry, after 4^attempt s: the upstream's 130429 and 131056, a 5xx of the upstream's, or a
//     network error that provably sent nothing (the store fails it instead after 6 attempts or
//     24 h);
//   - unknown: the send may have happened (a timeout, a cut or unreadable answer, a 2xx with no
//     message id): never sent again;
//   - requeue: the channel's limit was full (its callers used it) or the channel could not be
//     looked up: nothing was sent, the attempt does not count;
//   - disconnected: the channel's token is dead (190, or the relay's 503 CHANNEL_DISCONNECTED):
//     the broadcast pauses;
//   - cancel: the channel is not active, or no longer exists: the broadcast is cancelled;
//   - failed: any other error, with its code and title.
func Classify(attempt int, res relay.SendResult, err error, now time.Time) store.BroadcastOutcome {
	switch {
	case errors.Is(err, store.ErrChannelNotFound):
		return store.BroadcastOutcome{Kind: store.OutcomeCancel}
	case err != nil:
		return store.BroadcastOutcome{Kind: store.OutcomeRequeue, RetryAt: now.Add(lookupRetry)}
	case res.RateLimited:
		return store.BroadcastOutcome{Kind: store.OutcomeRequeue, RetryAt: now.Add(res.RetryAfter)}
	case res.Outcome == relay.OutcomeDisconnected:
		return store.BroadcastOutcome{Kind: store.OutcomeDisconnected, ErrorCode: res.ErrorCode, ErrorTitle: res.ErrorTitle}
	case res.Outcome == relay.OutcomeInactive:
		return store.BroadcastOutcome{Kind: store.OutcomeCancel}
	case res.Answered && res.Status >= 200 && res.Status < 300:
		if res.WAMID == "" {
			// Sent, but with no id the message cannot be followed: not accepted, never resent.
			return store.BroadcastOutcome{Kind: store.OutcomeUnknown}
		}
		return store.BroadcastOutcome{Kind: store.OutcomeAccepted, WAMID: res.WAMID}
	case res.Answered && (res.ErrorCode == codeThroughput || res.ErrorCode == codePairRate || res.Status >= 500):
		return store.BroadcastOutcome{Kind: store.OutcomeRetry, RetryAt: now.Add(Backoff(attempt)),
			ErrorCode: res.ErrorCode, ErrorTitle: titleOr(res.ErrorTitle, res.Status)}
	case res.Answered:
		return store.BroadcastOutcome{Kind: store.OutcomeFailed, ErrorCode: res.ErrorCode, ErrorTitle: titleOr(res.ErrorTitle, res.Status)}
	case res.Outcome == relay.OutcomeForbidden:
		// The channel's own number is outside its scope: it has none (not connected).
		return store.BroadcastOutcome{Kind: store.OutcomeFailed, ErrorTitle: relay.MsgPathNotAllowed}
	case res.NotSent:
		return store.BroadcastOutcome{Kind: store.OutcomeRetry, RetryAt: now.Add(Backoff(attempt)), ErrorTitle: relay.MsgUpstreamDown}
	default:
		return store.BroadcastOutcome{Kind: store.OutcomeUnknown}
	}
}

// Backoff is the wait before the retry that follows attempt (1-based): 4^attempt seconds.
func Backoff(attempt int) time.Duration {
	attempt = min(max(attempt, 1), 10)
	return time.Duration(math.Pow(retryBase, float64(attempt))) * time.Second
}

// titleOr returns title, or the status's text when the answer carried none.
func titleOr(title string, status int) string {
	if title != "" {
		return title
	}
	return http.StatusText(status)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Channels looks channels up by id ([relay.Cache.ByID]).
type Channels interface {
	ByID(ctx context.Context, id uuid.UUID) (*store.RelayChannel, error)
}

// RelaySender is the production [Sender]: the relay's own send path ([relay.Relay.SendFor])
// for the channel looked up by id.
type RelaySender struct {
	// Relay is the relay whose scope, limit, token swap and call log the sends go through.
	Relay *relay.Relay
	// Channels resolves the broadcast's channel.
	Channels Channels
	// Upstream makes the upstream call.
	Upstream relay.Upstream
}

// SendFor sends body for the channel id.
func (s RelaySender) SendFor(ctx context.Context, channelID uuid.UUID, body []byte) (relay.SendResult, error) {
	ch, err := s.Channels.ByID(ctx, channelID)
	if err != nil {
		return relay.SendResult{}, err
	}
	return s.Relay.SendFor(ctx, ch, body, s.Upstream), nil
}
