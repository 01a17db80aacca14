package store

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// VersionTable is the table in which tern records the applied schema version.
const VersionTable = "public.wabarelay_schema_version"

func migrationsFS() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err)
	}
	return sub
}

// Migrate applies every pending migration on conn and creates the history partitions of
// yesterday, today and the next PartitionsAhead days (see EnsurePartitions). tern holds a Postgres advisory lock around
// the whole run, so any number of processes may call Migrate at once; all but one wait and then
// find nothing to do.
func Migrate(ctx context.Context, conn *pgx.Conn) error {
	m, err := migrate.NewMigrator(ctx, conn, VersionTable)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := m.LoadMigrations(migrationsFS()); err != nil {
		return fmt.Errorf("migrate: load: %w", err)
	}
	if err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	// The history tables take rows only for days that have partitions (migration 011); the
	// app keeps creating them ahead, this makes a freshly migrated database usable at once.
	now := time.Now()
	return ensurePartitions(ctx, conn, now.AddDate(0, 0, -1), now.AddDate(0, 0, PartitionsAhead))
}

// MigrateDSN connects to dsn with a dedicated connection and runs Migrate.
func MigrateDSN(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("migrate: connect: %w", err)
	}
	// A failed close of the dedicated connection loses nothing: Migrate's answer is the one.
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return Migrate(ctx, conn)
}

// SchemaVersion returns the applied schema version and the latest version this build knows.
func SchemaVersion(ctx context.Context, conn *pgx.Conn) (current, latest int32, err error) {
	m, err := migrate.NewMigrator(ctx, conn, VersionTable)
	if err != nil {
		return 0, 0, err
	}
	if err := m.LoadMigrations(migrationsFS()); err != nil {
		return 0, 0, err
	}
	current, err = m.GetCurrentVersion(ctx)
	return current, int32(len(m.Migrations)), err
}

// MigrationsHash is a short hex digest of the embedded migrations and of the partitioned tables
// (whose partitions Migrate creates). Test helpers name template
// databases after it, so a schema change never reuses a stale template.
func MigrationsHash() string {
	names, err := fs.Glob(migrationsFS(), "*.sql")
	if err != nil {
		panic(err)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, name := range names {
		b, err := fs.ReadFile(migrationsFS(), name)
		if err != nil {
			panic(err)
		}
		h.Write(fmt.Appendf(nil, "%s\x00%d\x00", name, len(b)))
		h.Write(b)
	}
	// The partitions a migration run creates are part of the schema a template database holds.
	for _, p := range partitioned {
		h.Write(fmt.Appendf(nil, "partition:%s\x00", p.table))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
