package store

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Webhook health values (WebhookHealth.State) and the reason of an automatic pause.
const (
	HealthOK      = "ok"
	HealthFailing = "failing"

	PausedFailing = "failing"
)

// WebhookHealth is the health of a webhook's receiver (migration 017): the failed attempts in
// a row across its deliveries and, while it is failing, since when and its probe schedule.
type WebhookHealth struct {
	ConsecutiveFailures int
	// FailingSince is nil while the receiver is ok.
	FailingSince *time.Time
	// NextProbeAt is when the next probe may go out (failing only; a probe in flight pushes it
	// a lease ahead until its outcome is recorded).
	NextProbeAt *time.Time
	// ProbeInterval is the current gap between probes (failing only).
	ProbeInterval time.Duration
}

// State returns HealthOK or HealthFailing.
func (h WebhookHealth) State() string {
	if h.FailingSince != nil {
		return HealthFailing
	}
	return HealthOK
}

// healthColumns are the health columns of a webhook row, read with webhookColumns (in this
// order: see scanHealth).
const healthColumns = `w.consecutive_failures, w.failing_since, w.next_probe_at, w.probe_interval_ms, w.paused_reason`

// healthDest returns the scan destinations of healthColumns for w.
func healthDest(w *Webhook, intervalMS **int64) []any {
	return []any{&w.Health.ConsecutiveFailures, &w.Health.FailingSince, &w.Health.NextProbeAt, intervalMS, &w.PausedReason}
}

// HealthPolicy is when a webhook becomes failing, how it is probed and when it is paused.
// The dispatcher fills it in (dispatcher.Config holds the defaults).
type HealthPolicy struct {
	// Threshold is the number of consecutive failed attempts that makes a webhook failing.
	Threshold int
	// ProbeInterval is the first gap between probes; each failed probe doubles it, up to
	// ProbeIntervalMax.
	ProbeInterval, ProbeIntervalMax time.Duration
	// DisableAfter is how long a webhook may stay failing before it is paused (paused_reason
	// "failing").
	DisableAfter time.Duration
}

// HealthOutcome sums up, for one webhook, the attempts of a batch of outcomes, in the order
// they finished.
type HealthOutcome struct {
	WebhookID uuid.UUID
	// Delivered: an attempt got a 2xx (a failing webhook is ok again).
	Delivered bool
	// Failures counts the failed attempts after the last 2xx (all of them when !Delivered).
	Failures int
	// ProbeFailed: a probe failed (the probe interval doubles).
	ProbeFailed bool
}

// Health changes reported by RecordHealth.
const (
	HealthBecameFailing = "failing"
	HealthRecovered     = "recovered"
	HealthPaused        = "paused"
)

// HealthState is a webhook's health after RecordHealth, for each webhook whose row it changed.
type HealthState struct {
	WebhookID, OrgID uuid.UUID
	// Changes holds the changes this batch made, in order (recovered, failing, paused); often none.
	Changes []string
	// Failing is the webhook's state after the batch (paused ones included).
	Failing             bool
	ConsecutiveFailures int
	FailingSince        *time.Time
	NextProbeAt         *time.Time
	ProbeInterval       time.Duration
}

// recordHealthSQL applies a batch of per-webhook sums (parallel arrays $1..$4) to the webhooks'
// health with the policy in $5..$8 (threshold, first and longest probe interval in ms,
// disable_after in ms), at $9 (NULL: the database's now(); see package clock). Only rows that
// change are locked and written: a batch of successes for healthy webhooks reads one index entry
// per webhook and writes nothing. The locking CTE reads each row's latest version (another instance
// may have just written it), and the update is computed from it: a 2xx resets the count and ends
// failing (with its probe schedule); at the threshold an active webhook becomes failing, its first
// probe one interval ahead; a failed probe doubles the interval (up to the longest) and schedules
// the next one; a webhook still failing disable_after after it began is paused (paused_reason
// 'failing'), its pending deliveries held as on any pause.
const recordHealthSQL = `
WITH r AS (
	SELECT * FROM unnest($1::uuid[], $2::bool[], $3::int[], $4::bool[]) AS r(webhook_id, delivered, fails, probe_failed)
), o AS (
	SELECT w.id, w.org_id, w.status, w.consecutive_failures AS cf, w.failing_since, w.next_probe_at, w.probe_interval_ms,
	       r.delivered, r.fails, r.probe_failed
	FROM webhooks w JOIN r ON r.webhook_id = w.id
	WHERE r.fails > 0 OR w.consecutive_failures > 0 OR w.failing_since IS NOT NULL
	ORDER BY w.id
	FOR NO KEY UPDATE OF w
), s AS (
	SELECT o.*, CASE WHEN o.delivered THEN o.fails ELSE o.cf + o.fails END AS new_cf,
	       o.failing_since IS NOT NULL AND NOT o.delivered AS still,
	       o.failing_since IS NOT NULL AND o.delivered AS recovered
	FROM o
), t AS (
	SELECT s.*,
	       NOT s.still AND s.new_cf >= $5 AND s.status = 'active' AS became,
	       s.still AND s.status = 'active' AND s.failing_since <= coalesce($9::timestamptz, now()) - $8 * interval '1 millisecond' AS pause
	FROM s
), u AS (
	SELECT t.*,
	       CASE WHEN t.still THEN t.failing_since WHEN t.became THEN coalesce($9::timestamptz, now()) END AS new_since,
	       CASE WHEN t.became THEN $6::bigint
	            WHEN t.still AND t.probe_failed THEN least(coalesce(t.probe_interval_ms, $6) * 2, $7::bigint)
	            WHEN t.still THEN coalesce(t.probe_interval_ms, $6::bigint) END AS new_interval
	FROM t
), hold AS (
	UPDATE delivery_queue q SET status = 'held' FROM u WHERE u.pause AND q.webhook_id = u.id AND q.status = 'pending'
)
UPDATE webhooks w SET
	consecutive_failures = u.new_cf,
	failing_since = u.new_since,
	probe_interval_ms = u.new_interval,
	next_probe_at = CASE WHEN u.became OR (u.still AND u.probe_failed) THEN coalesce($9::timestamptz, now()) + u.new_interval * interval '1 millisecond'
	                     WHEN u.still THEN u.next_probe_at END,
	status = CASE WHEN u.pause THEN 'paused' ELSE w.status END,
	paused_reason = CASE WHEN u.pause THEN 'failing' ELSE w.paused_reason END,
	updated_at = CASE WHEN u.pause THEN coalesce($9::timestamptz, now()) ELSE w.updated_at END
FROM u WHERE w.id = u.id
RETURNING w.id, w.org_id, u.recovered, u.became, u.pause, w.consecutive_failures, w.failing_since, w.next_probe_at, w.probe_interval_ms`

// RecordHealth applies the health sums of a batch of attempt outcomes (see recordHealthSQL)
// and returns the state of every webhook whose health row changed.
func (q *Queue) RecordHealth(ctx context.Context, pol HealthPolicy, outs []HealthOutcome) ([]HealthState, error) {
	if len(outs) == 0 {
		return nil, nil
	}
	n := len(outs)
	ids, delivered, fails, probeFailed := make([]uuid.UUID, n), make([]bool, n), make([]int, n), make([]bool, n)
	for i, o := range outs {
		ids[i], delivered[i], fails[i], probeFailed[i] = o.WebhookID, o.Delivered, o.Failures, o.ProbeFailed
	}
	rows, err := queryGeneric(ctx, q.pool, recordHealthSQL, ids, delivered, fails, probeFailed,
		pol.Threshold, pol.ProbeInterval.Milliseconds(), pol.ProbeIntervalMax.Milliseconds(), pol.DisableAfter.Milliseconds(), q.nowArg())
	if err != nil {
		return nil, fmt.Errorf("record webhook health: %w", err)
	}
	defer rows.Close()
	var out []HealthState
	for rows.Next() {
		var s HealthState
		var recovered, became, paused bool
		var interval *int64
		if err := rows.Scan(&s.WebhookID, &s.OrgID, &recovered, &became, &paused, &s.ConsecutiveFailures, &s.FailingSince,
			&s.NextProbeAt, &interval); err != nil {
			return nil, fmt.Errorf("record webhook health: %w", err)
		}
		for _, c := range []struct {
			on   bool
			name string
		}{{recovered, HealthRecovered}, {became, HealthBecameFailing}, {paused, HealthPaused}} {
			if c.on {
				s.Changes = append(s.Changes, c.name)
			}
		}
		s.Failing = s.FailingSince != nil
		if interval != nil {
			s.ProbeInterval = time.Duration(*interval) * time.Millisecond
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("record webhook health: %w", err)
	}
	return out, nil
}

// claimProbesSQL takes the probes of up to $3 failing active webhooks whose next probe is due
// at $4 (NULL: the database's now(); see package clock):
// for each, one delivery — one whose lease expired (its instance died mid-probe), else the
// oldest due pending one that the ordering rule lets out (claimableSQL: for an ordered webhook,
// the first of its conversation) — claimed like Claim's ($1 instance, $2 lease in ms). The webhook's
// next_probe_at moves a lease ahead, so that no other claim probes it meanwhile; the probe's
// outcome (RecordHealth) sets the real next one. A failing webhook with nothing due is left
// as it is.
const claimProbesSQL = `
WITH h AS (
	SELECT w.id FROM webhooks w
	WHERE w.failing_since IS NOT NULL AND w.next_probe_at <= coalesce($4::timestamptz, now()) AND w.status = 'active'
	ORDER BY w.next_probe_at LIMIT $3
	FOR NO KEY UPDATE SKIP LOCKED
), p AS (
	SELECT * FROM (SELECT h.id AS webhook_id, coalesce(
		(SELECT d.delivery_id FROM delivery_queue d
		 WHERE d.status = 'in_flight' AND d.locked_until < coalesce($4::timestamptz, now()) AND d.webhook_id = h.id LIMIT 1 FOR UPDATE SKIP LOCKED),
		(SELECT q.delivery_id FROM delivery_queue q
		 WHERE q.webhook_id = h.id AND q.status = 'pending' AND q.next_attempt_at <= coalesce($4::timestamptz, now()) AND ` + claimableSQL + `
		 ORDER BY q.next_attempt_at, q.created_at, q.event_id LIMIT 1 FOR UPDATE SKIP LOCKED)) AS delivery_id
	FROM h) x WHERE x.delivery_id IS NOT NULL
), mark AS (
	UPDATE webhooks w SET next_probe_at = coalesce($4::timestamptz, now()) + $2 * interval '1 millisecond' FROM p WHERE w.id = p.webhook_id
)
UPDATE delivery_queue d
SET status = 'in_flight', claim_seq = d.claim_seq + 1, locked_by = $1, locked_until = coalesce($4::timestamptz, now()) + $2 * interval '1 millisecond'
FROM p, webhooks w
WHERE d.delivery_id = p.delivery_id AND w.id = d.webhook_id
RETURNING d.delivery_id, d.event_id, d.webhook_id, w.org_id, d.created_at, d.attempts + 1, d.claim_seq, w.url, d.conversation`

// ClaimProbes claims the due probes of failing webhooks (see claimProbesSQL), at most limit,
// with their payloads. Each is marked Probe.
func (q *Queue) ClaimProbes(ctx context.Context, instance string, lease time.Duration, limit int) ([]ClaimedDelivery, error) {
	rows, err := queryGeneric(ctx, q.pool, claimProbesSQL, instance, lease.Milliseconds(), limit, q.nowArg())
	if err != nil {
		return nil, fmt.Errorf("claim probes: %w", err)
	}
	var out []ClaimedDelivery
	for rows.Next() {
		d := ClaimedDelivery{Probe: true}
		if err := rows.Scan(&d.ID, &d.EventID, &d.WebhookID, &d.OrgID, &d.CreatedAt, &d.Attempt, &d.Claim, &d.URL, &d.Conversation); err != nil {
			rows.Close()
			return nil, fmt.Errorf("claim probes: %w", err)
		}
		out = append(out, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim probes: %w", err)
	}
	if err := q.payloads(ctx, out); err != nil {
		hs := make([]Handback, len(out))
		for i, d := range out {
			hs[i] = Handback{ID: d.ID, Claim: d.Claim}
		}
		if rerr := q.Release(context.WithoutCancel(ctx), instance, hs); rerr != nil {
			err = fmt.Errorf("%w (and handing the claims back: %v)", err, rerr)
		}
		return nil, fmt.Errorf("claim probes: %w", err)
	}
	return out, nil
}

// resetHealth is the SET list (after a comma) of SetWebhookStatus that makes a resumed webhook
// ok again; a pause keeps its health as it is.
const resetHealth = `
	consecutive_failures = CASE WHEN $3 = 'active' THEN 0 ELSE consecutive_failures END,
	failing_since = CASE WHEN $3 = 'active' THEN NULL ELSE failing_since END,
	next_probe_at = CASE WHEN $3 = 'active' THEN NULL ELSE next_probe_at END,
	probe_interval_ms = CASE WHEN $3 = 'active' THEN NULL ELSE probe_interval_ms END`
