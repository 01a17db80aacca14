package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Org is an organization: the owner of channels, webhooks and API keys.
type Org struct {
	ID        uuid.UUID `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// CreateOrg creates an organization.
func (s *Store) CreateOrg(ctx context.Context, name string) (Org, error) {
	o := Org{ID: newID(), Name: name}
	if err := s.pool.QueryRow(ctx, `INSERT INTO orgs (id, name) VALUES ($1, $2) RETURNING created_at`, o.ID, o.Name).Scan(&o.CreatedAt); err != nil {
		return Org{}, fmt.Errorf("create org: %w", err)
	}
	return o, nil
}

// GetOrg returns an organization.
func (s *Store) GetOrg(ctx context.Context, id uuid.UUID) (Org, error) {
	o := Org{ID: id}
	err := s.pool.QueryRow(ctx, `SELECT name, created_at FROM orgs WHERE id = $1`, id).Scan(&o.Name, &o.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Org{}, ErrOrgNotFound
	}
	if err != nil {
		return Org{}, fmt.Errorf("get org: %w", err)
	}
	return o, nil
}
