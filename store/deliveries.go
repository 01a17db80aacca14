package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ErrDeliveryNotFound is returned for an unknown delivery (or one of another webhook or org).
var ErrDeliveryNotFound = errors.New("delivery not found")

// ErrDeliveryNotFailed is returned by RetryDelivery for a delivery that has not failed.
var ErrDeliveryNotFailed = errors.New("delivery has not failed")

// Delivery is one event's delivery to one webhook, with its attempts.
type Delivery struct {
	ID             uuid.UUID
	EventID        uuid.UUID
	EventType      string
	Status         string
	Attempts       int
	NextAttemptAt  *time.Time // set while pending
	LastStatusCode *int
	LastError      *string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	Log            []Attempt
}

// Attempt is one HTTP attempt of a delivery.
type Attempt struct {
	// Attempt counts the attempts of the attempt's schedule from 1.
	Attempt int
	// Schedule numbers the delivery's schedules from 1: the original one, then one per manual
	// retry or recovery, each of which restarts the attempt count. It is derived from the log
	// (a new schedule starts where the attempt number does not increase).
	Schedule     int
	StartedAt    time.Time
	DurationMS   int
	StatusCode   *int
	Error        *string
	ResponseBody *string
}

// DeliveryPage selects deliveries: Status filters ("" for all); After is the cursor (the
// last delivery of the previous page); Limit caps the page; Since and Until bound the
// creation time.
type DeliveryPage struct {
	Status string
	After  *uuid.UUID
	Limit  int
	// Since and Until, when set, keep deliveries created at or after Since and before Until.
	Since, Until *time.Time
	// Newest lists newest first: (created_at, id) descending, After then meaning "older than".
	// The dashboard's delivery log; the API lists oldest first.
	Newest bool
}

// deliveryStatusSQL is a delivery's status as the delivery log shows it, from its log row d and
// its queue row q (LEFT JOIN delivery_queue q ON q.delivery_id = d.id): live deliveries take
// their state from the queue — in flight, or pending (held ones too: the interface knows no
// held state).
const deliveryStatusSQL = `CASE WHEN q.status = 'in_flight' THEN 'in_flight' WHEN q.status IS NOT NULL THEN 'pending' ELSE d.status END`

// ListDeliveries returns a page of the deliveries of one of the org's webhooks, ordered by
// (created_at, id) (descending with p.Newest), with their attempts in time order. more reports
// whether another page follows.
func (s *Store) ListDeliveries(ctx context.Context, orgID, webhookID uuid.UUID, p DeliveryPage) (ds []Delivery, more bool, err error) {
	if _, err := s.GetWebhook(ctx, orgID, webhookID); err != nil {
		return nil, false, err
	}
	// Live deliveries take their state from the queue: in flight, or pending (held ones too:
	// the interface knows no held state) with their next attempt's time.
	after, order := ">", "x.created_at, x.id"
	if p.Newest {
		after, order = "<", "x.created_at DESC, x.id DESC"
	}
	rows, err := s.pool.Query(ctx, `
		SELECT * FROM (
			SELECT d.id, d.event_id, e.type, `+deliveryStatusSQL+` AS status,
			       d.attempts, CASE WHEN q.status IN ('pending', 'held') THEN q.next_attempt_at END,
			       d.last_status_code, d.last_error, d.created_at, d.updated_at
			FROM deliveries d
			JOIN events e ON e.id = d.event_id AND e.created_at = d.created_at
			LEFT JOIN delivery_queue q ON q.delivery_id = d.id
			WHERE d.webhook_id = $1
			  AND ($3::uuid IS NULL OR (d.created_at, d.id) `+after+` (SELECT created_at, id FROM deliveries WHERE id = $3))
			  AND ($5::timestamptz IS NULL OR d.created_at >= $5) AND ($6::timestamptz IS NULL OR d.created_at < $6)
		) x
		WHERE $2 = '' OR x.status = $2
		ORDER BY `+order+` LIMIT $4`, webhookID, p.Status, p.After, p.Limit+1, p.Since, p.Until)
	if err != nil {
		return nil, false, fmt.Errorf("list deliveries: %w", err)
	}
	ds, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		err := r.Scan(&d.ID, &d.EventID, &d.EventType, &d.Status, &d.Attempts, &d.NextAttemptAt, &d.LastStatusCode, &d.LastError, &d.CreatedAt, &d.UpdatedAt)
		d.Log = []Attempt{}
		return d, err
	})
	if err != nil {
		return nil, false, fmt.Errorf("list deliveries: %w", err)
	}
	if len(ds) > p.Limit {
		ds, more = ds[:p.Limit], true
	}
	if len(ds) == 0 {
		return ds, more, nil
	}
	ids := make([]uuid.UUID, len(ds))
	index := map[uuid.UUID]int{}
	for i, d := range ds {
		ids[i], index[d.ID] = d.ID, i
	}
	rows, err = s.pool.Query(ctx, `
		SELECT delivery_id, attempt, started_at, duration_ms, status_code, error, response_body
		FROM delivery_attempts WHERE delivery_id = ANY($1) ORDER BY delivery_id, started_at, attempt`, ids)
	if err != nil {
		return nil, false, fmt.Errorf("list delivery attempts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var a Attempt
		if err := rows.Scan(&id, &a.Attempt, &a.StartedAt, &a.DurationMS, &a.StatusCode, &a.Error, &a.ResponseBody); err != nil {
			return nil, false, fmt.Errorf("list delivery attempts: %w", err)
		}
		d := &ds[index[id]]
		a.Schedule = 1
		if n := len(d.Log); n > 0 {
			if prev := d.Log[n-1]; a.Attempt > prev.Attempt {
				a.Schedule = prev.Schedule
			} else {
				a.Schedule = prev.Schedule + 1
			}
		}
		d.Log = append(d.Log, a)
	}
	return ds, more, rows.Err()
}

// requeueSQL puts failed deliveries of webhook $1 (the log rows selected by the condition
// appended to it) back in the queue with a fresh schedule (attempt counting restarts): due at
// $3 (NULL: the database's now(), see package clock), or held if the webhook is paused. It
// returns the requeued ids. A delivery of an ordered webhook keeps its conversation: when the
// conversation has rows queued it waits behind their head, then goes before the later ones (the
// first waiting row in inbound order is promoted next, see claimableSQL).
const requeueSQL = `
	WITH f AS (
		UPDATE deliveries d SET status = 'pending', attempts = 0, updated_at = coalesce($3::timestamptz, now())
		WHERE d.webhook_id = $1 AND d.status = 'failed' AND `

var requeueTail = `
		RETURNING d.id, d.created_at, d.event_id, d.webhook_id, d.conversation
	)
	INSERT INTO delivery_queue (delivery_id, created_at, event_id, webhook_id, status, next_attempt_at, conversation)
	SELECT f.id, f.created_at, f.event_id, f.webhook_id,
	       ` + queueStatusSQL("f.webhook_id", "f.conversation", "f.conv_rank",
	heldWhenPausedSQL("f.webhook_id")) + `,
	       coalesce($3::timestamptz, now()), f.conversation
	FROM (SELECT f.*, row_number() OVER (PARTITION BY f.conversation ORDER BY f.created_at, f.event_id, f.id) AS conv_rank FROM f) f
	ON CONFLICT (delivery_id) DO NOTHING`

// RetryDelivery re-queues a failed delivery of one of the org's webhooks with a fresh
// schedule (attempt counting restarts).
func (s *Store) RetryDelivery(ctx context.Context, orgID, webhookID, deliveryID uuid.UUID) error {
	if _, err := s.GetWebhook(ctx, orgID, webhookID); err != nil {
		return err
	}
	return s.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, requeueSQL+`d.id = $2`+requeueTail, webhookID, deliveryID, s.nowArg())
		if err != nil {
			return fmt.Errorf("retry delivery: %w", err)
		}
		if tag.RowsAffected() == 0 {
			var found bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM deliveries WHERE id = $1 AND webhook_id = $2)`,
				deliveryID, webhookID).Scan(&found); err != nil {
				return fmt.Errorf("retry delivery: %w", err)
			}
			if !found {
				return ErrDeliveryNotFound
			}
			return ErrDeliveryNotFailed
		}
		return notifyDeliveries(ctx, tx)
	})
}

// RecoverDeliveries re-queues, with a fresh schedule, every failed delivery of one of the org's
// webhooks created since since, and returns how many.
func (s *Store) RecoverDeliveries(ctx context.Context, orgID, webhookID uuid.UUID, since time.Time) (int, error) {
	if _, err := s.GetWebhook(ctx, orgID, webhookID); err != nil {
		return 0, err
	}
	var n int
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, requeueSQL+`d.created_at >= $2`+requeueTail, webhookID, since, s.nowArg())
		if err != nil {
			return err
		}
		if n = int(tag.RowsAffected()); n > 0 {
			return notifyDeliveries(ctx, tx)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("recover deliveries: %w", err)
	}
	return n, nil
}
