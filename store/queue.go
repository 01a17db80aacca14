package store

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/internal/clock"
)

// Queue is the delivery queue (table delivery_queue, migration 011): the live deliveries —
// pending, in flight or held for a paused webhook — with their schedule and claims. A
// dispatcher claims from it, records outcomes and hands claims back through it; the delivery
// log (table deliveries) and the attempt log follow in the same statements. Every statement on
// the deliveries tables lives in this package.
type Queue struct {
	pool  *pgxpool.Pool
	clock clock.Clock
}

// NewQueue returns the queue in pool's database, deciding by the real time.
func NewQueue(pool *pgxpool.Pool) *Queue { return &Queue{pool: pool} }

// WithClock returns the queue deciding by c instead (nil: the real time, the database's own in
// the statements; see package clock): when deliveries, retries and probes fall due and leases
// end.
func (q *Queue) WithClock(c clock.Clock) *Queue { return &Queue{pool: q.pool, clock: c} }

// nowArg returns the queue's time as a statement's now argument (nil: the database's now()).
func (q *Queue) nowArg() *time.Time { return clock.Param(q.clock) }

// QueueClaim asks Claim for due deliveries.
type QueueClaim struct {
	// Instance is written to locked_by: the claim's owner.
	Instance string
	// Lease is how long the claim holds the deliveries.
	Lease time.Duration
	// Limit is the most deliveries taken.
	Limit int
	// PerWebhook caps the attempts in flight per webhook on this instance; Busy holds the
	// instance's current counts. A webhook at its cap is not claimed for.
	PerWebhook int
	Busy       map[uuid.UUID]int
	// PerOrg caps the attempts in flight per org (all its webhooks) on this instance; BusyOrgs
	// holds the instance's current counts by org id. An org at its cap is not claimed for.
	// 0: no cap.
	PerOrg   int
	BusyOrgs map[uuid.UUID]int
	// After holds the round-robin cursor of each org (org id → webhook id): the org's webhooks
	// after it are served first, then the others (Claim returns the next cursors). An org
	// missing from it starts from its first webhook.
	After map[uuid.UUID]uuid.UUID
}

// claimSQL takes up to $3 deliveries due at $12 (NULL: the database's now(); see package clock) for
// this instance ($1, lease $2 ms from $12), fairly across orgs first, then across each org's
// webhooks. It walks the webhooks that have pending rows (a skip scan of delivery_queue_due: one
// index probe per webhook, however long its backlog; held rows of paused webhooks are not in that
// index at all) and keeps the active ones with something due whose webhook is under this instance's
// per-webhook cap ($6, counts in $4/$5) and whose org is under its per-org cap ($9, counts in
// $7/$8). Each org with such webhooks gets an equal share of the claim (at most its free slots),
// however many webhooks it has: an org cannot buy a larger share of the workers by creating
// webhooks. An org's share is split across its webhooks in round-robin order after the org's cursor
// ($10/$11), an equal part each (at most its free slots; a webhook with fewer free slots leaves the
// rest of the org's share to the others), taken oldest due first (retries and first attempts alike:
// a retry waits only for what fell due before it). Expired leases (a crashed or stuck instance:
// ended before $12) come first, up to a quarter of the claim. Every row read is a row taken or one
// probe per webhook: a claim never scans another webhook's backlog. The webhooks are read by
// primary key (their org and status), once per webhook with pending rows.
//
// A row of an ordered webhook (one with a conversation) is due only when claimableSQL allows:
// the first of its conversation, none of which is in flight. At most one row per conversation
// is then taken by a claim; rows with no conversation pay one IS NULL test.
// A failing webhook's deliveries (webhooks.failing_since set, migration 017) are not claimed
// here, expired leases included: its one probe at a time is ClaimProbes's (store/health.go).
//
// A claim does not count an attempt (Record does, when it records the outcome); it increments
// claim_seq, which fences the claim's outcome.
const claimSQL = `
WITH RECURSIVE hooks(id) AS (
	(SELECT webhook_id FROM delivery_queue WHERE status = 'pending' ORDER BY webhook_id LIMIT 1)
	UNION ALL
	SELECT (SELECT q.webhook_id FROM delivery_queue q WHERE q.status = 'pending' AND q.webhook_id > h.id ORDER BY q.webhook_id LIMIT 1)
	FROM hooks h WHERE h.id IS NOT NULL
), busy AS (
	SELECT * FROM unnest($4::uuid[], $5::int[]) AS b(id, n)
), obusy AS (
	SELECT * FROM unnest($7::uuid[], $8::int[]) AS b(org, n)
), cursors AS (
	SELECT * FROM unnest($10::uuid[], $11::uuid[]) AS c(org, after)
), cand AS (
	SELECT h.id, w.org_id AS org, $6 - coalesce(b.n, 0) AS free, $9 - coalesce(ob.n, 0) AS ofree,
	       row_number() OVER (PARTITION BY w.org_id ORDER BY h.id <= c.after IS TRUE, h.id) AS turn
	FROM hooks h
	JOIN webhooks w ON w.id = h.id AND w.status = 'active'
	                AND w.failing_since IS NULL -- failing: only its probe goes out (ClaimProbes, store/health.go)
	LEFT JOIN busy b ON b.id = h.id
	LEFT JOIN obusy ob ON ob.org = w.org_id
	LEFT JOIN cursors c ON c.org = w.org_id
	WHERE h.id IS NOT NULL AND coalesce(b.n, 0) < $6 AND coalesce(ob.n, 0) < $9
	  AND EXISTS (SELECT 1 FROM delivery_queue q WHERE q.webhook_id = h.id AND q.status = 'pending' AND q.next_attempt_at <= coalesce($12::timestamptz, now())
	              AND ` + claimableSQL + `)
), orgs AS (
	SELECT org, count(*) AS hooks, least(min(ofree), sum(free)) AS room FROM cand GROUP BY org
), oshare AS (
	SELECT org, hooks, ceil($3::numeric / (SELECT count(*) FROM orgs))::int AS fair, room FROM orgs
), due AS (
	SELECT c.id, c.org, c.turn, least(o.room, o.fair)::int AS org_n,
	       least(c.free, o.room, ceil(o.fair::numeric / least(o.hooks, o.fair)))::int AS n
	FROM cand c JOIN oshare o ON o.org = c.org
	WHERE c.turn <= least(o.room, o.fair)
), expired AS (
	SELECT d.delivery_id, 0::bigint AS turn FROM delivery_queue d
	WHERE d.status = 'in_flight' AND d.locked_until < coalesce($12::timestamptz, now())
	  AND EXISTS (SELECT 1 FROM webhooks w WHERE w.id = d.webhook_id AND w.status = 'active'
	              AND w.failing_since IS NULL -- failing: ClaimProbes reclaims it as the probe
	              AND NOT EXISTS (SELECT 1 FROM obusy ob WHERE ob.org = w.org_id AND ob.n >= $9))
	  AND NOT EXISTS (SELECT 1 FROM busy b WHERE b.id = d.webhook_id AND b.n >= $6)
	ORDER BY d.locked_until LIMIT greatest($3 / 4, 1) FOR UPDATE OF d SKIP LOCKED
), picked AS (
	SELECT x.delivery_id, s.org, s.turn, s.org_n, s.n, x.next_attempt_at FROM due s CROSS JOIN LATERAL (
		SELECT q.delivery_id, q.next_attempt_at FROM delivery_queue q
		WHERE q.webhook_id = s.id AND q.status = 'pending' AND q.next_attempt_at <= coalesce($12::timestamptz, now()) AND ` + claimableSQL + `
		ORDER BY q.next_attempt_at LIMIT s.n FOR UPDATE SKIP LOCKED) x
), ranked AS (
	SELECT p.*, row_number() OVER (PARTITION BY p.org ORDER BY p.turn, p.next_attempt_at) AS k FROM picked p
), chosen AS (
	SELECT delivery_id, turn, NULL::int AS hook_n, NULL::int AS org_n, 0::bigint AS k FROM expired
	UNION ALL
	(SELECT delivery_id, turn, n, org_n, k FROM ranked WHERE k <= org_n
	 ORDER BY k, random() LIMIT greatest($3 - (SELECT count(*) FROM expired), 0))
)
UPDATE delivery_queue d
SET status = 'in_flight', claim_seq = d.claim_seq + 1, locked_by = $1,
	locked_until = coalesce($12::timestamptz, now()) + $2 * interval '1 millisecond'
FROM chosen c, webhooks w
WHERE d.delivery_id = c.delivery_id AND w.id = d.webhook_id
RETURNING d.delivery_id, d.event_id, d.webhook_id, w.org_id, d.created_at, d.attempts + 1, d.claim_seq, w.url, c.turn,
	coalesce(c.hook_n, 0), coalesce(c.org_n, 0), (SELECT count(*) FROM cand), (SELECT count(*) FROM expired),
	w.previous_secret_expires_at, d.conversation`

// Claimed is what a claim took.
type Claimed struct {
	Deliveries []ClaimedDelivery
	// Next holds the round-robin cursors for the next claim: After with the cursor of every
	// org served moved to the last webhook served.
	Next map[uuid.UUID]uuid.UUID
	// Reclaimed counts the deliveries taken because their lease had expired (a crashed or
	// stuck instance, or this one's attempt outlived its lease).
	Reclaimed int
	// Drained reports that the claim took every delivery that was due and not locked by another
	// claim: each webhook and org it served got less than its share, and no webhook or expired
	// lease was left out for want of room. New deliveries can then go out at once without
	// overtaking older due ones.
	Drained bool
}

// claimArgs returns the arguments of claimSQL for c at now (nil: the database's now()).
func claimArgs(c QueueClaim, now *time.Time) []any {
	busyIDs := make([]uuid.UUID, 0, len(c.Busy))
	busyN := make([]int, 0, len(c.Busy))
	for id, n := range c.Busy {
		busyIDs, busyN = append(busyIDs, id), append(busyN, n)
	}
	orgIDs := make([]uuid.UUID, 0, len(c.BusyOrgs))
	orgN := make([]int, 0, len(c.BusyOrgs))
	for id, n := range c.BusyOrgs {
		orgIDs, orgN = append(orgIDs, id), append(orgN, n)
	}
	curOrgs := make([]uuid.UUID, 0, len(c.After))
	curAfter := make([]uuid.UUID, 0, len(c.After))
	for org, after := range c.After {
		curOrgs, curAfter = append(curOrgs, org), append(curAfter, after)
	}
	perOrg := c.PerOrg
	if perOrg <= 0 {
		perOrg = math.MaxInt32
	}
	return []any{c.Instance, c.Lease.Milliseconds(), c.Limit, busyIDs, busyN, c.PerWebhook, orgIDs, orgN, perOrg, curOrgs, curAfter, now}
}

// Claim takes due deliveries (see claimSQL), with their events' payloads.
func (q *Queue) Claim(ctx context.Context, c QueueClaim) (Claimed, error) {
	// A generic plan under a guard (queryGeneric): planned per claim, the statement spent most
	// of its time in the planner.
	rows, err := queryGeneric(ctx, q.pool, claimSQL, claimArgs(c, q.nowArg())...)
	if err != nil {
		return Claimed{Next: c.After}, fmt.Errorf("claim deliveries: %w", err)
	}
	var out []ClaimedDelivery
	next := make(map[uuid.UUID]uuid.UUID, len(c.After))
	for org, after := range c.After {
		next[org] = after
	}
	last := map[uuid.UUID]int64{}
	var hooks, expired int64
	taken := map[uuid.UUID]int{}    // by webhook (not reclaimed)
	orgTaken := map[uuid.UUID]int{} // by org (not reclaimed)
	share := map[uuid.UUID]int{}    // webhook → its share
	orgShare := map[uuid.UUID]int{} // org → its share
	for rows.Next() {
		var d ClaimedDelivery
		var turn int64
		var hookN, orgN int
		if err := rows.Scan(&d.ID, &d.EventID, &d.WebhookID, &d.OrgID, &d.CreatedAt, &d.Attempt, &d.Claim, &d.URL, &turn,
			&hookN, &orgN, &hooks, &expired, &d.PreviousSecretExpiresAt, &d.Conversation); err != nil {
			rows.Close()
			return Claimed{Next: c.After}, fmt.Errorf("claim deliveries: %w", err)
		}
		if turn > 0 {
			if turn > last[d.OrgID] {
				next[d.OrgID], last[d.OrgID] = d.WebhookID, turn
			}
			taken[d.WebhookID]++
			orgTaken[d.OrgID]++
			share[d.WebhookID], orgShare[d.OrgID] = hookN, orgN
		}
		out = append(out, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Claimed{Next: c.After}, fmt.Errorf("claim deliveries: %w", err)
	}
	drained := len(out) == 0
	if !drained && hooks <= int64(len(taken)) && expired < int64(max(c.Limit/4, 1)) {
		// every webhook with due work was served; each below its share (and each org below its
		// own), or it may have more
		drained = true
		for id, n := range taken {
			if n >= share[id] {
				drained = false
			}
		}
		for org, n := range orgTaken {
			if n >= orgShare[org] {
				drained = false
			}
		}
	}
	if err := q.payloads(ctx, out); err != nil {
		// Hand the claims back rather than let them wait for their lease.
		hs := make([]Handback, len(out))
		for i, d := range out {
			hs[i] = Handback{ID: d.ID, Claim: d.Claim}
		}
		if rerr := q.Release(context.WithoutCancel(ctx), c.Instance, hs); rerr != nil {
			err = fmt.Errorf("%w (and handing the claims back: %v)", err, rerr)
		}
		return Claimed{Next: c.After}, fmt.Errorf("claim deliveries: %w", err)
	}
	return Claimed{Deliveries: out, Next: next, Reclaimed: int(expired), Drained: drained}, nil
}

// byDay groups indexes of items by the UTC day of their creation time: the statements on a
// partitioned table name the day's bounds, so that the planner reads one partition, however
// many days the retention keeps (planning every partition cost more than the statement itself
// at 30 days).
func byDay(n int, created func(i int) time.Time) map[time.Time][]int {
	days := map[time.Time][]int{}
	for i := range n {
		d := day(created(i))
		days[d] = append(days[d], i)
	}
	return days
}

// payloads fills in the claimed deliveries' event payloads and traceparents: one look-up per
// day (almost always one).
func (q *Queue) payloads(ctx context.Context, ds []ClaimedDelivery) error {
	if len(ds) == 0 {
		return nil
	}
	for d, is := range byDay(len(ds), func(i int) time.Time { return ds[i].CreatedAt }) {
		ids := make([]uuid.UUID, len(is))
		index := make(map[uuid.UUID][]int, len(is))
		for k, i := range is {
			ids[k] = ds[i].EventID
			index[ds[i].EventID] = append(index[ds[i].EventID], i)
		}
		rows, err := q.pool.Query(ctx, `SELECT id, payload, coalesce(traceparent, '') FROM events WHERE created_at >= $1 AND created_at < $2 AND id = ANY($3)`,
			pgx.QueryExecModeCacheDescribe, d, d.AddDate(0, 0, 1), ids)
		if err != nil {
			return fmt.Errorf("event payloads: %w", err)
		}
		for rows.Next() {
			var id uuid.UUID
			var payload []byte
			var trace string
			if err := rows.Scan(&id, &payload, &trace); err != nil {
				rows.Close()
				return fmt.Errorf("event payloads: %w", err)
			}
			for _, i := range index[id] {
				ds[i].Payload, ds[i].Traceparent = payload, trace
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("event payloads: %w", err)
		}
	}
	return nil
}

// Outcome is the recorded result of one attempt of a claimed delivery.
type Outcome struct {
	// Delivery is the claimed delivery (ID, CreatedAt, Attempt, Claim are used).
	Delivery ClaimedDelivery
	Started  time.Time
	Duration time.Duration
	OK       bool
	// StatusCode is the receiver's status (nil: no response); Error and Body the log's text.
	StatusCode  *int
	Error, Body *string
	// RetryIn schedules the next attempt after a failure; negative: none (the delivery fails).
	RetryIn time.Duration
}

// recordSQL records a batch of attempts (parallel arrays) fenced on their claims: this
// instance ($12) still holds the delivery under the claim that made the attempt (same
// claim_seq; attempts still one less than the attempt's number). Only then is the attempt
// counted and logged: the queue row is deleted (delivered, or failed for good) or rescheduled
// (held instead of pending if the webhook was paused meanwhile; due retry_in after $16, NULL:
// the database's now(), see package clock), the delivery log row updated
// (a HOT update: no indexed column changes) and the attempt appended. A rescheduled head of an
// ordered conversation keeps its place: the rows behind it are waiting (see claimableSQL), not
// due, so nothing steps over them meanwhile. The outcome of a claim
// that was lost (its lease expired and the delivery was reclaimed) is not recorded: the reclaim
// makes the same attempt again under the same number (at least once).
//
// The statement commits asynchronously (synchronous_commit off for its own transaction): an
// outcome lost to a database crash leaves the delivery claimed until its lease ends, and it is
// then attempted again, which at-least-once delivery allows. Events and deliveries themselves
// are always committed synchronously.
var recordSQL = `
WITH async AS (SELECT set_config('synchronous_commit', 'off', true)),
r AS (
	SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::int[], $4::int[], $5::timestamptz[], $6::bool[], $7::int[],
	                     $8::text[], $9::text[], $10::bigint[], $11::int[], $13::uuid[])
	         AS r(delivery_id, created_at, attempt, claim, started_at, ok, status_code, error, body, retry_in, duration_ms, attempt_id)
), fin AS (
	DELETE FROM delivery_queue q USING r
	WHERE q.delivery_id = r.delivery_id AND q.locked_by = $12 AND q.claim_seq = r.claim AND q.attempts = r.attempt - 1
	  AND (r.ok OR r.retry_in < 0)
	RETURNING q.delivery_id
), again AS (
	UPDATE delivery_queue q SET
		status = ` + heldWhenPausedSQL("q.webhook_id") + `,
		attempts = r.attempt, next_attempt_at = coalesce($16::timestamptz, now()) + r.retry_in * interval '1 millisecond',
		locked_by = NULL, locked_until = NULL
	FROM r
	WHERE q.delivery_id = r.delivery_id AND q.locked_by = $12 AND q.claim_seq = r.claim AND q.attempts = r.attempt - 1
	  AND NOT r.ok AND r.retry_in >= 0
	RETURNING q.delivery_id, q.webhook_id, q.conversation, q.created_at, q.event_id, q.next_attempt_at
), kept AS (
	SELECT r.* FROM r WHERE r.delivery_id IN (SELECT delivery_id FROM fin UNION ALL SELECT delivery_id FROM again)
), log AS (
	UPDATE deliveries d SET
		status = CASE WHEN k.ok THEN 'delivered' WHEN k.retry_in >= 0 THEN 'pending' ELSE 'failed' END,
		attempts = k.attempt, last_status_code = k.status_code, last_error = k.error, updated_at = coalesce($16::timestamptz, now())
	FROM kept k WHERE d.created_at >= $14 AND d.created_at < $15 AND d.id = k.delivery_id AND d.created_at = k.created_at
)
INSERT INTO delivery_attempts (id, delivery_id, attempt, started_at, duration_ms, status_code, error, response_body)
SELECT k.attempt_id, k.delivery_id, k.attempt, k.started_at, k.duration_ms, k.status_code, k.error, k.body
FROM kept k CROSS JOIN async`

// Record records a batch of attempt outcomes of instance's claims and returns how many were
// recorded (the others' claims were lost: see recordSQL). One statement per day the deliveries
// were created on ($14, $15: its bounds, see byDay; almost always one). When the batch ends
// deliveries of ordered conversations, their conversations are locked first and their next
// rows promoted after, in the same transaction (see claimableSQL).
func (q *Queue) Record(ctx context.Context, instance string, outs []Outcome) (int, error) {
	if len(outs) == 0 {
		return 0, nil
	}
	var hooks []uuid.UUID
	var convs []int64
	for _, o := range outs {
		if c := o.Delivery.Conversation; c != nil && (o.OK || o.RetryIn < 0) {
			hooks, convs = append(hooks, o.Delivery.WebhookID), append(convs, *c)
		}
	}
	if len(convs) == 0 {
		return q.record(ctx, q.pool, instance, outs)
	}
	var recorded int
	err := pgx.BeginFunc(ctx, q.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, conversationLockSQL, convs); err != nil {
			return fmt.Errorf("lock conversations: %w", err)
		}
		var err error
		if recorded, err = q.record(ctx, tx, instance, outs); err != nil {
			return err
		}
		return promote(ctx, tx, hooks, convs)
	})
	if err != nil {
		return 0, fmt.Errorf("record delivery attempts: %w", err)
	}
	return recorded, nil
}

// record runs recordSQL on db for outs, one statement per day.
func (q *Queue) record(ctx context.Context, db batchSender, instance string, outs []Outcome) (int, error) {
	recorded := 0
	for d, is := range byDay(len(outs), func(i int) time.Time { return outs[i].Delivery.CreatedAt }) {
		group := make([]Outcome, len(is))
		for k, i := range is {
			group[k] = outs[i]
		}
		tag, err := execGeneric(ctx, db, recordSQL, recordArgs(group, instance, d, q.nowArg())...)
		if err != nil {
			return recorded, fmt.Errorf("record delivery attempts: %w", err)
		}
		recorded += int(tag.RowsAffected())
	}
	return recorded, nil
}

// Unrecorded tells why outcomes that Record did not record were left out: already (the
// delivery log counts their attempt: a retried write whose first try committed, or a reclaim
// that made and recorded the same attempt), deleted (their webhook is gone, and its deliveries
// with it), lost (neither: the claim was lost — its lease expired and the delivery was
// reclaimed — before the outcome came back). Called only when some were left out.
func (q *Queue) Unrecorded(ctx context.Context, outs []Outcome) (already, deleted, lost int, err error) {
	n := len(outs)
	ids, hooks := make([]uuid.UUID, n), make([]uuid.UUID, n)
	created, attempts := make([]time.Time, n), make([]int, n)
	for i, o := range outs {
		ids[i], hooks[i], created[i], attempts[i] = o.Delivery.ID, o.Delivery.WebhookID, o.Delivery.CreatedAt, o.Delivery.Attempt
	}
	err = q.pool.QueryRow(ctx, `
		WITH r AS (
			SELECT r.*,
			       EXISTS (SELECT 1 FROM deliveries d WHERE d.id = r.id AND d.created_at = r.created_at AND d.attempts >= r.attempt) AS recorded,
			       EXISTS (SELECT 1 FROM webhooks w WHERE w.id = r.webhook_id) AS hook
			FROM unnest($1::uuid[], $2::uuid[], $3::timestamptz[], $4::int[]) AS r(id, webhook_id, created_at, attempt)
		)
		SELECT count(*) FILTER (WHERE recorded), count(*) FILTER (WHERE NOT recorded AND NOT hook),
		       count(*) FILTER (WHERE NOT recorded AND hook) FROM r`, ids, hooks, created, attempts).Scan(&already, &deleted, &lost)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("unrecorded delivery attempts: %w", err)
	}
	return already, deleted, lost, nil
}

// recordArgs returns the arguments of recordSQL for outcomes of deliveries created on day,
// recorded at now (nil: the database's now()).
func recordArgs(outs []Outcome, instance string, day time.Time, now *time.Time) []any {
	n := len(outs)
	ids, attemptIDs := make([]uuid.UUID, n), make([]uuid.UUID, n)
	created, started := make([]time.Time, n), make([]time.Time, n)
	attempts, claims, durations := make([]int, n), make([]int, n), make([]int64, n)
	ok := make([]bool, n)
	codes := make([]*int, n)
	errs, bodies := make([]*string, n), make([]*string, n)
	retryIn := make([]int64, n)
	for i, o := range outs {
		ids[i], created[i], attempts[i], claims[i] = o.Delivery.ID, o.Delivery.CreatedAt, o.Delivery.Attempt, o.Delivery.Claim
		attemptIDs[i], _ = uuid.NewV7()
		started[i], durations[i], ok[i] = o.Started, o.Duration.Milliseconds(), o.OK
		codes[i], errs[i], bodies[i] = o.StatusCode, o.Error, o.Body
		retryIn[i] = -1
		if o.RetryIn >= 0 {
			retryIn[i] = o.RetryIn.Milliseconds()
		}
	}
	// Planned for each batch (unnamed statement), like claimSQL.
	return []any{ids, created, attempts, claims, started, ok, codes, errs, bodies, retryIn, durations, instance, attemptIDs,
		day, day.AddDate(0, 0, 1), now}
}

// Handback returns a claim to the queue without an attempt (none was made: attempts is
// unchanged), due again no sooner than After from now (the queue's clock).
type Handback struct {
	ID    uuid.UUID
	Claim int
	After time.Duration
}

// Release hands instance's claims back, fenced like Record.
func (q *Queue) Release(ctx context.Context, instance string, hs []Handback) error {
	if len(hs) == 0 {
		return nil
	}
	ids, claims, after := make([]uuid.UUID, len(hs)), make([]int, len(hs)), make([]int64, len(hs))
	for i, h := range hs {
		ids[i], claims[i], after[i] = h.ID, h.Claim, h.After.Milliseconds()
	}
	_, err := q.pool.Exec(ctx, `
		UPDATE delivery_queue q SET
			status = `+heldWhenPausedSQL("q.webhook_id")+`,
			locked_by = NULL, locked_until = NULL,
			next_attempt_at = CASE WHEN r.after > 0
				THEN greatest(q.next_attempt_at, coalesce($5::timestamptz, now()) + r.after * interval '1 millisecond')
				ELSE q.next_attempt_at END
		FROM unnest($1::uuid[], $2::int[], $3::bigint[]) AS r(delivery_id, claim, after)
		WHERE q.delivery_id = r.delivery_id AND q.locked_by = $4 AND q.claim_seq = r.claim AND q.status = 'in_flight'`,
		ids, claims, after, instance, q.nowArg())
	if err != nil {
		return fmt.Errorf("hand back deliveries: %w", err)
	}
	return nil
}

// Depth returns the deliveries due now for active webhooks (pending and due, or in flight with
// an expired lease) and the age of the oldest one in seconds.
func (q *Queue) Depth(ctx context.Context) (n int64, oldest float64, err error) {
	err = q.pool.QueryRow(ctx, `
		SELECT count(*), COALESCE(EXTRACT(EPOCH FROM coalesce($1::timestamptz, now()) - min(CASE WHEN d.status = 'pending' THEN d.next_attempt_at ELSE d.locked_until END)), 0)::float8
		FROM delivery_queue d JOIN webhooks w ON w.id = d.webhook_id
		WHERE w.status = 'active' AND ((d.status = 'pending' AND d.next_attempt_at <= coalesce($1::timestamptz, now()))
		   OR (d.status = 'in_flight' AND d.locked_until < coalesce($1::timestamptz, now())))`, q.nowArg()).Scan(&n, &oldest)
	if err != nil {
		return 0, 0, fmt.Errorf("queue depth: %w", err)
	}
	return n, oldest, nil
}

// FailHeld fails the held deliveries (of paused webhooks) created before cutoff, with reason in
// the delivery log, and returns how many: a webhook paused for good cannot grow the queue and
// keep its days' partitions forever. The waiting deliveries of paused webhooks created before
// cutoff fail with them (their conversations' heads are held or gone), and the first waiting
// row left of each conversation that lost its live rows is promoted (held: its webhook is
// paused), under the conversations' locks (see claimableSQL). The delivery log shows them failed
// at the store's clock's time.
func (s *Store) FailHeld(ctx context.Context, cutoff time.Time, reason string) (int, error) {
	var n int
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
			SELECT count(pg_advisory_xact_lock(k)) FROM (
				SELECT DISTINCT q.conversation AS k FROM delivery_queue q
				WHERE q.status = 'held' AND q.created_at < $1 AND q.conversation IS NOT NULL ORDER BY 1) x`, cutoff); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
			WITH f AS (
				DELETE FROM delivery_queue q
				WHERE q.created_at < $1 AND (q.status = 'held' OR (q.status = 'waiting'
				      AND q.webhook_id IN (SELECT w.id FROM webhooks w WHERE w.status = 'paused')))
				RETURNING q.delivery_id, q.created_at, q.webhook_id, q.conversation
			), log AS (
				UPDATE deliveries d SET status = 'failed', last_error = $2, updated_at = coalesce($3::timestamptz, now())
				FROM f WHERE d.id = f.delivery_id AND d.created_at = f.created_at
			)
			SELECT f.webhook_id, f.conversation, count(*) FROM f GROUP BY 1, 2`, cutoff, reason, s.nowArg())
		if err != nil {
			return err
		}
		hooks, convs, k, err := conversations(rows)
		if err != nil {
			return err
		}
		n = k
		return promote(ctx, tx, hooks, convs)
	})
	if err != nil {
		return 0, fmt.Errorf("fail held deliveries: %w", err)
	}
	return n, nil
}

// HoldPausedPending holds the pending queue rows of paused webhooks and returns how many: a
// retry, hand-back or new delivery written while its webhook was being paused (its writer read
// the webhook active, so it took no lock, and committed after the pause had held the rows), which
// claims skip but which would otherwise wait outside max_hold until a resume. The paused
// webhooks' rows are locked FOR KEY SHARE, as heldWhenPausedSQL does: a resume in progress is
// waited for, and a webhook it made active is left alone, so nothing is held on an active webhook.
// The maintenance runs it (each paused webhook's pending rows through delivery_queue_due).
func (s *Store) HoldPausedPending(ctx context.Context) (int, error) {
	tag, err := s.pool.Exec(ctx, `
		WITH p AS (SELECT w.id FROM webhooks w WHERE w.status = 'paused' ORDER BY w.id FOR KEY SHARE)
		UPDATE delivery_queue q SET status = 'held' FROM p WHERE q.webhook_id = p.id AND q.status = 'pending'`)
	if err != nil {
		return 0, fmt.Errorf("hold pending deliveries of paused webhooks: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// DropOrphanedQueue deletes queue rows whose webhook no longer exists (an inbound post that raced the
// webhook's deletion) and returns how many. Their log rows go with their day's partition.
func (s *Store) DropOrphanedQueue(ctx context.Context) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM delivery_queue q WHERE NOT EXISTS (SELECT 1 FROM webhooks w WHERE w.id = q.webhook_id)
		AND NOT EXISTS (SELECT 1 FROM deleted_webhooks x WHERE x.id = q.webhook_id)`) // (those: SweepDeletedWebhooks, in batches)
	if err != nil {
		return 0, fmt.Errorf("drop orphaned queue rows: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// notifyDeliveries announces due deliveries to the dispatchers.
func notifyDeliveries(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}) error {
	_, err := db.Exec(ctx, `SELECT pg_notify($1, '')`, DeliveriesNotifyChannel)
	return err
}

// heldWhenPausedSQL is the SQL expression of the status of a queue row of webhook (an SQL
// expression) that goes back to waiting its turn: 'held' while the webhook is paused, else
// 'pending'. A paused webhook's row is locked FOR KEY SHARE, which waits for a SetWebhookStatus
// in progress (it locks the row FOR UPDATE first) and then reads the status it committed: a row
// written while its webhook is being resumed is never left held on an active webhook, where
// nothing would release it. An active webhook's row is not locked (the hot path pays nothing);
// a row written while its webhook is being paused may stay pending, which claims skip until the
// resume, or until the maintenance holds it (HoldPausedPending).
func heldWhenPausedSQL(webhook string) string {
	return `CASE WHEN EXISTS (SELECT 1 FROM webhooks w WHERE w.id = ` + webhook + ` AND w.status = 'paused' FOR KEY SHARE) THEN 'held' ELSE 'pending' END`
}
