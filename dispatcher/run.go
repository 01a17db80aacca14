package dispatcher

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/internal/pglisten"
	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

// job is one claimed delivery: its attempt number and claim fence its outcome (see
// store.Queue.Record). An attempt is counted when its outcome is recorded, so a claim that is
// lost before that (the instance crashed, the lease expired and the delivery was reclaimed)
// uses up none.
type job = store.ClaimedDelivery

// result is what the completion writer records: a finished attempt, or (release) a claim
// handed back without an attempt.
type result struct {
	job        job
	release    bool
	releaseIn  time.Duration // release: delay before the delivery is due again
	ok         bool
	started    time.Time
	duration   time.Duration
	statusCode int    // 0: no response
	errMsg     string // the delivery log's text (a class, see classify)
	detail     string // the full error, for the operator's log only
	body       string
	final      bool // no retry, whatever the attempt number
}

// maxSecretFailures is how many times a delivery is handed back because its webhook's secret
// cannot be decrypted (a wrong or rotated encryption key) before it fails for good, with that
// reason in the delivery log, instead of being handed back every few seconds forever.
const maxSecretFailures = 3

// ErrSecretUnusable may be wrapped by a Secrets error that no retry can cure (the secret
// cannot be decrypted). A secret read's error that wraps secretbox.ErrOpen (a stored secret
// that no encryption key opens, as the store's reads return it) is taken as one too.
var ErrSecretUnusable = errors.New("webhook secret cannot be decrypted")

// secretError marks the error of a secret read that found a stored secret no encryption key
// opens (secretbox.ErrOpen) as ErrSecretUnusable: no retry cures it.
func secretError(err error) error {
	if errors.Is(err, secretbox.ErrOpen) && !errors.Is(err, ErrSecretUnusable) {
		return fmt.Errorf("%w: %w", ErrSecretUnusable, err)
	}
	return err
}

// Run claims and delivers until ctx ends, then waits (at most Timeout+1s) for the attempts in
// flight and records their outcomes. dsn is used for a dedicated LISTEN connection (not from
// the pool, reconnected with backoff); the poll every PollInterval is the backstop.
func (d *Dispatcher) Run(ctx context.Context, dsn string) {
	// Attempts are not cut short by ctx: they end on their own within Timeout, and are cut at
	// Timeout+1s after shutdown begins.
	attemptCtx, cancelAttempts := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelAttempts()
	d.mu.Lock()
	d.attemptCtx, d.running = attemptCtx, true
	d.mu.Unlock()

	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		d.writeResults()
	}()
	listenDone := make(chan struct{})
	go func() {
		defer close(listenDone)
		if dsn != "" {
			d.listen(ctx, dsn)
		}
	}()

	d.loop(ctx, attemptCtx)
	d.mu.Lock()
	d.running = false // no more reservations (nor waiting hand-offs); those taken are waited for below
	d.mu.Unlock()
	d.dropWaiting() // due again at once, for the next instance

	waited := make(chan struct{})
	go func() { d.attempts.Wait(); close(waited) }()
	t := time.NewTimer(d.cfg.Timeout + time.Second)
	select {
	case <-waited:
		t.Stop()
	case <-t.C:
		cancelAttempts()
		<-waited
	}
	close(d.results)
	<-writerDone
	<-listenDone
}

func (d *Dispatcher) loop(ctx, attemptCtx context.Context) {
	poll := time.NewTicker(d.cfg.PollInterval)
	defer poll.Stop()
	probeTick := time.NewTicker(d.probeEvery())
	defer probeTick.Stop()
	backoff := 0 * time.Millisecond
	for ctx.Err() == nil {
		d.claimProbes(ctx, attemptCtx) // failing webhooks' probes (health.go)
		free := d.free()
		more := false
		if free > 0 {
			limit := min(free, d.cfg.BatchSize)
			claimed := time.Now()
			jobs, drained, err := d.claim(ctx, limit)
			if ctx.Err() != nil {
				d.handBack(jobs) // (a claim that finished as shutdown began)
				return
			}
			d.mu.Lock()
			d.caughtUp = err == nil && drained
			d.mu.Unlock()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
				d.log.Warn("claiming deliveries", zap.Error(err), zap.Duration("retry_in", backoff))
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				continue
			}
			backoff = 0
			d.start(attemptCtx, jobs, claimed)
			// A claim shares its limit among the webhooks with due work, so one that took less
			// than its limit may still leave due rows: claim again until it drains the queue.
			more = !drained
		}
		// Waiting hand-offs take the room the claim left (and those that waited too long go back).
		d.startWaiting(attemptCtx)
		if more {
			if d.free() > 0 {
				continue // there may be more due rows right now
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-d.slotFree:
			// let a few more attempts finish so that the next claim is a batch
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Millisecond):
			}
		case <-poll.C:
		case <-probeTick.C:
		}
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// free returns the free worker slots.
func (d *Dispatcher) free() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cfg.Workers - d.active
}

// claim takes up to limit due deliveries (store.Queue.Claim: fairly across orgs, then across
// each org's webhooks; none for a webhook or org at its cap on this instance) and reports
// whether it drained the queue. Called by the claiming goroutine only.
func (d *Dispatcher) claim(ctx context.Context, limit int) ([]job, bool, error) {
	ctx, cancel := claimContext(ctx, d.claimTimeout())
	defer cancel()
	d.mu.Lock()
	busy := maps.Clone(d.perHook)
	busyOrgs := maps.Clone(d.perOrg)
	d.mu.Unlock()
	c, err := d.queue.Claim(ctx, store.QueueClaim{Instance: d.cfg.InstanceID, Lease: d.cfg.Lease, Limit: limit,
		PerWebhook: d.cfg.PerWebhook, Busy: busy, PerOrg: d.cfg.PerOrg, BusyOrgs: busyOrgs, After: d.cursors})
	if err != nil {
		return nil, false, err
	}
	if len(c.Next) > 100000 {
		clear(c.Next) // (orgs that once had work: start them over rather than grow forever)
	}
	d.cursors = c.Next
	if c.Reclaimed > 0 {
		d.reclaimed.Add(int64(c.Reclaimed))
		d.log.Warn("claimed deliveries whose lease had expired (an instance crashed or stalled)", zap.Int("count", c.Reclaimed))
	}
	return c.Deliveries, c.Drained, nil
}

// claimTimeout bounds a claim statement: the attempt timeout, but no less than DefaultTimeout
// (or half the lease, when that is shorter): an attempt timeout set short for receivers that
// answer fast must not cut claims short under load, since a claim cut short may still commit
// and strand what it took until the lease ends (see claimContext).
func (d *Dispatcher) claimTimeout() time.Duration {
	return max(d.cfg.Timeout, min(DefaultTimeout, d.cfg.Lease/2))
}

// claimContext returns the context of a claim statement under ctx: not cancelled when ctx is
// (shutdown), only after timeout. A claim cut short by a cancel may still commit on the
// server after the client gave up on it (pgx drops the connection; the backend runs the
// statement to its end), leaving deliveries locked by an instance that is gone until their
// lease runs out. Letting the statement finish instead returns what it took, to be handed
// back at once (handBack).
func claimContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), timeout)
}

// handBack returns claimed jobs to the queue, due at once, without an attempt.
func (d *Dispatcher) handBack(jobs []job) {
	for _, j := range jobs {
		d.results <- result{job: j, release: true}
	}
}

// start runs the jobs claimed at claimed within the per-webhook and per-org caps; the others
// are handed back at once.
func (d *Dispatcher) start(ctx context.Context, jobs []job, claimed time.Time) {
	now := d.now()
	for _, j := range jobs {
		d.mu.Lock()
		// (a failing webhook's one probe goes out whatever its old attempts still hold)
		run := (j.Probe || d.perHook[j.WebhookID] < d.cfg.PerWebhook && d.perOrg[j.OrgID] < d.cfg.PerOrg) && d.active < d.cfg.Workers
		held := d.heldLocally(j, now)
		run = run && held == 0
		if run {
			d.perHook[j.WebhookID]++
			d.perOrg[j.OrgID]++
			d.active++
		}
		d.mu.Unlock()
		if !run {
			d.results <- result{job: j, release: true, releaseIn: held}
			continue
		}
		d.attempts.Add(1)
		d.launch(ctx, j, claimed)
	}
}

// launch makes the attempt of j, claimed at claimed, in its own goroutine (counted in
// d.attempts by the caller) and hands its result to the writer. A panic in the attempt is
// logged and the delivery handed back for later, instead of taking the process down.
func (d *Dispatcher) launch(ctx context.Context, j job, claimed time.Time) {
	go func() {
		defer d.attempts.Done()
		r := result{job: j, release: true, releaseIn: d.cfg.secretRetry}
		func() {
			defer func() {
				if v := recover(); v != nil {
					d.log.Error("delivery attempt panicked; delivery handed back", zap.Stringer("delivery_id", j.ID), zap.Any("panic", v))
				}
			}()
			r = d.attempt(ctx, j, claimed)
		}()
		d.noteAttempt(r)
		// The slots are freed once the result is queued for the writer: a writer that falls
		// behind fills its queue and then holds back new claims, instead of letting finished
		// attempts pile up while their leases run.
		d.results <- r
		d.done(j)
	}()
}

// done frees the slots of a finished attempt.
func (d *Dispatcher) done(j job) {
	d.mu.Lock()
	wasFull := d.active >= d.cfg.Workers || d.perHook[j.WebhookID] >= d.cfg.PerWebhook || d.perOrg[j.OrgID] >= d.cfg.PerOrg
	d.active--
	if d.perHook[j.WebhookID]--; d.perHook[j.WebhookID] <= 0 {
		delete(d.perHook, j.WebhookID)
	}
	if d.perOrg[j.OrgID]--; d.perOrg[j.OrgID] <= 0 {
		delete(d.perOrg, j.OrgID)
	}
	d.mu.Unlock()
	if wasFull {
		signal(d.slotFree)
	}
}

// secrets returns the secrets to sign j's attempt with (cachedSecret.signingSecrets), from the
// cache while it is fresh and no rotation happened since it was read. The cache's freshness and
// a rotation's grace are decided by the dispatcher's clock, as the store decides the grace.
func (d *Dispatcher) secrets(ctx context.Context, j job) ([]string, error) {
	id := j.WebhookID
	now := d.now()
	d.mu.Lock()
	c, ok := d.cache[id]
	d.mu.Unlock()
	if ok && now.Before(c.expires) && sameTime(c.rotated, j.PreviousSecretExpiresAt) {
		return c.signingSecrets(now), nil
	}
	// Well inside the lease, with the attempt's Timeout after it: the lookup takes at most
	// half of what the lease leaves beyond the Timeout, so that lookup and attempt end, and the
	// outcome is recorded, before the lease does (a claim that outlives its lease is reclaimed
	// and sent again by another claim).
	ctx, cancel := context.WithTimeout(ctx, min(5*time.Second, (d.cfg.Lease-d.cfg.Timeout)/2))
	defer cancel()
	s, err := d.current(ctx, id)
	if err != nil {
		return nil, secretError(err)
	}
	c = cachedSecret{secret: s, expires: now.Add(d.secretTTL), rotated: j.PreviousSecretExpiresAt}
	// Only a webhook whose claim shows a grace still running has a previous secret to read.
	if p := j.PreviousSecretExpiresAt; p != nil && now.Before(*p) && d.cfg.PreviousSecrets != nil {
		if c.previous, c.previousUntil, err = d.cfg.PreviousSecrets(ctx, id); err != nil {
			return nil, secretError(err)
		}
	}
	d.mu.Lock()
	if len(d.cache) > 10000 {
		clear(d.cache)
	}
	d.cache[id] = c
	d.mu.Unlock()
	return c.signingSecrets(now), nil
}

// secretUnusable hands a delivery whose webhook secret cannot be decrypted back a few times (a
// key being rotated may come right), then fails it for good with the reason in the delivery
// log. It is logged once per delivery, when it fails.
func (d *Dispatcher) secretUnusable(j job, err error) result {
	d.mu.Lock()
	if len(d.secretFails) > 10000 {
		clear(d.secretFails)
	}
	d.secretFails[j.ID]++
	n := d.secretFails[j.ID]
	if n >= maxSecretFailures {
		delete(d.secretFails, j.ID)
	}
	d.mu.Unlock()
	if n < maxSecretFailures {
		return result{job: j, release: true, releaseIn: d.cfg.secretRetry}
	}
	d.log.Error("webhook secret cannot be decrypted; delivery failed", zap.Stringer("webhook_id", j.WebhookID),
		zap.Stringer("delivery_id", j.ID), zap.Error(err))
	return result{job: j, started: time.Now(), final: true,
		errMsg: "webhook signing secret cannot be decrypted (was the encryption key changed?)"}
}

// attempt makes one HTTP attempt of j, claimed at claimed. For an event stored with a
// traceparent it is traced (traceAttempt); otherwise nothing of tracing is done.
func (d *Dispatcher) attempt(ctx context.Context, j job, claimed time.Time) result {
	secrets, err := d.secrets(ctx, j)
	if err != nil {
		if errors.Is(err, ErrSecretUnusable) {
			return d.secretUnusable(j, err)
		}
		// Not the receiver's fault: hand the delivery back without using up an attempt.
		d.log.Warn("webhook secret unavailable", zap.Stringer("webhook_id", j.WebhookID), zap.Error(err))
		return result{job: j, release: true, releaseIn: d.cfg.secretRetry}
	}
	r := result{job: j, started: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.URL, bytes.NewReader(j.Payload))
	if err != nil {
		r.errMsg, r.detail = ClassInvalidURL, err.Error()
		return r
	}
	svc, id, ts, sig := Sign(secrets[0], j.EventID, r.started, j.Payload, secrets[1:]...)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", d.cfg.UserAgent)
	req.Header.Set("X-Svc-Signature", svc)
	req.Header["webhook-id"] = []string{id}
	req.Header["webhook-timestamp"] = []string{ts}
	req.Header["webhook-signature"] = []string{sig}
	if j.Traceparent != "" {
		if span := d.traceAttempt(req, j, claimed, r.started); span != nil {
			defer endAttempt(span, &r)
		}
	}

	resp, err := d.client.Do(req)
	if err != nil {
		r.duration = time.Since(r.started)
		r.errMsg, r.detail = classify(err, req.URL.Hostname()), err.Error()
		return r
	}
	if answered := time.Since(r.started); answered >= d.cfg.Timeout {
		// An answer that came only after the timeout is a timeout, whatever its status. net/http
		// returns one: at the deadline it closes the connection, and a TLS connection first sends
		// close_notify, which a receiver's server may take as the client gone and cancel its
		// handler; a handler that then returns (a Go one answers 200 by default) gets its answer
		// out before the socket closes, and the transport hands back that response, which raced
		// the cancellation, instead of the error. That is no evidence the event was processed.
		// (Client.Do sets its deadline after r.started: any response that raced it lands here.)
		resp.Body.Close()
		r.duration = answered
		r.errMsg = ClassTimeout
		r.detail = "HTTP " + resp.Status + " arrived after the " + d.cfg.Timeout.String() + " timeout"
		return r
	}
	r.statusCode = resp.StatusCode
	body, _ := io.ReadAll(io.LimitReader(resp.Body, ResponseBodyLimit))
	r.duration = time.Since(r.started)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // allow connection reuse
	resp.Body.Close()
	r.body = cleanText(body)
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		r.ok = true
	} else {
		r.errMsg = HTTPClass(resp.StatusCode) // (a 3xx too: redirects are not followed)
		r.detail = "HTTP " + resp.Status
		if loc := resp.Header.Get("Location"); loc != "" {
			r.detail += ", Location " + loc
		}
	}
	return r
}

// cleanText makes b storable as Postgres text: valid UTF-8, no NUL.
func cleanText(b []byte) string {
	return strings.ReplaceAll(strings.ToValidUTF8(string(b), "\uFFFD"), "\x00", "")
}

// writeResults records results in batches until d.results is closed. A batch is what has
// arrived by the time the writer is free, topped up for at most resultLinger while it is small:
// every batch costs a statement (mostly its planning), so fewer, larger ones cost less per
// delivery than one per result.
func (d *Dispatcher) writeResults() {
	const maxBatch = 256
	batch := make([]result, 0, maxBatch)
	var linger *time.Timer
	for r := range d.results {
		batch = append(batch[:0], r)
		open := true
		if linger == nil {
			linger = time.NewTimer(resultLinger)
		} else {
			linger.Reset(resultLinger)
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case r, ok := <-d.results:
				if !ok {
					open = false
					break fill
				}
				batch = append(batch, r)
			case <-linger.C:
				break fill
			}
		}
		linger.Stop()
		d.flushSafely(batch)
		if !open {
			return
		}
	}
}

// resultLinger is how long the result writer waits to fill a batch.
const resultLinger = 5 * time.Millisecond

// flushSafely is flush that survives a panic (logged; the batch's leases expire and its
// deliveries are attempted again), so the writer keeps draining results.
func (d *Dispatcher) flushSafely(batch []result) {
	defer func() {
		if v := recover(); v != nil {
			d.log.Error("recording delivery results panicked; their leases will expire", zap.Int("count", len(batch)), zap.Any("panic", v))
		}
	}()
	d.flush(batch)
}

// flush writes a batch, retrying for up to a lease (after which the rows are reclaimed anyway).
func (d *Dispatcher) flush(batch []result) {
	var backs []store.Handback
	var outs []store.Outcome
	var soonest time.Duration = -1
	failing := d.recordHealth(batch)
	for _, r := range batch {
		j := r.job
		if r.release {
			backs = append(backs, store.Handback{ID: j.ID, Claim: j.Claim, After: r.releaseIn})
			if r.releaseIn == 0 {
				soonest = 0
			}
			continue
		}
		o := store.Outcome{Delivery: j, Started: r.started, Duration: r.duration, OK: r.ok, RetryIn: -1}
		if !r.ok && !r.final && j.Attempt <= len(d.cfg.RetryDelays) {
			o.RetryIn = d.cfg.RetryDelays[j.Attempt-1]
		}
		if !r.ok && !r.final && (j.Probe || failing[j.WebhookID]) {
			o.RetryIn = 0 // held with the failing webhook's others (due when it is ok again), never failed for good
		}
		if o.RetryIn >= 0 && (soonest < 0 || o.RetryIn < soonest) {
			soonest = o.RetryIn
		}
		if r.statusCode != 0 {
			o.StatusCode, o.Body = &r.statusCode, &r.body
		}
		if r.errMsg != "" {
			o.Error = &r.errMsg
		}
		outs = append(outs, o)
		if d.cfg.Observer != nil {
			outcome := OutcomeDelivered
			if !r.ok {
				outcome = OutcomeFailed
				if o.RetryIn >= 0 {
					outcome = OutcomeRetrying
				}
			}
			d.cfg.Observer.Attempt(outcome, r.duration)
		}
		if r.ok {
			d.log.Debug("delivered", zap.Stringer("delivery_id", j.ID), zap.Int("attempt", j.Attempt), zap.Int("status", r.statusCode))
		} else {
			d.failures.failed(j, j.Attempt, r.statusCode, r.errMsg, cmp.Or(r.detail, r.errMsg), o.RetryIn < 0)
		}
	}
	deadline := time.Now().Add(d.cfg.Lease)
	backoff := 50 * time.Millisecond
	for retried := false; ; retried = true {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := d.queue.Release(ctx, d.cfg.InstanceID, backs)
		if err == nil {
			backs = nil // written: a retry after a failed record must not repeat them
			var recorded int
			recorded, err = d.queue.Record(ctx, d.cfg.InstanceID, outs)
			if err == nil && recorded < len(outs) {
				d.unrecorded(ctx, outs, len(outs)-recorded, retried)
			}
		}
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			d.log.Error("recording delivery attempts failed; their leases will expire and they will be retried",
				zap.Int("count", len(batch)), zap.Error(err))
			return
		}
		d.log.Warn("recording delivery attempts", zap.Error(err), zap.Duration("retry_in", backoff))
		time.Sleep(backoff)
		backoff = min(2*backoff, 2*time.Second)
	}
	// This instance knows when its own retries fall due; other instances find them by polling.
	if soonest >= 0 {
		time.AfterFunc(soonest, func() { signal(d.wake) })
	}
}

// unrecorded finds out and logs why n of outs were not recorded (store.Queue.Unrecorded).
// Only outcomes whose claim was lost count in lostClaims and make a Warn: a lease that expired
// under a running attempt is a fault of this instance (see Config.Lease); a webhook deleted
// meanwhile, or an outcome already recorded by an earlier try of this write (retried), is not.
// Without an earlier try, an attempt already recorded was recorded by the claim that took the
// delivery over: a lost claim too.
func (d *Dispatcher) unrecorded(ctx context.Context, outs []store.Outcome, n int, retried bool) {
	already, deleted, lost, err := d.queue.Unrecorded(ctx, outs)
	if !retried {
		lost, already = lost+already, 0
	}
	if err != nil {
		d.lostClaims.Add(int64(n))
		d.log.Warn("outcomes not recorded: their claims were lost (lease expired and reclaimed) or their webhooks deleted",
			zap.Int("count", n), zap.NamedError("explaining", err))
		return
	}
	if deleted > 0 || already > 0 {
		d.log.Debug("outcomes not recorded: webhook deleted meanwhile, or already recorded", zap.Int("deleted", deleted),
			zap.Int("already_recorded", already))
	}
	if lost > 0 {
		d.lostClaims.Add(int64(lost))
		d.log.Warn("outcomes of lost claims not recorded: their leases had expired and they were reclaimed", zap.Int("count", lost),
			zap.Duration("lease", d.cfg.Lease), zap.Duration("timeout", d.cfg.Timeout))
	}
}

// listen wakes the loop on every notification, reconnecting with backoff. After every
// (re)connect it wakes the loop once, for notifications that may have been missed.
func (d *Dispatcher) listen(ctx context.Context, dsn string) {
	(&pglisten.Listener{
		DSN:       dsn,
		Channels:  []string{NotifyChannel},
		OnConnect: func() { signal(d.wake) },
		OnNotify:  func(string, string) { signal(d.wake) },
		Logger:    d.log,
	}).Run(ctx)
}
