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
	Attempt      int
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
}

// ListDeliveries returns a page of the deliveries of one of the org's webhooks, ordered by
// (created_at, id), with their attempts. more reports whether another page follows.
func (s *Store) ListDeliveries(ctx context.Context, orgID, webhookID uuid.UUID, p DeliveryPage) (ds []Delivery, more bool, err error) {
	if _, err := s.GetWebhook(ctx, orgID, webhookID); err != nil {
		return nil, false, err
	}
	rows, err := s.pool.Query(ctx, `
		SELECT d.id, d.event_id, e.type, d.status, d.attempts,
		       CASE WHEN d.status = 'pending' THEN d.next_attempt_at END, d.last_status_code, d.last_error, d.created_at, d.updated_at
		FROM deliveries d JOIN events e ON e.id = d.event_id
		WHERE d.webhook_id = $1 AND ($2 = '' OR d.status = $2)
		  AND ($3::uuid IS NULL OR (d.created_at, d.id) > (SELECT created_at, id FROM deliveries WHERE id = $3))
		  AND ($5::timestamptz IS NULL OR d.created_at >= $5) AND ($6::timestamptz IS NULL OR d.created_at < $6)
		ORDER BY d.created_at, d.id LIMIT $4`, webhookID, p.Status, p.After, p.Limit+1, p.Since, p.Until)
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
		FROM delivery_attempts WHERE delivery_id = ANY($1) ORDER BY delivery_id, attempt, started_at`, ids)
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
		ds[index[id]].Log = append(ds[index[id]].Log, a)
	}
	return ds, more, rows.Err()
}

// RetryDelivery re-queues a failed delivery of one of the org's webhooks with a fresh
// schedule (attempt counting restarts).
func (s *Store) RetryDelivery(ctx context.Context, orgID, webhookID, deliveryID uuid.UUID) error {
	if _, err := s.GetWebhook(ctx, orgID, webhookID); err != nil {
		return err
	}
	var status string
	err := s.pool.QueryRow(ctx, `
		WITH cur AS (SELECT id, status FROM deliveries WHERE id = $1 AND webhook_id = $2 FOR UPDATE),
		     upd AS (UPDATE deliveries d SET status = 'pending', attempts = 0, next_attempt_at = now(), locked_by = NULL,
		                 locked_until = NULL, updated_at = now()
		             FROM cur WHERE d.id = cur.id AND cur.status = 'failed' RETURNING d.id)
		SELECT CASE WHEN EXISTS (SELECT 1 FROM upd) THEN 'requeued' ELSE cur.status END FROM cur`, deliveryID, webhookID).Scan(&status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrDeliveryNotFound
	case err != nil:
		return fmt.Errorf("retry delivery: %w", err)
	case status != "requeued":
		return ErrDeliveryNotFailed
	}
	_, err = s.pool.Exec(ctx, `SELECT pg_notify($1, '')`, DeliveriesNotifyChannel)
	return err
}

// RecoverDeliveries re-queues, with a fresh schedule, every failed delivery of one of the org's
// webhooks created since since, and returns how many.
func (s *Store) RecoverDeliveries(ctx context.Context, orgID, webhookID uuid.UUID, since time.Time) (int, error) {
	if _, err := s.GetWebhook(ctx, orgID, webhookID); err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, `
		UPDATE deliveries SET status = 'pending', attempts = 0, next_attempt_at = now(), locked_by = NULL,
		       locked_until = NULL, updated_at = now()
		WHERE webhook_id = $1 AND status = 'failed' AND created_at >= $2`, webhookID, since)
	if err != nil {
		return 0, fmt.Errorf("recover deliveries: %w", err)
	}
	if tag.RowsAffected() > 0 {
		if _, err := s.pool.Exec(ctx, `SELECT pg_notify($1, '')`, DeliveriesNotifyChannel); err != nil {
			return 0, fmt.Errorf("recover deliveries: %w", err)
		}
	}
	return int(tag.RowsAffected()), nil
}
