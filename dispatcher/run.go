package dispatcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/internal/pglisten"
)

// job is one claimed delivery.
type job struct {
	id, eventID, webhookID uuid.UUID
	// attempt is the number of this attempt: the delivery's recorded attempts + 1. Attempts are
	// counted when their outcome is recorded, so a claim that is lost before that (the instance
	// crashed, the lease expired and the delivery was reclaimed) uses up none.
	attempt int
	// claim is the delivery's claim_seq under this claim (0: inserted already claimed by the
	// intake). With locked_by it fences the claim's outcome (see completeSQL).
	claim   int
	url     string
	payload []byte
}

// result is what the completion writer records: a finished attempt, or (release) a claim
// handed back without an attempt.
type result struct {
	job        job
	release    bool
	releaseIn  time.Duration // release: delay before the delivery is due again
	ok         bool
	started    time.Time
	duration   time.Duration
	statusCode int // 0: no response
	errMsg     string
	body       string
	final      bool // no retry, whatever the attempt number
}

// maxSecretFailures is how many times a delivery is handed back because its webhook's secret
// cannot be decrypted (a wrong or rotated encryption key) before it fails for good, with that
// reason in the delivery log, instead of being handed back every few seconds forever.
const maxSecretFailures = 3

// ErrSecretUnusable may be wrapped by a Secrets error that no retry can cure (the secret
// cannot be decrypted).
var ErrSecretUnusable = errors.New("webhook secret cannot be decrypted")

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
	d.running = false // no more reservations; those taken are waited for below
	d.mu.Unlock()

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
	backoff := 0 * time.Millisecond
	for ctx.Err() == nil {
		free, saturated := d.capacity()
		more := false
		if free > 0 {
			limit := min(free, d.cfg.BatchSize)
			jobs, err := d.claim(ctx, limit, saturated)
			d.mu.Lock()
			d.caughtUp = err == nil && len(jobs) < limit
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
			d.start(attemptCtx, jobs)
			more = len(jobs) == limit
		}
		if more {
			if f, _ := d.capacity(); f > 0 {
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
		}
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// capacity returns the free worker slots and the webhooks at their per-webhook cap.
func (d *Dispatcher) capacity() (int, []uuid.UUID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var saturated []uuid.UUID
	for id, n := range d.perHook {
		if n >= d.cfg.PerWebhook {
			saturated = append(saturated, id)
		}
	}
	return d.cfg.Workers - d.active, saturated
}

// claimSQL takes up to $3 due deliveries of active webhooks. Up to $5 of them (retryShare: a
// quarter of the claims' slots) are reserved for due retries and expired leases (in_flight rows
// whose lease has passed: a crashed or stuck instance), oldest due first, so that a sustained
// backlog of first attempts cannot hold them back; the rest go to first attempts (new events
// keep their latency while failing receivers' retries pile up), then to the remaining retries
// and expired leases, each kind oldest due first. Each kind is read in order from its own partial
// index (migration 005: pending with attempts = 0, pending with attempts > 0, in_flight by
// lease), so a claim costs O(limit) whatever the backlog.
//
// A claim does not count an attempt (completeSQL does, when it records the outcome): attempts
// stays the number of attempts made, so a reclaimed lease is attempted under the same number
// as the claim it replaces. It increments claim_seq instead (migration 010), which tells this
// claim from every earlier one of the delivery, including an earlier claim by the same instance
// id.
const claimSQL = `
WITH first AS (
	SELECT d.id, d.next_attempt_at AS due FROM deliveries d
	WHERE d.status = 'pending' AND d.attempts = 0 AND d.next_attempt_at <= now()
	  AND d.webhook_id <> ALL ($4::uuid[])
	  AND EXISTS (SELECT 1 FROM webhooks w WHERE w.id = d.webhook_id AND w.status = 'active')
	ORDER BY d.next_attempt_at LIMIT $3 FOR UPDATE OF d SKIP LOCKED
), retry AS (
	SELECT d.id, d.next_attempt_at AS due FROM deliveries d
	WHERE d.status = 'pending' AND d.attempts > 0 AND d.next_attempt_at <= now()
	  AND d.webhook_id <> ALL ($4::uuid[])
	  AND EXISTS (SELECT 1 FROM webhooks w WHERE w.id = d.webhook_id AND w.status = 'active')
	ORDER BY d.next_attempt_at LIMIT $3 FOR UPDATE OF d SKIP LOCKED
), expired AS (
	SELECT d.id, d.locked_until AS due FROM deliveries d
	WHERE d.status = 'in_flight' AND d.locked_until < now()
	  AND d.webhook_id <> ALL ($4::uuid[])
	  AND EXISTS (SELECT 1 FROM webhooks w WHERE w.id = d.webhook_id AND w.status = 'active')
	ORDER BY d.locked_until LIMIT $3 FOR UPDATE OF d SKIP LOCKED
), late AS (
	SELECT id, due, row_number() OVER (ORDER BY due) <= $5 AS reserved
	FROM (SELECT * FROM retry UNION ALL SELECT * FROM expired) u
), picked AS (
	SELECT id FROM (
		SELECT id, 0 AS pri, due FROM late WHERE reserved
		UNION ALL SELECT id, 1, due FROM first
		UNION ALL SELECT id, 2, due FROM late WHERE NOT reserved
	) u
	ORDER BY pri, due LIMIT $3
)
UPDATE deliveries d
SET status = 'in_flight', claim_seq = d.claim_seq + 1, locked_by = $1,
    locked_until = now() + $2 * interval '1 millisecond', updated_at = now()
FROM events e, webhooks w
WHERE d.id = ANY (ARRAY(SELECT id FROM picked)) AND e.id = d.event_id AND w.id = d.webhook_id
RETURNING d.id, d.event_id, d.webhook_id, d.attempts + 1, d.claim_seq, w.url, e.payload`

// retryShare returns how many of a claim's limit slots are reserved for due retries and expired
// leases: a quarter, with the remainder carried from claim to claim, so that claims smaller than
// four (a saturated worker pool frees slots one at a time) still reserve one slot in four; the
// first claim rounds up. Reserved slots that no retry needs go to first attempts. Called by
// the claiming goroutine only.
func (d *Dispatcher) retryShare(limit int) int {
	d.shareCarry += limit
	n := d.shareCarry / 4
	d.shareCarry %= 4
	return n
}

func (d *Dispatcher) claim(ctx context.Context, limit int, saturated []uuid.UUID) ([]job, error) {
	if saturated == nil {
		saturated = []uuid.UUID{}
	}
	// Planned for each claim (unnamed statement, still one round trip): a connection's cached
	// generic plan, made while the tables were small or unanalysed, kept reading deliveries and
	// events whole (seq scans of the full backlog in bench/events) for the connection's life.
	rows, err := d.pool.Query(ctx, claimSQL, pgx.QueryExecModeCacheDescribe,
		d.cfg.InstanceID, d.cfg.Lease.Milliseconds(), limit, saturated, d.retryShare(limit))
	if err != nil {
		return nil, err
	}
	var jobs []job
	for rows.Next() {
		var j job
		if err := rows.Scan(&j.id, &j.eventID, &j.webhookID, &j.attempt, &j.claim, &j.url, &j.payload); err != nil {
			rows.Close()
			return nil, err
		}
		jobs = append(jobs, j)
	}
	rows.Close()
	return jobs, rows.Err()
}

// start runs the claimed jobs within the per-webhook cap; the others are handed back at once.
func (d *Dispatcher) start(ctx context.Context, jobs []job) {
	for _, j := range jobs {
		d.mu.Lock()
		run := d.perHook[j.webhookID] < d.cfg.PerWebhook && d.active < d.cfg.Workers
		if run {
			d.perHook[j.webhookID]++
			d.active++
		}
		d.mu.Unlock()
		if !run {
			d.results <- result{job: j, release: true}
			continue
		}
		d.attempts.Add(1)
		d.launch(ctx, j)
	}
}

// launch makes the attempt of j in its own goroutine (counted in d.attempts by the caller) and
// hands its result to the writer. A panic in the attempt is logged and the delivery handed back
// for later, instead of taking the process down.
func (d *Dispatcher) launch(ctx context.Context, j job) {
	go func() {
		defer d.attempts.Done()
		r := result{job: j, release: true, releaseIn: d.cfg.secretRetry}
		func() {
			defer func() {
				if v := recover(); v != nil {
					d.log.Error("delivery attempt panicked; delivery handed back", zap.Stringer("delivery_id", j.id), zap.Any("panic", v))
				}
			}()
			r = d.attempt(ctx, j)
		}()
		d.done(j.webhookID)
		d.results <- r
	}()
}

// done frees the slots of a finished attempt.
func (d *Dispatcher) done(webhookID uuid.UUID) {
	d.mu.Lock()
	wasFull := d.active >= d.cfg.Workers || d.perHook[webhookID] >= d.cfg.PerWebhook
	d.active--
	if d.perHook[webhookID]--; d.perHook[webhookID] <= 0 {
		delete(d.perHook, webhookID)
	}
	d.mu.Unlock()
	if wasFull {
		signal(d.slotFree)
	}
}

func (d *Dispatcher) secret(ctx context.Context, id uuid.UUID) (string, error) {
	now := time.Now()
	d.mu.Lock()
	c, ok := d.cache[id]
	d.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.secret, nil
	}
	// Well inside the lease: a lookup that stalls past it would let another instance claim and
	// send the same delivery.
	ctx, cancel := context.WithTimeout(ctx, min(5*time.Second, d.cfg.Lease/4))
	defer cancel()
	s, err := d.secrets(ctx, id)
	if err != nil {
		return "", err
	}
	d.mu.Lock()
	if len(d.cache) > 10000 {
		clear(d.cache)
	}
	d.cache[id] = cachedSecret{secret: s, expires: now.Add(d.secretTTL)}
	d.mu.Unlock()
	return s, nil
}

// secretUnusable hands a delivery whose webhook secret cannot be decrypted back a few times (a
// key being rotated may come right), then fails it for good with the reason in the delivery
// log. It is logged once per delivery, when it fails.
func (d *Dispatcher) secretUnusable(j job, err error) result {
	d.mu.Lock()
	if len(d.secretFails) > 10000 {
		clear(d.secretFails)
	}
	d.secretFails[j.id]++
	n := d.secretFails[j.id]
	if n >= maxSecretFailures {
		delete(d.secretFails, j.id)
	}
	d.mu.Unlock()
	if n < maxSecretFailures {
		return result{job: j, release: true, releaseIn: d.cfg.secretRetry}
	}
	d.log.Error("webhook secret cannot be decrypted; delivery failed", zap.Stringer("webhook_id", j.webhookID),
		zap.Stringer("delivery_id", j.id), zap.Error(err))
	return result{job: j, started: time.Now(), final: true,
		errMsg: "webhook signing secret cannot be decrypted (was the encryption key changed?)"}
}

// attempt makes one HTTP attempt.
func (d *Dispatcher) attempt(ctx context.Context, j job) result {
	secret, err := d.secret(ctx, j.webhookID)
	if err != nil {
		if errors.Is(err, ErrSecretUnusable) {
			return d.secretUnusable(j, err)
		}
		// Not the receiver's fault: hand the delivery back without using up an attempt.
		d.log.Warn("webhook secret unavailable", zap.Stringer("webhook_id", j.webhookID), zap.Error(err))
		return result{job: j, release: true, releaseIn: d.cfg.secretRetry}
	}
	r := result{job: j, started: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.url, bytes.NewReader(j.payload))
	if err != nil {
		r.errMsg = "invalid webhook url: " + err.Error()
		return r
	}
	svc, id, ts, sig := Sign(secret, j.eventID, r.started, j.payload)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", d.cfg.UserAgent)
	req.Header.Set("X-Svc-Signature", svc)
	req.Header["webhook-id"] = []string{id}
	req.Header["webhook-timestamp"] = []string{ts}
	req.Header["webhook-signature"] = []string{sig}

	resp, err := d.client.Do(req)
	if err != nil {
		r.duration = time.Since(r.started)
		r.errMsg = describe(err, d.cfg.Timeout)
		return r
	}
	r.statusCode = resp.StatusCode
	body, _ := io.ReadAll(io.LimitReader(resp.Body, ResponseBodyLimit))
	r.duration = time.Since(r.started)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // allow connection reuse
	resp.Body.Close()
	r.body = cleanText(body)
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		r.ok = true
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		r.errMsg = fmt.Sprintf("redirect (HTTP %d) not followed", resp.StatusCode)
	default:
		r.errMsg = fmt.Sprintf("HTTP %d", resp.StatusCode)
	}
	return r
}

// describe turns a client error into a short message for the delivery log.
func describe(err error, timeout time.Duration) string {
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		return "timeout: no response within " + timeout.String()
	}
	msg := err.Error()
	// *url.Error repeats the method and URL; keep the cause.
	if i := strings.Index(msg, "\": "); i >= 0 && strings.HasPrefix(msg, "Post \"") {
		msg = msg[i+3:]
	}
	return msg
}

// cleanText makes b storable as Postgres text: valid UTF-8, no NUL.
func cleanText(b []byte) string {
	return strings.ReplaceAll(strings.ToValidUTF8(string(b), "\uFFFD"), "\x00", "")
}

// completeSQL records a batch of attempts (parallel arrays, one element per attempt) and moves
// each delivery on, fenced on its claim: this instance ($12) still holds the delivery under the
// claim that made the attempt (same claim_seq; attempts still one less than the attempt's
// number). Only then is the attempt counted (attempts = its number) and logged in
// delivery_attempts, so that attempts is always the number of attempts recorded and the log
// numbers them 1, 2, … without gap or repeat. The outcome of a claim that was lost (its lease
// expired and the delivery was reclaimed, by another instance or this one) is not recorded: the
// reclaim makes the same attempt again under the same number (at least once).
//
// One statement per batch: a statement per attempt cost more than the rows. locked_by is set
// exactly while a delivery is in_flight (every change out of in_flight clears it), so the fence
// does not repeat status = 'in_flight': with it, the planner would read the lease index (every
// in_flight row) instead of the primary key. The update joins the batch to the primary key row
// by row (planned per call, so the batch's size is known); an extra "id = ANY(batch)" made it
// compare every row with every batch element instead (200 rows: 13 ms against 5 ms). The attempts
// logged are the update's own rows (a delivery deleted meanwhile, with its webhook, logs none).
//
// The statement commits asynchronously (synchronous_commit off for its own transaction): an
// outcome lost to a database crash leaves the delivery claimed until its lease ends, and it is
// then attempted again, which at-least-once delivery allows. Events and deliveries themselves
// are always committed synchronously.
const completeSQL = `
WITH async AS (SELECT set_config('synchronous_commit', 'off', true)),
r AS (
	SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::int[], $5::timestamptz[], $6::bool[], $7::int[],
	                     $8::text[], $9::text[], $10::bigint[], $11::int[])
	         AS r(attempt_id, delivery_id, attempt, claim, started_at, ok, status_code, error, body, retry_in, duration_ms)
), upd AS (
	UPDATE deliveries d SET
		status = CASE WHEN r.ok THEN 'delivered' WHEN r.retry_in >= 0 THEN 'pending' ELSE 'failed' END,
		attempts = r.attempt,
		next_attempt_at = CASE WHEN NOT r.ok AND r.retry_in >= 0 THEN now() + r.retry_in * interval '1 millisecond' ELSE d.next_attempt_at END,
		last_status_code = r.status_code, last_error = r.error, locked_by = NULL, locked_until = NULL, updated_at = now()
	FROM r
	WHERE d.id = r.delivery_id AND d.locked_by = $12 AND d.claim_seq = r.claim AND d.attempts = r.attempt - 1
	RETURNING r.attempt_id
)
INSERT INTO delivery_attempts (id, delivery_id, attempt, started_at, duration_ms, status_code, error, response_body)
SELECT r.attempt_id, r.delivery_id, r.attempt, r.started_at, r.duration_ms, r.status_code, r.error, r.body
FROM r CROSS JOIN async WHERE r.attempt_id IN (SELECT attempt_id FROM upd)
ON CONFLICT (id) DO NOTHING`

// completions collects the arguments of completeSQL.
type completions struct {
	attemptIDs, deliveryIDs []uuid.UUID
	attempts, claims        []int
	started                 []time.Time
	ok                      []bool
	codes                   []*int
	errs, bodies            []*string
	retryIn                 []int64
	durations               []int64
}

func (c *completions) add(attemptID uuid.UUID, j job, started time.Time, ok bool,
	code *int, errMsg, body *string, retryIn int64, duration time.Duration) {
	c.attemptIDs, c.deliveryIDs = append(c.attemptIDs, attemptID), append(c.deliveryIDs, j.id)
	c.attempts, c.claims = append(c.attempts, j.attempt), append(c.claims, j.claim)
	c.started, c.ok = append(c.started, started), append(c.ok, ok)
	c.codes, c.errs, c.bodies = append(c.codes, code), append(c.errs, errMsg), append(c.bodies, body)
	c.retryIn, c.durations = append(c.retryIn, retryIn), append(c.durations, duration.Milliseconds())
}

// args returns the arguments of completeSQL for instance.
func (c *completions) args(instance string) []any {
	return []any{c.attemptIDs, c.deliveryIDs, c.attempts, c.claims, c.started, c.ok, c.codes, c.errs, c.bodies,
		c.retryIn, c.durations, instance}
}

// releaseSQL hands back a claim without an attempt (attempts is unchanged: none was made), fenced
// like completeSQL.
const releaseSQL = `
UPDATE deliveries SET status = 'pending', locked_by = NULL, locked_until = NULL,
	next_attempt_at = CASE WHEN $4::bigint > 0 THEN GREATEST(next_attempt_at, now() + $4::bigint * interval '1 millisecond')
		ELSE next_attempt_at END, updated_at = now()
WHERE id = $1 AND locked_by = $2 AND claim_seq = $3 AND status = 'in_flight'`

// writeResults records results in batches until d.results is closed.
func (d *Dispatcher) writeResults() {
	const maxBatch = 256
	batch := make([]result, 0, maxBatch)
	for r := range d.results {
		batch = append(batch[:0], r)
	fill:
		for len(batch) < maxBatch {
			select {
			case r, ok := <-d.results:
				if !ok {
					break fill
				}
				batch = append(batch, r)
			default:
				break fill
			}
		}
		d.flushSafely(batch)
	}
}

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
	b := &pgx.Batch{}
	var done completions
	var soonest time.Duration = -1
	for _, r := range batch {
		j := r.job
		if r.release {
			b.Queue(releaseSQL, j.id, d.cfg.InstanceID, j.claim, r.releaseIn.Milliseconds())
			if r.releaseIn == 0 {
				soonest = 0
			}
			continue
		}
		retryIn := int64(-1)
		if !r.ok && !r.final && j.attempt <= len(d.cfg.RetryDelays) {
			delay := d.cfg.RetryDelays[j.attempt-1]
			retryIn = delay.Milliseconds()
			if soonest < 0 || delay < soonest {
				soonest = delay
			}
		}
		var code *int
		if r.statusCode != 0 {
			code = &r.statusCode
		}
		var errMsg, body *string
		if r.errMsg != "" {
			errMsg = &r.errMsg
		}
		if r.statusCode != 0 {
			body = &r.body
		}
		attemptID, _ := uuid.NewV7()
		done.add(attemptID, j, r.started, r.ok, code, errMsg, body, retryIn, r.duration)
		if d.cfg.Observer != nil {
			outcome := OutcomeDelivered
			if !r.ok {
				outcome = OutcomeFailed
				if retryIn >= 0 {
					outcome = OutcomeRetrying
				}
			}
			d.cfg.Observer.Attempt(outcome, r.duration)
		}
		if r.ok {
			d.log.Debug("delivered", zap.Stringer("delivery_id", j.id), zap.Int("attempt", j.attempt), zap.Int("status", r.statusCode))
		} else {
			d.log.Info("delivery attempt failed", zap.Stringer("delivery_id", j.id), zap.Stringer("webhook_id", j.webhookID),
				zap.Int("attempt", j.attempt), zap.Int("status", r.statusCode), zap.String("error", r.errMsg), zap.Bool("final", retryIn < 0))
		}
	}
	deadline := time.Now().Add(d.cfg.Lease)
	backoff := 50 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		recorded, err := d.record(ctx, b, &done)
		cancel()
		if err == nil {
			if lost := len(done.deliveryIDs) - recorded; lost > 0 {
				// (or, after a retried write, already recorded by the try that failed)
				d.log.Warn("outcomes of lost claims not recorded: their leases had expired and they were reclaimed, "+
					"or the deliveries were deleted", zap.Int("count", lost))
			}
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

// record writes the releases in b and the completions in done, and returns how many of the
// completions were recorded (the others' claims were lost).
func (d *Dispatcher) record(ctx context.Context, b *pgx.Batch, done *completions) (int, error) {
	if b.Len() > 0 {
		if err := d.pool.SendBatch(ctx, b).Close(); err != nil {
			return 0, err
		}
		b.QueuedQueries = nil // written: a retry after a failed completion must not repeat them
	}
	if len(done.deliveryIDs) == 0 {
		return 0, nil
	}
	// Planned for each batch (unnamed statement, one round trip): a cached generic plan made
	// while the table was small or unanalysed keeps reading the whole table.
	tag, err := d.pool.Exec(ctx, completeSQL, append([]any{pgx.QueryExecModeCacheDescribe}, done.args(d.cfg.InstanceID)...)...)
	return int(tag.RowsAffected()), err
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
