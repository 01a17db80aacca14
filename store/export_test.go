package store

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

// ClaimSQL is the claim statement (tests measure its work).
const ClaimSQL = claimSQL

// ClaimArgs returns the arguments of ClaimSQL for c at the database's now().
func ClaimArgs(c QueueClaim) []any { return claimArgs(c, nil) }

// MigrateTo applies the migrations up to version v (tests of one migration on old data).
func MigrateTo(ctx context.Context, conn *pgx.Conn, v int32) error {
	m, err := migrate.NewMigrator(ctx, conn, VersionTable)
	if err != nil {
		return err
	}
	if err := m.LoadMigrations(migrationsFS()); err != nil {
		return err
	}
	return m.MigrateTo(ctx, v)
}

// SetRekeyBeforeWrite sets the hook Rekey runs between reading a batch of table.column and
// writing it.
func (o *RekeyOptions) SetRekeyBeforeWrite(f func(table, column string)) { o.beforeWrite = f }

// PlanGuardSQL is the guard the hot statements are planned under (see queryGeneric).
const PlanGuardSQL = planGuardSQL

// GenericStatements are the statements run on generic plans (queryGeneric, execGeneric).
var GenericStatements = map[string]string{
	"claim":            claimSQL,
	"claim probes":     claimProbesSQL,
	"record health":    recordHealthSQL,
	"record attempts":  recordSQL,
	"store deliveries": storeDeliveriesSQL,
	"usage":            usageSQL, // store/usage.go
}

// QueryGeneric is queryGeneric.
var QueryGeneric = queryGeneric

// SetWebhookStatusIn is SetWebhookStatus in tx, which the caller commits (tests of queue writers
// racing a resume).
func (s *Store) SetWebhookStatusIn(ctx context.Context, tx pgx.Tx, orgID, id uuid.UUID, status string) (Webhook, error) {
	return s.setWebhookStatus(ctx, tx, orgID, id, status)
}
