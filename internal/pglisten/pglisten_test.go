package pglisten

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func withParam(dsn, kv string) string {
	if strings.Contains(dsn, "://") {
		if strings.Contains(dsn, "?") {
			return dsn + "&" + kv
		}
		return dsn + "?" + kv
	}
	return dsn + " " + kv
}

// TestListener: a DSN carrying pool parameters connects (they are not sent as startup
// parameters); notifications arrive; after the server ends the connection, the listener
// reconnects, calls OnConnect again and keeps receiving; a panicking callback is logged and
// survived.
func TestListener(t *testing.T) {
	f := testenv.NewStore(t)
	dsn, pool := f.DSN, f.Pool
	connects := make(chan struct{}, 10)
	got := make(chan string, 10)
	core, logs := observer.New(zap.WarnLevel)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var panicked atomic.Bool
	l := &Listener{
		DSN:       withParam(dsn, "pool_max_conns=5"),
		Channels:  []string{"pglisten_a", "pglisten_b"},
		OnConnect: func() { connects <- struct{}{} },
		OnNotify: func(ch, payload string) {
			if payload == "boom" && panicked.CompareAndSwap(false, true) {
				panic("callback failed")
			}
			got <- ch + ":" + payload
		},
		Logger:     zap.New(core),
		MinBackoff: 10 * time.Millisecond,
	}
	go func() { l.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	wait := func(what string, c <-chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(20 * time.Second):
			t.Fatalf("no %s", what)
		}
	}
	expect := func(want string) {
		t.Helper()
		select {
		case s := <-got:
			if s != want {
				t.Fatalf("notification %q, want %q", s, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("no notification %q", want)
		}
	}
	notify := func(ch, payload string) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), `SELECT pg_notify($1, $2)`, ch, payload); err != nil {
			t.Fatal(err)
		}
	}
	wait("connection", connects)
	notify("pglisten_a", "1")
	expect("pglisten_a:1")
	notify("pglisten_b", "2")
	expect("pglisten_b:2")

	// the server ends the listener's connection: it comes back
	if _, err := pool.Exec(context.Background(),
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	wait("reconnection", connects)
	notify("pglisten_a", "3")
	expect("pglisten_a:3")

	// a panicking callback is logged, and the listener reconnects
	notify("pglisten_a", "boom")
	wait("reconnection after a panic", connects)
	notify("pglisten_a", "4")
	expect("pglisten_a:4")
	if logs.FilterMessageSnippet("listen connection lost").Len() < 2 {
		t.Fatalf("losses not logged: %v", logs.All())
	}
	for _, e := range logs.All() {
		for _, f := range e.Context {
			if strings.Contains(f.String, "password") || (f.Interface != nil && strings.Contains(strings.ToLower(f.Key), "dsn")) {
				t.Fatalf("connection string in the log: %+v", e)
			}
		}
	}
}
