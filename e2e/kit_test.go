package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	_ "github.com/wabarelay/wabarelay"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestMain: the test binary runs as Caddy when the kit starts it (testenv.StartCaddy), with the
// modules of cmd/caddy.
func TestMain(m *testing.M) { testenv.MainCaddy(m, caddycmd.Main) }

// authFailures is how many bad credentials a client address may present within a minute before
// it is refused with 429 (the documented guard limit, docs/relay.md).
const authFailures = 20

// relayEnv is a relay test world: fake upstream, database (a testenv.Fixture, whose DSN, key,
// pool and store the fields repeat), an org, and the Caddy processes started on them.
type relayEnv struct {
	t       *testing.T
	fake    *fakegraph.Server
	fix     *testenv.Fixture
	dsn     string
	keyB64  string
	store   *store.Store
	pool    *pgxpool.Pool
	org     uuid.UUID
	caddies map[string]*testenv.Caddy // Caddy processes by origin
}

const (
	pnid        = "1001"
	wabaID      = "2001"
	realToken   = "EAAGrealUpstreamToken1234567890"
	pnid2       = "1002"
	pnid3       = "1003"
	otherPnid   = "9009"
	proxyPrefix = "/upstream-proxy"
	// proxyRoute is the site's relay route: {proxy_url} is the origin + proxyPrefix.
	proxyRoute = "handle_path " + proxyPrefix + "/* {\n\t\twabarelay_proxy\n\t}"
)

// newRelayEnv returns a relay test world on a fresh database. Each Caddy gets its Redis (or
// none) from caddy or caddyWith.
func newRelayEnv(t *testing.T) *relayEnv {
	t.Helper()
	return newRelayEnvOn(t, testenv.Postgres(t))
}

// newRelayEnvOn is newRelayEnv on the database dsn (for tests that stop their own server).
func newRelayEnvOn(t *testing.T, dsn string) *relayEnv {
	t.Helper()
	f := testenv.NewStore(t, &testenv.StoreOpts{DSN: dsn})
	e := &relayEnv{t: t, fake: fakegraph.New(fakegraph.WithHealthReadsUnrecorded()), fix: f, dsn: dsn, keyB64: f.KeyB64, store: f.Store, pool: f.Pool,
		caddies: map[string]*testenv.Caddy{}}
	e.fake.Start()
	t.Cleanup(e.fake.Close)
	for _, n := range []string{pnid, pnid2, pnid3} {
		e.fake.AddNumber(n, wabaID, "+1 555 0100", "Acme")
	}
	e.fake.AddToken(realToken, []string{pnid, pnid2, pnid3}, []string{wabaID})
	e.fake.AddTemplates(wabaID,
		fakegraph.Template{ID: "t1", Name: "hello_world", Status: "APPROVED", Category: "UTILITY", Language: "en_US"},
		fakegraph.Template{ID: "t2", Name: "order_update", Status: "APPROVED", Category: "UTILITY", Language: "en_US"},
		fakegraph.Template{ID: "t3", Name: "promo", Status: "APPROVED", Category: "MARKETING", Language: "en_US"})
	e.org = f.Org(t).ID
	return e
}

// channel creates a channel; connected ones are active on the fake's number pnid.
func (e *relayEnv) channel(connected bool) store.Channel {
	return e.channelOn(connected, pnid)
}

// channelOn creates a channel of the env's org; connected ones are active on the fake's number.
func (e *relayEnv) channelOn(connected bool, number string) store.Channel {
	e.t.Helper()
	opts := &testenv.ChannelOpts{}
	if connected {
		opts.Connection = connection(number)
	}
	return e.fix.Channel(e.t, e.org, opts)
}

// connection is a connection on the fake's number n of the business account wabaID.
func connection(n string) *store.Connection {
	return &store.Connection{PhoneNumberID: n, WabaID: wabaID, DisplayPhoneNumber: "+1 555 0100", UpstreamToken: realToken}
}

// caddy starts a Caddy process running the relay and returns its base URL ({proxy_url}).
func (e *relayEnv) caddy(redisURL string) string {
	e.t.Helper()
	return e.caddyWith(redisURL, "", "") + proxyPrefix
}

// caddyWith starts a Caddy process on the fake upstream, with Redis at redisURL (none when
// ""), extra lines in the wabarelay option and the site (beside the relay's route and
// /metrics), and returns its origin.
func (e *relayEnv) caddyWith(redisURL, appExtra, siteExtra string) string {
	e.t.Helper()
	if redisURL != "" {
		appExtra += "\nredis {env.WBR_TEST_REDIS}"
	}
	return e.caddySite("", appExtra, e.fake.URL(), proxyRoute+`
	handle /metrics {
		metrics
	}
	`+siteExtra, "WBR_TEST_REDIS="+redisURL)
}

// caddySite starts a Caddy process serving site (the site block's lines) on a port of its
// own, with the global options global and the wabarelay app on the env's database and key,
// upstream (a base URL; /v26.0 is added) and the lines app, and env added to its environment;
// it returns the origin.
func (e *relayEnv) caddySite(global, app, upstream, site string, env ...string) string {
	e.t.Helper()
	port := testenv.FreePort(e.t)
	cfg := fmt.Sprintf(`{
	admin off
	persist_config off
	%s
	wabarelay {
		database       {env.WBR_TEST_DATABASE}
		encryption_key {env.WBR_TEST_KEY}
		%s
		upstream       %s/v26.0
	}
}
http://127.0.0.1:%d {
	%s
}
`, global, app, upstream, port, site)
	return e.caddyFile(cfg, port, append([]string{"WBR_TEST_DATABASE=" + e.dsn, "WBR_TEST_KEY=" + e.keyB64}, env...)...)
}

// caddyFile starts a Caddy process with the Caddyfile cfg, serving on port, with env added to
// its environment, and returns its origin once it serves its configuration. At the end of the
// test its log must hold neither the upstream token nor a media URL.
func (e *relayEnv) caddyFile(cfg string, port int, env ...string) string {
	e.t.Helper()
	c := testenv.StartCaddy(e.t, cfg, env...)
	e.t.Cleanup(func() {
		c.Kill()
		logs := c.LogBytes()
		if bytes.Contains(logs, []byte(realToken)) {
			e.t.Errorf("the upstream token appears in Caddy's logs")
		}
		if bytes.Contains(logs, []byte("whatsapp_business/attachments")) {
			e.t.Errorf("a media URL appears in Caddy's logs")
		}
	})
	origin := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	e.caddies[origin] = c
	return origin
}

// cacheFlushedLog is (part of) the info line the app logs once its channel change listener has
// connected and flushed the relay cache.
const cacheFlushedLog = "listening for channel changes; relay cache flushed"

// waitCacheFlushed waits until every Caddy of e has flushed its relay cache on its listener's
// first connection: what is cached before that is dropped. (LISTEN showing in pg_stat_activity,
// testenv.WaitListen, is not enough: the flush follows the LISTEN's reply.)
func (e *relayEnv) waitCacheFlushed() {
	e.t.Helper()
	for origin, c := range e.caddies {
		if err := c.WaitLog(context.Background(), cacheFlushedLog, testenv.Patience); err != nil {
			e.t.Fatalf("caddy %s: %v", origin, err)
		}
	}
}

// repoCaddy runs the repo's Caddyfile as `make run` does, on port (its site address
// localhost:8080 moved there) and changed further by edit when set, with e's database and key
// and env in its environment, and returns its origin (http://localhost:<port>).
func (e *relayEnv) repoCaddy(port int, edit func(caddyfile string) string, env ...string) string {
	e.t.Helper()
	raw, err := os.ReadFile("../Caddyfile")
	if err != nil {
		e.t.Fatal(err)
	}
	host := "localhost:" + strconv.Itoa(port)
	cfg := strings.ReplaceAll(string(raw), "localhost:8080", host)
	if edit != nil {
		cfg = edit(cfg)
	}
	e.caddyFile(cfg, port, append([]string{"WABARELAY_DATABASE_URL=" + e.dsn, "WABARELAY_ENCRYPTION_KEY=" + e.keyB64}, env...)...)
	return "http://" + host
}

// metaAppEnv is the environment of the repo's Caddyfile with a Meta app configured (and the
// upstream pointed at e's fake).
func (e *relayEnv) metaAppEnv() []string {
	return []string{"WABARELAY_UPSTREAM=" + e.fake.URL() + "/v26.0",
		"META_APP_ID=app-1", "META_APP_SECRET=app-secret", "META_CONFIG_ID=cfg-1", "META_VERIFY_TOKEN=verify-me"}
}

// count counts a table's rows.
func (e *relayEnv) count(table string) int { return e.countRows("SELECT count(*) FROM " + table) }

// countWhere counts the rows of table whose col is v.
func (e *relayEnv) countWhere(table, col string, v any) int {
	return e.countRows("SELECT count(*) FROM "+table+" WHERE "+col+" = $1", v)
}

// undelivered counts the deliveries not (yet) delivered.
func (e *relayEnv) undelivered() int {
	return e.countRows("SELECT count(*) FROM deliveries WHERE status <> 'delivered'")
}

// inFlight counts the deliveries claimed and not yet recorded: each held by its claim's lease.
func (e *relayEnv) inFlight() int { return e.countWhere("delivery_queue", "status", "in_flight") }

// retriesScheduled counts the deliveries waiting for a retry: a failed attempt recorded, the
// next one pending until its retry delay has passed.
func (e *relayEnv) retriesScheduled() int {
	return e.countRows("SELECT count(*) FROM delivery_queue WHERE status = 'pending' AND attempts > 0")
}

func (e *relayEnv) countRows(query string, args ...any) int {
	var n int
	if err := e.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// upstreamEvents counts the events stored from the upstream's posts: every event but the
// channel_status events that connecting a channel stores.
func (e *relayEnv) upstreamEvents() int {
	return e.countRows("SELECT count(*) FROM events WHERE type <> 'channel_status'")
}
