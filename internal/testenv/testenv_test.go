package testenv

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	if os.Getenv("TESTENV_HELPER") == "1" {
		helperProcess()
		return
	}
	Main(m)
}

func mustConnect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) }) // closed even if Close returns an error
	return conn
}

func queryInt(t *testing.T, conn *pgx.Conn, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestPostgres(t *testing.T) {
	start := time.Now()
	dsn1 := Postgres(t)
	first := time.Since(start)
	start = time.Now()
	dsn2 := Postgres(t)
	second := time.Since(start)
	t.Logf("Postgres(t): first call %v, second call %v (%s set: %v)", first, second, envDatabaseURL, os.Getenv(envDatabaseURL) != "")

	if dsn1 == dsn2 {
		t.Fatalf("two calls returned the same DSN %s", dsn1)
	}
	c1, c2 := mustConnect(t, dsn1), mustConnect(t, dsn2)
	for _, c := range []*pgx.Conn{c1, c2} {
		if n := queryInt(t, c, "SELECT count(*) FROM wabarelay_schema_version"); n != 1 {
			t.Errorf("wabarelay_schema_version has %d rows, want 1", n)
		}
		if n := queryInt(t, c, "SELECT count(*) FROM orgs"); n != 0 {
			t.Errorf("orgs has %d rows, want 0", n)
		}
	}
	var db1, db2 string
	if err := c1.QueryRow(context.Background(), "SELECT current_database()").Scan(&db1); err != nil {
		t.Fatal(err)
	}
	if err := c2.QueryRow(context.Background(), "SELECT current_database()").Scan(&db2); err != nil {
		t.Fatal(err)
	}
	if db1 == db2 || !strings.HasPrefix(db1, "t_") {
		t.Fatalf("databases %q and %q: want two different t_ databases", db1, db2)
	}
	if _, err := c1.Exec(context.Background(), "INSERT INTO orgs (id, name) VALUES (gen_random_uuid(), 'x')"); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c2, "SELECT count(*) FROM orgs"); n != 0 {
		t.Errorf("a row inserted in %s shows in %s", db1, db2)
	}
}

func TestPostgresDroppedAfterTest(t *testing.T) {
	var dsn string
	t.Run("inner", func(t *testing.T) {
		dsn = Postgres(t)
		mustConnect(t, dsn) // left open: the drop must not be blocked by it
	})
	name := dsn[strings.LastIndex(dsn, "/")+1:]
	if i := strings.IndexByte(name, '?'); i >= 0 {
		name = name[:i]
	}
	admin := mustConnect(t, shared.admin)
	if n := queryInt(t, admin, "SELECT count(*) FROM pg_database WHERE datname = $1", name); n != 0 {
		t.Fatalf("database %s still exists after its test ended", name)
	}
}

func TestPostgresParallel(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	for i := range 8 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			dsn := Postgres(t)
			took := time.Since(start)
			c := mustConnect(t, dsn)
			if n := queryInt(t, c, "SELECT count(*) FROM orgs"); n != 0 {
				t.Errorf("orgs has %d rows", n)
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[dsn] {
				t.Errorf("DSN %s handed out twice", dsn)
			}
			seen[dsn] = true
			t.Logf("clone took %v", took)
		})
	}
}

// TestTemplateConcurrentBuild races several sessions (as separate test binaries would) to build
// the same new template: exactly one must run the migrations, and all must get a usable template.
func TestTemplateConcurrentBuild(t *testing.T) {
	Postgres(t) // starts the shared server if needed
	admin := shared.admin
	name := "tmpl_" + randHex(8)
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Error(err)
			return
		}
		defer func() { _ = conn.Close(ctx) }() // closed even if Close returns an error
		// 3D000: the template was never built (the test failed before)
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident(name)+" WITH IS_TEMPLATE false"); err != nil && sqlState(err) != "3D000" {
			t.Error(err)
		}
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	var migrations atomic.Int32
	const sessions = 6
	migrate := func(ctx context.Context, conn *pgx.Conn) error {
		migrations.Add(1)
		// The race is on once the other sessions wait for the template lock: build only then.
		var waiting int
		var err error
		if !Within(time.Minute, func() bool {
			err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&waiting)
			return err != nil || waiting >= sessions-1
		}) {
			return fmt.Errorf("only %d sessions wait for the template lock", waiting)
		}
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, "CREATE TABLE marker (x int)")
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, sessions)
	for i := range errs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, errs[i] = ensureTemplate(ctx, admin, name, migrate, false)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := migrations.Load(); n != 1 {
		t.Fatalf("migrations ran %d times, want 1", n)
	}
	ctx := context.Background()
	db, err := cloneDB(ctx, shared.pool, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dropDB(shared.pool, db); err != nil {
			t.Error(err)
		}
	})
	dsn, _ := dsnFor(admin, db)
	c := mustConnect(t, dsn)
	if n := queryInt(t, c, "SELECT count(*) FROM marker"); n != 0 {
		t.Fatal("marker table not empty")
	}
	a := mustConnect(t, admin)
	if n := queryInt(t, a, "SELECT count(*) FROM pg_database WHERE datname = $1 AND datistemplate AND NOT datallowconn", name); n != 1 {
		t.Fatal("template is not marked as a template refusing connections")
	}
	if n := queryInt(t, a, "SELECT count(*) FROM pg_database WHERE datname = $1", name+"_build"); n != 0 {
		t.Fatal("the _build database is left over")
	}
}

func TestPGServerStopStart(t *testing.T) {
	start := time.Now()
	s := StartPostgres(t)
	t.Logf("StartPostgres took %v", time.Since(start))
	start = time.Now()
	dsn := s.CreateDB(t)
	t.Logf("first CreateDB (template build + clone) took %v", time.Since(start))
	if !strings.Contains(dsn, fmt.Sprintf(":%d/", s.Port())) {
		t.Fatalf("DSN %s does not use port %d", dsn, s.Port())
	}
	ctx := context.Background()
	c := mustConnect(t, dsn)
	if n := queryInt(t, c, "SELECT count(*) FROM orgs"); n != 0 {
		t.Fatalf("orgs has %d rows", n)
	}
	if _, err := c.Exec(ctx, "INSERT INTO orgs (id, name) VALUES (gen_random_uuid(), 'survivor')"); err != nil {
		t.Fatal(err)
	}

	s.Stop(t)
	if err := c.Ping(ctx); err == nil {
		t.Fatal("an open connection still works after Stop")
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(cctx, dsn); err == nil {
		_ = conn.Close(ctx) // the test fails either way
		t.Fatal("connecting works after Stop")
	}

	start = time.Now()
	s.Start(t)
	t.Logf("Start after Stop took %v", time.Since(start))
	c2 := mustConnect(t, dsn)
	if n := queryInt(t, c2, "SELECT count(*) FROM orgs WHERE name = 'survivor'"); n != 1 {
		t.Fatalf("the committed row did not survive the crash: %d rows", n)
	}
	if dsn2 := s.CreateDB(t); dsn2 == dsn {
		t.Fatal("CreateDB returned the same database twice")
	}
}

func TestRedis(t *testing.T) {
	start := time.Now()
	u := Redis(t)
	t.Logf("Redis(t) took %v (%s set: %v)", time.Since(start), envRedisURL, os.Getenv(envRedisURL) != "")
	opts, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	defer func() { _ = c.Close() }() // nothing is left to release
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestRedisServerKillRestart(t *testing.T) {
	s := StartRedis(t)
	if s.URL() != "redis://"+s.Addr()+"/0" {
		t.Fatalf("URL %s, Addr %s", s.URL(), s.Addr())
	}
	opts, _ := redis.ParseURL(s.URL())
	opts.MaxRetries = -1
	c := redis.NewClient(opts)
	defer func() { _ = c.Close() }() // nothing is left to release
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill(t)
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING works after Kill")
	}
	s.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		// The pool may hand out one dead connection first.
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING after Restart: %v", err)
		}
	}
	if err := c.Get(ctx, "k").Err(); err != redis.Nil {
		t.Fatalf("GET after Restart: %v, want redis.Nil (no data kept)", err)
	}
}

// TestFreePort: a port FreePort returns is free, below the kernel's ephemeral range (where no
// listener on port 0 or outgoing connection gets it), and never returned twice, also to
// concurrent callers.
func TestFreePort(t *testing.T) {
	p := FreePort(t)
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		t.Fatalf("port %d is not free: %v", p, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got := make([]int, 200)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i] = FreePort(t) })
	}
	wg.Wait()
	seen := map[int]bool{p: true}
	for _, q := range got {
		if seen[q] || q >= ephemeralLow() {
			t.Fatalf("FreePort returned %d (twice, or in the ephemeral range from %d)", q, ephemeralLow())
		}
		seen[q] = true
	}
}

// TestOrphansDie kills a test binary that owns a Postgres and a Redis server and checks that both
// servers die with it and that the next run removes the leftover directory.
func TestOrphansDie(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TESTENV_HELPER=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Killed below; this is for a test that fails before. An error means it has exited.
	defer func() { _ = cmd.Process.Kill() }()
	sc := bufio.NewScanner(stdout)
	var pgPort, redisPort, dir string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "READY" {
			pgPort, redisPort = f[1], f[2]
		}
		if len(f) == 2 && f[0] == "DIR" {
			dir = f[1]
		}
		if pgPort != "" && dir != "" {
			break
		}
	}
	if pgPort == "" || dir == "" {
		t.Fatal("the helper process did not report its servers")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("killing the helper process: %v", err)
	}
	_ = cmd.Wait() // "signal: killed", as intended

	for _, port := range []string{pgPort, redisPort} {
		Eventually(t, 10*time.Second, func() bool {
			c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second)
			if err == nil {
				_ = c.Close() // only a probe: the server is still up
			}
			return err != nil
		}, "the server on port %s to die with its killed test process", port)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("expected the leftover directory %s: %v", dir, err)
	}
	reapStaleDirs()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("reapStaleDirs left %s behind (%v)", dir, err)
	}
}

// helperProcess is the body of the test binary that TestOrphansDie kills.
func helperProcess() {
	s, err := newPGServer(false)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin, _ := exec.LookPath("redis-server")
	r := &RedisServer{bin: bin}
	r.mu.Lock()
	r.port, _ = freePort()
	if err := r.launch(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	r.mu.Unlock()
	fmt.Printf("DIR %s\nREADY %d %d\n", s.dir, s.port, r.port)
	time.Sleep(time.Hour)
}

// TestReapStale checks that what dead test processes leave on a shared server is dropped, and
// nothing else.
func TestReapStale(t *testing.T) {
	Postgres(t) // starts the shared server if needed
	ctx := context.Background()
	conn := mustConnect(t, shared.admin)
	var (
		oldDB     = "t_1000000000_" + randHex(4)
		freshDB   = fmt.Sprintf("t_%d_%s", time.Now().Unix(), randHex(4))
		oldTmpl   = "tmpl_" + randHex(8)
		freshTmpl = "tmpl_" + randHex(8)
		build     = "tmpl_" + randHex(8) + "_build"
		unstamped = "tmpl_" + randHex(8)
		unrelated = "tx_1000000000_" + randHex(4)
		all       = []string{oldDB, freshDB, oldTmpl, freshTmpl, build, unstamped, unrelated}
		wantKept  = map[string]bool{freshDB: true, freshTmpl: true, unstamped: true, unrelated: true}
		stamp     = func(db string, ts int64) string {
			return "COMMENT ON DATABASE " + ident(db) + " IS " + literal(stampPrefix+strconv.FormatInt(ts, 10))
		}
	)
	t.Cleanup(func() {
		for _, db := range all {
			// 3D000: reaped (as some must be) or never created (the test failed before)
			if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident(db)+" WITH IS_TEMPLATE false"); err != nil && sqlState(err) != "3D000" {
				t.Error(err)
			}
			if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(db)+" WITH (FORCE)"); err != nil {
				t.Error(err)
			}
		}
	})
	for _, db := range all {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident(db)+" TEMPLATE template0"); err != nil {
			t.Fatal(err)
		}
	}
	for _, sql := range []string{
		"ALTER DATABASE " + ident(oldTmpl) + " WITH IS_TEMPLATE true ALLOW_CONNECTIONS false",
		stamp(oldTmpl, time.Now().Add(-25*time.Hour).Unix()),
		stamp(freshTmpl, time.Now().Add(-time.Hour).Unix()),
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockKey); err != nil {
		t.Fatal(err)
	}
	reapStaleDatabases(ctx, conn, "tmpl_current")
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", templateLockKey); err != nil {
		t.Fatal(err)
	}
	for _, db := range all {
		n := queryInt(t, conn, "SELECT count(*) FROM pg_database WHERE datname = $1", db)
		if kept := n == 1; kept != wantKept[db] {
			t.Errorf("database %s: kept %v, want %v", db, kept, wantKept[db])
		}
	}
}

// TestRedisCluster: the cluster comes up with every slot served; a key written through the
// cluster client is read back through it; killing the master of a key's slot makes that key
// fail while keys of other masters still work.
func TestRedisCluster(t *testing.T) {
	c := StartRedisCluster(t, 3)
	client := c.Client(t)
	ctx := context.Background()
	keys := map[int]string{}
	for i := 0; len(keys) < 3 && i < 1000; i++ {
		k := "{k" + strconv.Itoa(i) + "}"
		keys[c.MasterOf(t, k)] = k
	}
	if len(keys) != 3 {
		t.Fatalf("keys found on %d masters, want 3", len(keys))
	}
	for _, k := range keys {
		if err := client.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if v, err := client.Get(ctx, k).Result(); err != nil || v != "v" {
			t.Fatalf("get %s: %q %v", k, v, err)
		}
	}
	c.Kill(t, 0)
	if err := client.Get(ctx, keys[0]).Err(); err == nil {
		t.Fatal("a key of the killed master still answered")
	}
	if v, err := client.Get(ctx, keys[1]).Result(); err != nil || v != "v" {
		t.Fatalf("a key of a live master: %q %v", v, err)
	}
}
