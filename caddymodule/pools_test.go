package caddymodule

import (
	"context"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestPoolSessionsWithoutJIT: the product's sessions run with jit off (a per-call plan of a
// claim under a backlog was JIT-compiled at every call), unless the connection string sets it.
func TestPoolSessionsWithoutJIT(t *testing.T) {
	f := testenv.NewStore(t)
	for dsn, want := range map[string]string{f.DSN: "off", withParam(f.DSN, "jit=on"): "on"} {
		pool, key, err := acquirePool(dsn)
		if err != nil {
			t.Fatal(err)
		}
		var jit string
		if err := pool.QueryRow(context.Background(), `SHOW jit`).Scan(&jit); err != nil {
			t.Fatal(err)
		}
		if err := releasePool(key); err != nil {
			t.Fatal(err)
		}
		if jit != want {
			t.Errorf("jit %s with %q, want %s", jit, strings.SplitN(dsn, "?", 2)[len(strings.SplitN(dsn, "?", 2))-1], want)
		}
	}
}

// withParam adds a query parameter to a postgres:// URL.
func withParam(dsn, kv string) string {
	if strings.Contains(dsn, "?") {
		return dsn + "&" + kv
	}
	return dsn + "?" + kv
}
