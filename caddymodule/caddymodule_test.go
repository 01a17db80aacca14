package caddymodule

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestMain: the tests here adapt, validate and load configurations in process; the ones that run
// Caddy as a child process are in package e2e.
func TestMain(m *testing.M) { testenv.Main(m) }

func adapt(t *testing.T, caddyfile string) []byte {
	t.Helper()
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	for _, w := range warnings {
		t.Logf("adapt warning: %s", w.String())
	}
	return cfg
}

func TestModulesRegistered(t *testing.T) {
	for _, id := range []string{"wabarelay", "http.handlers.wabarelay_api"} {
		if _, err := caddy.GetModule(id); err != nil {
			t.Errorf("module %s: %v", id, err)
		}
	}
	if _, ok := caddycmd.Commands()["wabarelay"]; !ok {
		t.Error("CLI command wabarelay not registered")
	}
}

// TestAdaptRepoCaddyfile: the repo's Caddyfile adapts with no database and no environment, the
// secrets stay placeholders (never baked into JSON), and access logs filter the API key header.
func TestAdaptRepoCaddyfile(t *testing.T) {
	raw, err := os.ReadFile("../Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("WABARELAY_DATABASE_URL", "postgres://u:supersecret@db/x")
	cfg := adapt(t, string(raw))
	if bytes.Contains(cfg, []byte("supersecret")) {
		t.Fatal("secret from the environment baked into the adapted config")
	}
	var parsed struct {
		Apps struct {
			Wabarelay *App `json:"wabarelay"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(cfg, &parsed); err != nil {
		t.Fatal(err)
	}
	app := parsed.Apps.Wabarelay
	if app == nil || app.Database != "{env.WABARELAY_DATABASE_URL}" || app.EncryptionKey != "{env.WABARELAY_ENCRYPTION_KEY}" {
		t.Fatalf("wabarelay app = %+v", app)
	}
	if app.ManagementRateLimit == nil || app.ManagementRateLimit.Requests != 600 || time.Duration(app.ManagementRateLimit.Window) != time.Minute {
		t.Fatalf("management_rate_limit = %+v", app.ManagementRateLimit)
	}
	for _, want := range []string{`"handler":"wabarelay_api"`, `"request\u003eheaders\u003eX-Api-Key":{"filter":"delete"}`, `/connect/REDACTED`, `hub.verify_token=REDACTED`} {
		if !bytes.Contains(cfg, []byte(want)) {
			t.Errorf("adapted config lacks %s", want)
		}
	}
}

// TestAdaptAllOptions: every option of the global block parses into the JSON app config.
func TestAdaptAllOptions(t *testing.T) {
	cfg := adapt(t, `{
	wabarelay {
		database        {env.DB}
		redis           {env.REDIS}
		encryption_key  {file./run/secrets/key}
		upstream        https://graph.facebook.com/v26.0
		connect_base    https://relay.example.com
		proxy_url       https://relay.example.com/upstream-proxy
		connect_link_ttl 24h
		register_pin    123456
		rate_card       /etc/wabarelay/rates.csv
		skip_migrations
		health_refresh  12h
		meta {
			app_id       {env.META_APP_ID}
			app_secret   {env.META_APP_SECRET}
			config_id    cfg1
			verify_token {env.VT}
			sdk_url      https://connect.facebook.net/en_US/sdk.js
		}
		delivery {
			retry_delays  1s 2s
			timeout       5s
			workers       8
			per_webhook   2
			per_org       4
			handoff_wait_per_webhook 3
			handoff_wait  6
			lease         30s
			retention     48h
			max_hold      24h
			failure_threshold 5
			disable_after 48h
			probe_interval 10s 1m
			root_ca       /tmp/ca.pem
			allow_private_targets
		}
		broadcasts {
			workers 2
			lease   3m
		}
		management_rate_limit 100 30s
		limits {
			webhooks_per_org 5
			api_keys_per_org 7
		}
		relay_log {
			buffer   64
			batch    8
			interval 50ms
			per_channel 20
		}
	}
}
example.com {
	handle_path /v1/* {
		wabarelay_api
	}
}`)
	var parsed struct {
		Apps struct {
			Wabarelay json.RawMessage `json:"wabarelay"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(cfg, &parsed); err != nil {
		t.Fatal(err)
	}
	want := `{"database":"{env.DB}","redis":"{env.REDIS}","encryption_key":"{file./run/secrets/key}",` +
		`"upstream":"https://graph.facebook.com/v26.0","connect_base":"https://relay.example.com",` +
		`"proxy_url":"https://relay.example.com/upstream-proxy","connect_link_ttl":86400000000000,` +
		`"meta":{"app_id":"{env.META_APP_ID}","app_secret":"{env.META_APP_SECRET}","config_id":"cfg1","verify_token":"{env.VT}",` +
		`"sdk_url":"https://connect.facebook.net/en_US/sdk.js"},"register_pin":"123456",` +
		`"delivery":{"retry_delays":[1000000000,2000000000],"timeout":5000000000,"workers":8,"per_webhook":2,"per_org":4,` +
		`"handoff_wait_per_webhook":3,"handoff_wait":6,` +
		`"lease":30000000000,"retention":172800000000000,"max_hold":86400000000000,` +
		`"failure_threshold":5,"disable_after":172800000000000,"probe_interval":[10000000000,60000000000],"root_ca":"/tmp/ca.pem","allow_private_targets":true},` +
		`"broadcasts":{"workers":2,"lease":180000000000},` +
		`"management_rate_limit":{"requests":100,"window":30000000000},` +
		`"limits":{"webhooks_per_org":5,"api_keys_per_org":7},"relay_log":{"buffer":64,"batch":8,"interval":50000000,"per_channel":20},"health_refresh":"12h","rate_card":"/etc/wabarelay/rates.csv","skip_migrations":true}`
	if string(parsed.Apps.Wabarelay) != want {
		t.Fatalf("app JSON:\n got %s\nwant %s", parsed.Apps.Wabarelay, want)
	}
	for _, bad := range []string{
		`{ wabarelay { bogus 1 } }`,
		`{ wabarelay { database } }`,
		`{ wabarelay { connect_link_ttl soon } }`,
		`{ wabarelay { management_rate_limit -5 } }`,
		`{ wabarelay { delivery { workers none } } }`,
		`{ wabarelay { delivery { workers -1 } } }`,
		`{ wabarelay { delivery { failure_threshold 0 } } }`,
		`{ wabarelay { delivery { probe_interval 1s 2s 3s } } }`,
		`{ wabarelay { meta { nope x } } }`,
		`{ wabarelay { limits { webhooks_per_org 0 } } }`,
		`{ wabarelay { limits { api_keys_per_org many } } }`,
		`{ wabarelay { limits { channels_per_org 5 } } }`,
		`{ wabarelay { relay_log on } }`,
		`{ wabarelay { relay_log off now } }`,
		`{ wabarelay { relay_log { buffer 0 } } }`,
		`{ wabarelay { relay_log { flush 1s } } }`,
		`{ wabarelay { broadcasts { workers -1 } } }`,
		`{ wabarelay { broadcasts { workers many } } }`,
		`{ wabarelay { broadcasts { lease soon } } }`,
		`{ wabarelay { broadcasts { rate 5 } } }`,
		`{ wabarelay { broadcasts now } }`,
	} {
		if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(bad+"\n:80 {\n respond ok\n}"), nil); err == nil {
			t.Errorf("adapted invalid config %q", bad)
		}
	}
}

// instance is an in-process Caddy with the wabarelay app on a test database. In process, not a
// child (testenv.StartCaddy), because its tests read the app's process-wide state: the pool
// references (pgPools) and memory limiters (memLimiters) across reloads.
type instance struct {
	t    *testing.T
	port int
	dsn  string
	key  string // an API key of a test org
	pool *pgxpool.Pool
}

func caddyfileFor(port int, extra string) string {
	return fmt.Sprintf(`{
	admin off
	persist_config off
	wabarelay {
		database       {env.WBR_TEST_DATABASE}
		encryption_key {env.WBR_TEST_KEY}
		connect_base   https://relay.test
		%s
	}
}
http://127.0.0.1:%d {
	handle_path /v1/* {
		wabarelay_api
	}
}`, extra, port)
}

// startInstance loads Caddy with caddyfileFor(port, extra): a test that needs its options from the
// start passes them here rather than reloading, since a POST sent right after a reload can meet
// the old server's closing socket (see instanceClient).
func startInstance(t *testing.T, extra ...string) *instance {
	t.Helper()
	f := testenv.NewStore(t)
	in := &instance{t: t, port: testenv.FreePort(t), dsn: f.DSN, pool: f.Pool}
	t.Setenv("WBR_TEST_DATABASE", in.dsn)
	t.Setenv("WBR_TEST_KEY", f.KeyB64)
	in.load(caddyfileFor(in.port, strings.Join(extra, "\n")))
	t.Cleanup(func() { _ = caddy.Stop() }) // Stop logs what the apps' Stop return; its own error is always nil
	_, in.key = f.APIKey(t, f.Org(t).ID)
	return in
}

func (in *instance) load(caddyfile string) {
	in.t.Helper()
	if err := caddy.Load(adapt(in.t, caddyfile), true); err != nil {
		in.t.Fatalf("load: %v", err)
	}
}

func (in *instance) request(method, path, body string) (int, []byte, error) {
	for try := 1; ; try++ {
		req, _ := http.NewRequest(method, fmt.Sprintf("http://127.0.0.1:%d%s", in.port, path), strings.NewReader(body))
		req.Header.Set("X-Api-Key", in.key)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := instanceClient.Do(req)
		if err != nil {
			var op *net.OpError
			dial := errors.As(err, &op) && op.Op == "dial"
			// A GET's connection closed before any answer (io.EOF, a reset) may have been queued on
			// the old socket too: dialled, never read. Asked again, as http.Transport asks again an
			// idempotent request whose reused connection closed; a POST is not.
			unanswered := method == http.MethodGet && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET))
			if (dial || unanswered) && try < 5 {
				continue // see instanceClient
			}
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
}

// instanceClient opens a connection per request: a kept-alive connection to the server a reload
// (instance.load) is shutting down can be reset under a POST, which is not retried. A new
// connection can be reset too, while it is being made: Caddy binds the reloaded server's socket
// beside the old one (SO_REUSEPORT), caddy.Load returns once the old server's shutdown has
// started rather than finished (caddyhttp's App.Stop), and a connection the kernel queued on
// the old socket meanwhile is reset when it closes (CI, 2026-11-28: "dial tcp …: connect:
// connection reset by peer" right after a reload). Nothing was sent then, so instance.request
// dials again. A connection the kernel completed on the old socket is closed unread as well
// (CI, 2026-11-28 night: TestRolesReloadNoDispatcher's GET got EOF after a reload): a GET is
// then asked again; a POST is not, as nothing tells that it was not read.
var instanceClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

func poolRefs(t *testing.T, dsn string) int {
	t.Helper()
	n, _ := pgPools.References(poolKeyFor("pg", dsn))
	return n
}

// TestServeAndReload: the built handler serves the API through Caddy; reloading with a changed
// config while requests are running drops none of them and leaves one pool reference.
// Not parallel: it loads Caddy in process and counts the process-wide pool and limiter references.
func TestServeAndReload(t *testing.T) {
	in := startInstance(t)
	status, body, err := in.request("POST", "/v1/channels", `{"name":"via caddy"}`)
	if err != nil || status != 201 || !bytes.Contains(body, []byte(`"connect_url":"https://relay.test/connect/`)) {
		t.Fatalf("create channel through caddy: %d %s %v", status, body, err)
	}
	status, body, _ = in.request("GET", "/v1/nope", "")
	if status != 404 || string(bytes.TrimSpace(body)) != `{"error":"Not found"}` {
		t.Fatalf("unknown path: %d %s", status, body)
	}
	if n := poolRefs(t, in.dsn); n != 1 {
		t.Fatalf("pool references = %d, want 1", n)
	}

	// Every answer the server gives during reloads must be a 200: a handler on an old config
	// must still have its pool, store and limiter. Connection-level errors (a reset or EOF
	// before any response) come from Caddy handing its listening socket to the new config
	// (SO_REUSEPORT: connections queued on the old socket are reset), not from our modules;
	// they are counted and logged, not failed.
	var stop atomic.Bool
	var failures, ok, connErrs atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				status, body, err := in.request("GET", "/v1/channels", "")
				switch {
				case err != nil:
					connErrs.Add(1)
				case status != 200:
					failures.Add(1)
					t.Logf("request during reload: %d %s", status, body)
				default:
					ok.Add(1)
				}
			}
		}()
	}
	// each reload (and the end) comes after more answers under the config before it
	served := func() {
		t.Helper()
		since := ok.Load()
		testenv.Eventually(t, 20*time.Second, func() bool { return ok.Load() >= since+5 }, "answers (%d failed so far)", failures.Load())
	}
	for i := 0; i < 5; i++ {
		served()
		in.load(caddyfileFor(in.port, fmt.Sprintf("management_rate_limit %d 1m", 100000+i)))
	}
	served()
	stop.Store(true)
	wg.Wait()
	t.Logf("during 5 reloads: %d ok, %d failed answers, %d connection errors", ok.Load(), failures.Load(), connErrs.Load())
	if failures.Load() != 0 || ok.Load() == 0 {
		t.Fatalf("during 5 reloads: %d ok, %d failed answers", ok.Load(), failures.Load())
	}
	if n := poolRefs(t, in.dsn); n != 1 {
		t.Fatalf("pool references after reloads = %d, want 1 (leak)", n)
	}
	if n := len(memLimiterKeys()); n != 1 {
		t.Fatalf("%d memory limiters after reloads, want 1", n)
	}
}

func memLimiterKeys() []any {
	var keys []any
	memLimiters.Range(func(k, _ any) bool { keys = append(keys, k); return true })
	return keys
}

// TestStartFailsWithoutDatabase: an unreachable database fails the load with a clear error that
// does not contain the password, and releases what Provision acquired.
// Not parallel: it loads Caddy in process and counts the process-wide pool references.
func TestStartFailsWithoutDatabase(t *testing.T) {
	dsn := fmt.Sprintf("postgres://wabarelay:s3cretpw@127.0.0.1:%d/db?connect_timeout=2", testenv.FreePort(t))
	t.Setenv("WBR_TEST_DATABASE", dsn)
	t.Setenv("WBR_TEST_KEY", base64.StdEncoding.EncodeToString(testenv.NewKey()))
	err := caddy.Load(adapt(t, caddyfileFor(testenv.FreePort(t), "")), true)
	t.Cleanup(func() { _ = caddy.Stop() }) // Stop logs what the apps' Stop return; its own error is always nil
	if err == nil {
		t.Fatal("load succeeded without a database")
	}
	if strings.Contains(err.Error(), "s3cretpw") {
		t.Fatalf("error reveals the password: %v", err)
	}
	if !strings.Contains(err.Error(), "postgres") {
		t.Fatalf("error does not say what failed: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return poolRefs(t, dsn) == 0 }, "the pool released after the failed start")
}

func TestProvisionErrors(t *testing.T) {
	for name, tc := range map[string]struct{ env map[string]string }{
		"no database":   {map[string]string{"WBR_TEST_KEY": base64.StdEncoding.EncodeToString(make([]byte, 32))}},
		"no key":        {map[string]string{"WBR_TEST_DATABASE": "postgres://x@127.0.0.1/db"}},
		"short key":     {map[string]string{"WBR_TEST_DATABASE": "postgres://x@127.0.0.1/db", "WBR_TEST_KEY": "c2hvcnQ="}},
		"bad DSN value": {map[string]string{"WBR_TEST_DATABASE": "postgres://u:pw@host:notaport/db", "WBR_TEST_KEY": base64.StdEncoding.EncodeToString(make([]byte, 32))}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("WBR_TEST_DATABASE", "")
			t.Setenv("WBR_TEST_KEY", "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			err := caddy.Validate(mustConfig(t, adapt(t, caddyfileFor(testenv.FreePort(t), ""))))
			if err == nil {
				t.Fatal("validate succeeded")
			}
			if strings.Contains(err.Error(), "pw@") {
				t.Fatalf("error reveals the DSN: %v", err)
			}
		})
	}
}

func mustConfig(t *testing.T, raw []byte) *caddy.Config {
	var cfg caddy.Config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	return &cfg
}

// runCLITest runs `caddy wabarelay <args>` in process and returns its output lines.
func runCLITest(t *testing.T, args ...string) ([]map[string]any, error) {
	t.Helper()
	return testenv.RunCLI(t, caddycmd.Commands()["wabarelay"].CobraFunc, args...)
}

func TestCLI(t *testing.T) {
	srv := testenv.StartPostgres(t)
	dsn := srv.DSN("postgres")
	key := testenv.NewKey()
	t.Setenv("WABARELAY_DATABASE_URL", dsn)
	t.Setenv("WABARELAY_ENCRYPTION_KEY", base64.StdEncoding.EncodeToString(key))

	for i := 0; i < 2; i++ {
		out, err := runCLITest(t, "migrate")
		if err != nil || len(out) != 1 || out[0]["schema_version"] != out[0]["latest_version"] {
			t.Fatalf("migrate #%d: %v %v", i, out, err)
		}
	}
	out, err := runCLITest(t, "org", "create", "--name", "Acme")
	if err != nil || len(out) != 1 || out[0]["name"] != "Acme" {
		t.Fatalf("org create: %v %v", out, err)
	}
	orgID := out[0]["id"].(string)
	out, err = runCLITest(t, "apikey", "create", "--org", orgID, "--name", "ci", "--expires-in", "1h", "--database", dsn)
	if err != nil || len(out) != 1 {
		t.Fatalf("apikey create: %v %v", out, err)
	}
	apiKey, _ := out[0]["key"].(string)
	keyID := out[0]["id"].(string)
	if !strings.HasPrefix(apiKey, "crt_pk_") || out[0]["expires_at"] == nil || !strings.HasPrefix(apiKey, out[0]["prefix"].(string)) {
		t.Fatalf("apikey create output: %v", out[0])
	}
	if out, err := runCLITest(t, "apikey", "create", "--org", orgID); err != nil || len(out) != 1 {
		t.Fatalf("apikey create without a name: %v %v", out, err)
	}
	out, err = runCLITest(t, "apikey", "list", "--org", orgID)
	if err != nil || len(out) != 2 || out[0]["id"] != keyID {
		t.Fatalf("apikey list: %v %v", out, err)
	}
	for _, line := range out {
		if _, has := line["key"]; has || strings.Contains(fmt.Sprint(line), apiKey) {
			t.Fatalf("list shows a key: %v", line)
		}
	}

	f := testenv.NewStore(t, &testenv.StoreOpts{DSN: dsn, Key: key})
	st := f.Store
	if _, err := st.AuthenticateAPIKey(context.Background(), apiKey); err != nil {
		t.Fatalf("created key does not authenticate: %v", err)
	}
	out, err = runCLITest(t, "apikey", "revoke", "--id", keyID)
	if err != nil || out[0]["revoked_at"] == nil {
		t.Fatalf("revoke: %v %v", out, err)
	}
	if _, err := st.AuthenticateAPIKey(context.Background(), apiKey); err != store.ErrInvalidAPIKey {
		t.Fatalf("revoked key: %v", err)
	}

	orgUUID := uuid.MustParse(orgID)
	ch := f.Channel(t, orgUUID)
	out, err = runCLITest(t, "channel", "deactivate", "--id", ch.ID.String())
	if err != nil || out[0]["status"] != "inactive" || out[0]["inactive_reason"] != "operator" {
		t.Fatalf("deactivate: %v %v", out, err)
	}
	if strings.Contains(fmt.Sprint(out), ch.ChannelToken) {
		t.Fatal("deactivate prints the channel token")
	}

	// errors: exit with an error and print nothing
	for _, args := range [][]string{
		{"org", "create"},
		{"apikey", "create", "--org", "not-a-uuid"},
		{"apikey", "revoke", "--id", "00000000-0000-0000-0000-000000000000"},
		{"apikey", "create", "--org", orgID, "--expires-in", "soon"},
		{"channel", "deactivate", "--id", "00000000-0000-0000-0000-000000000000"},
	} {
		if out, err := runCLITest(t, args...); err == nil || len(out) != 0 {
			t.Errorf("%v: out %v err %v", args, out, err)
		}
	}
	t.Setenv("WABARELAY_DATABASE_URL", "")
	if _, err := runCLITest(t, "migrate"); err == nil || !strings.Contains(err.Error(), "WABARELAY_DATABASE_URL") {
		t.Fatalf("no database: %v", err)
	}
}
