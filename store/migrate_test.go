package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestMigrateConcurrentAndTwice: eight processes' worth of connections migrate one empty
// database at once; all succeed, the schema is complete, and running again changes nothing.
func TestMigrateConcurrentAndTwice(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE empty"); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	dsn := srv.DSN("empty")

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- store.MigrateDSN(ctx, dsn)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate: %v", err)
		}
	}
	if err := store.MigrateDSN(ctx, dsn); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	current, latest, err := store.SchemaVersion(ctx, conn)
	if err != nil || current != latest || latest < 2 {
		t.Fatalf("schema version %d of %d: %v", current, latest, err)
	}
	for _, table := range []string{"orgs", "api_keys", "channels", "webhooks", "webhook_channels", "events", "deliveries", "delivery_attempts", "delivery_queue"} {
		var n int
		if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s", table)).Scan(&n); err != nil {
			t.Fatalf("table %s: %v", table, err)
		}
	}
}

func TestMigrationsHashStable(t *testing.T) {
	if a, b := store.MigrationsHash(), store.MigrationsHash(); a != b || len(a) != 16 {
		t.Fatalf("MigrationsHash = %q, %q", a, b)
	}
}
