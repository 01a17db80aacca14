// Package testenv gives tests real PostgreSQL and Redis servers, never mocks.
//
// Postgres hands every test its own freshly migrated database, cloned (in about 10 ms) from a
// template database that is built once per server and schema version. Redis hands every test a redis:// URL. Both use
// the servers named by WABARELAY_TEST_DATABASE_URL and WABARELAY_TEST_REDIS_URL when those are set,
// and otherwise start throwaway servers from the locally installed binaries
// (apt-get install -y postgresql redis-server).
//
// Packages that call Postgres must wrap their tests with Main so that the throwaway server is
// stopped when the test binary ends:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// StartPostgres and StartRedis give a test a server of its own, which it may kill and restart to
// test failure handling.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/store"
)

// Environment variables that point the helpers at existing servers.
const (
	// envDatabaseURL names an admin DSN (a superuser, or a role with CREATEDB) of a PostgreSQL
	// server that tests may create and drop databases on.
	envDatabaseURL = "WABARELAY_TEST_DATABASE_URL"
	// envRedisURL names a redis:// URL that tests may share (they use random keys).
	envRedisURL = "WABARELAY_TEST_REDIS_URL"
)

const (
	// templateLockKey is the pg_advisory_lock key (on the admin database) that serialises
	// template creation and the removal of stale databases across test processes.
	templateLockKey int64 = 0x7762_7274_6d70_6c31 // "wbrtmpl1"
	// stampPrefix starts the COMMENT that records when a template was last used.
	stampPrefix = "wabarelay-testenv last-used "
	// Templates not used by any test process for this long are dropped from a shared server.
	staleTemplateAge = 24 * time.Hour
	// Test databases older than this on a shared server belong to test processes that died
	// without running their cleanups; they are dropped.
	staleDatabaseAge = 6 * time.Hour
)

var (
	reTemplate      = regexp.MustCompile(`^tmpl_[0-9a-f]+(_[0-9]{8})?$`)
	reTemplateBuild = regexp.MustCompile(`^tmpl_[0-9a-f]+(_[0-9]{8})?_build$`)
	reTestDB        = regexp.MustCompile(`^t_([0-9]+)_[0-9a-f]+$`)
)

// mainCalled is set by Main; Postgres refuses to run without it.
var mainCalled atomic.Bool

// shared is the server that Postgres uses: the one named by envDatabaseURL, or a throwaway one
// started on first use and stopped by Main.
var shared struct {
	once  sync.Once
	admin string
	srv   *PGServer
	pool  *pgxpool.Pool // admin connections for CREATE and DROP DATABASE
	err   error
	tmpl  templateCache
}

// Postgres returns the DSN (a postgres:// URL) of a fresh, fully migrated database holding no
// data, for this test only.
//
// The database is cloned from a template database (CREATE DATABASE t_<time>_<rand> TEMPLATE
// tmpl_<hash>_<UTC day>) and dropped WITH (FORCE) in t.Cleanup. The template is named after
// store.MigrationsHash() and built once per server and schema version, under a Postgres advisory
// lock so that test binaries running in parallel do not race; an existing template is reused.
//
// The server is the one named by the admin DSN in WABARELAY_TEST_DATABASE_URL (for example
// postgres://postgres@127.0.0.1:5432/postgres) if that is set. Otherwise a throwaway server is
// started once per test binary and stopped by Main. Either way the package's TestMain must call
// Main; Postgres fails the test otherwise.
func Postgres(t testing.TB) string {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatal("testenv: Postgres needs the package's tests to run under testenv.Main, which stops the " +
			"throwaway server at the end; add: func TestMain(m *testing.M) { testenv.Main(m) }")
	}
	shared.once.Do(func() {
		if dsn := os.Getenv(envDatabaseURL); dsn != "" {
			if _, err := dsnFor(dsn, "postgres"); err != nil {
				shared.err = fmt.Errorf("%s: %w", envDatabaseURL, err)
				return
			}
			shared.admin = dsn
		}
		if shared.admin == "" {
			shared.srv, shared.err = newPGServer(true)
			if shared.err != nil {
				return
			}
			shared.admin = shared.srv.DSN("postgres")
		}
		cfg, err := pgxpool.ParseConfig(shared.admin)
		if err != nil {
			shared.err = err
			return
		}
		// Few and short-lived: many test binaries may share one server and its max_connections.
		cfg.MinConns, cfg.MaxConns = 0, 2
		cfg.MaxConnIdleTime, cfg.HealthCheckPeriod = 5*time.Second, time.Second
		shared.pool, shared.err = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if shared.err != nil {
		t.Fatalf("testenv: postgres: %v", shared.err)
	}
	name, err := createTestDB(shared.admin, shared.pool, &shared.tmpl, shared.srv == nil)
	if err != nil {
		t.Fatalf("testenv: postgres: %v", err)
	}
	dsn, _ := dsnFor(shared.admin, name)
	t.Cleanup(func() {
		if err := dropDB(shared.pool, name); err != nil {
			t.Logf("testenv: dropping test database %s: %v", name, err)
		}
	})
	return dsn
}

// Main runs the tests of a package, then the functions after (in order; e.g.
// browsertest.StopShared), then stops the throwaway PostgreSQL server that Postgres started (if
// any), and exits with the tests' status. Use it as
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M, after ...func()) {
	mainCalled.Store(true)
	code := m.Run()
	for _, f := range after {
		f()
	}
	removeBuiltCaddy()
	if shared.pool != nil {
		shared.pool.Close()
	}
	if shared.srv != nil {
		if err := shared.srv.destroy(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: stopping the throwaway postgres server: %v\n", err)
		}
	}
	os.Exit(code)
}

// templateCache remembers the template that was checked or built on one server. Only success is
// remembered, so a failure is retried by the next test.
type templateCache struct {
	mu   sync.Mutex
	name string
}

func (c *templateCache) get(ctx context.Context, admin string, sharedServer bool) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Dated: the template holds the history partitions of the days around its creation, so a
	// test process that runs past midnight (UTC) moves on to the new day's template.
	want := "tmpl_" + store.MigrationsHash() + "_" + time.Now().UTC().Format("20060102")
	if c.name == want {
		return c.name, nil
	}
	name, err := ensureTemplate(ctx, admin, want, store.Migrate, sharedServer)
	if err != nil {
		return "", err
	}
	c.name = name
	return name, nil
}

func (c *templateCache) reset(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.name == name {
		c.name = ""
	}
}

// execer runs admin statements: a *pgx.Conn or a *pgxpool.Pool.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// createTestDB clones the template into a new database on the server of admin and returns its
// name. The statements run on db.
func createTestDB(admin string, db execer, tc *templateCache, sharedServer bool) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for attempt := 0; ; attempt++ {
		tmpl, err := tc.get(ctx, admin, sharedServer)
		if err != nil {
			return "", err
		}
		name, err := cloneDB(ctx, db, tmpl)
		if err != nil && attempt == 0 && sqlState(err) == "3D000" {
			// The template was dropped behind our back (by hand): build it again.
			tc.reset(tmpl)
			continue
		}
		return name, err
	}
}

// ensureTemplate makes sure the template database name exists on the server, building it with
// migrate if needed, and returns name. All of it runs under an advisory lock on the admin
// database, so only one process builds a template at a time; the template is built as
// name_build and renamed when complete, so a half-built template is never cloned. On a shared
// server, templates and test databases that were abandoned long ago are dropped as well.
func ensureTemplate(ctx context.Context, admin, name string, migrate func(context.Context, *pgx.Conn) error, sharedServer bool) (string, error) {
	conn, err := connect(ctx, admin)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close(context.Background()) }() // closed even if Close returns an error
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockKey); err != nil {
		return "", fmt.Errorf("taking the template lock: %w", err)
	}
	// Closing the connection releases the lock too; unlock explicitly to hand it over promptly.
	defer conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", templateLockKey) //nolint:errcheck

	if sharedServer {
		reapStaleDatabases(ctx, conn, name)
	}
	stamp := "COMMENT ON DATABASE " + ident(name) + " IS " + literal(stampPrefix+strconv.FormatInt(time.Now().Unix(), 10))

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("looking for template %s: %w", name, err)
	}
	if exists {
		if _, err := conn.Exec(ctx, stamp); err != nil {
			return "", fmt.Errorf("stamping template %s: %w", name, err)
		}
		return name, nil
	}

	build := name + "_build"
	for _, sql := range []string{
		"DROP DATABASE IF EXISTS " + ident(build) + " WITH (FORCE)", // left by a process that died
		"CREATE DATABASE " + ident(build) + " TEMPLATE template0",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return "", fmt.Errorf("building template %s: %s: %w", name, sql, err)
		}
	}
	buildDSN, err := dsnFor(admin, build)
	if err != nil {
		return "", err
	}
	bconn, err := connect(ctx, buildDSN)
	if err != nil {
		return "", err
	}
	err = migrate(ctx, bconn)
	// Nobody may be connected to the database when it is renamed or cloned. pgx closes the
	// connection even if Close returns an error.
	_ = bconn.Close(context.Background())
	if err != nil {
		return "", fmt.Errorf("migrating template %s: %w", name, err)
	}
	for _, sql := range []string{
		"ALTER DATABASE " + ident(build) + " RENAME TO " + ident(name),
		"ALTER DATABASE " + ident(name) + " WITH IS_TEMPLATE true ALLOW_CONNECTIONS false",
		stamp,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return "", fmt.Errorf("building template %s: %s: %w", name, sql, err)
		}
	}
	return name, nil
}

// reapStaleDatabases drops, best effort, what test processes that died left on a shared server:
// templates of other schema versions that no test process has used for staleTemplateAge, half-built
// templates (none can be in progress while we hold the lock), and test databases older than
// staleDatabaseAge. Only names of the forms this package creates are considered.
func reapStaleDatabases(ctx context.Context, conn *pgx.Conn, current string) {
	rows, err := conn.Query(ctx, `SELECT datname, coalesce(shobj_description(oid, 'pg_database'), '') FROM pg_database
		WHERE datname LIKE 'tmpl\_%' OR datname LIKE 't\_%'`)
	if err != nil {
		return
	}
	type db struct{ name, comment string }
	var dbs []db
	for rows.Next() {
		var d db
		if rows.Scan(&d.name, &d.comment) == nil {
			dbs = append(dbs, d)
		}
	}
	rows.Close()
	now := time.Now()
	for _, d := range dbs {
		var drop bool
		switch {
		case d.name == current:
		case reTemplateBuild.MatchString(d.name):
			drop = true
		case reTemplate.MatchString(d.name):
			ts, err := strconv.ParseInt(strings.TrimPrefix(d.comment, stampPrefix), 10, 64)
			drop = err == nil && strings.HasPrefix(d.comment, stampPrefix) && now.Sub(time.Unix(ts, 0)) > staleTemplateAge
		default:
			if m := reTestDB.FindStringSubmatch(d.name); m != nil {
				ts, err := strconv.ParseInt(m[1], 10, 64)
				drop = err == nil && now.Sub(time.Unix(ts, 0)) > staleDatabaseAge
			}
		}
		if drop {
			conn.Exec(ctx, "ALTER DATABASE "+ident(d.name)+" WITH IS_TEMPLATE false") //nolint:errcheck
			conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(d.name)+" WITH (FORCE)")  //nolint:errcheck
		}
	}
}

// cloneDB creates a new database from the template tmpl and returns its name.
func cloneDB(ctx context.Context, db execer, tmpl string) (string, error) {
	name := fmt.Sprintf("t_%d_%s", time.Now().Unix(), randHex(6))
	sql := "CREATE DATABASE " + ident(name) + " TEMPLATE " + ident(tmpl)
	var err error
	for attempt := 0; ; attempt++ {
		_, err = db.Exec(ctx, sql)
		// 55006: someone is connected to the template. Templates refuse connections, so this
		// is at most a backend still on its way out.
		if err == nil || sqlState(err) != "55006" || attempt >= 100 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", sql, err)
	}
	return name, nil
}

func dropDB(db execer, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := db.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)")
	return err
}

func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing DSN: %w", err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", redactDSN(dsn), err)
	}
	return conn, nil
}

// dsnFor returns the URL DSN admin with its database replaced by db.
func dsnFor(admin, db string) (string, error) {
	u, err := url.Parse(admin)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("want a postgres:// URL, got %q", redactDSN(admin))
	}
	u.Path = "/" + db
	u.RawPath = ""
	return u.String(), nil
}

func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		return u.String()
	}
	return dsn
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func ident(s string) string   { return pgx.Identifier{s}.Sanitize() }
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
