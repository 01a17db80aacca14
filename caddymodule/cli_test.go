package caddymodule

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

// TestCLIWithoutKey: commands that change no secret need no encryption key (DESIGN §4), and a
// missing setting is named in the error.
func TestCLIWithoutKey(t *testing.T) {
	dsn := testenv.Postgres(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	key := make([]byte, 32)
	rand.Read(key)
	box, _ := secretbox.New(key)
	st := store.New(pool, box)
	org, err := st.CreateOrg(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	ch, err := st.CreateChannel(context.Background(), org.ID, "c", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("WABARELAY_DATABASE_URL", dsn)
	t.Setenv("WABARELAY_ENCRYPTION_KEY", "")

	out, err := runCLITest(t, "channel", "deactivate", "--id", ch.ID.String())
	if err != nil || len(out) != 1 || out[0]["status"] != "inactive" || out[0]["inactive_reason"] != "operator" {
		t.Fatalf("deactivate without a key: %v %v", out, err)
	}
	out, err = runCLITest(t, "channel", "reconnect", "--id", ch.ID.String())
	if err != nil || len(out) != 1 || out[0]["token_expires_at"] == nil {
		t.Fatalf("reconnect without a key: %v %v", out, err)
	}
	for _, args := range [][]string{{"apikey", "list", "--org", org.ID.String()}, {"org", "create", "--name", "b"}, {"migrate"}} {
		if _, err := runCLITest(t, args...); err != nil {
			t.Fatalf("%v without a key: %v", args, err)
		}
	}
	t.Setenv("WABARELAY_DATABASE_URL", "")
	if _, err := runCLITest(t, "channel", "deactivate", "--id", ch.ID.String()); err == nil || !strings.Contains(err.Error(), "WABARELAY_DATABASE_URL") {
		t.Fatalf("missing database: %v", err)
	}
}
