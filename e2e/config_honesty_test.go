package e2e

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// adapt adapts the Caddyfile caddyfile to Caddy's JSON.
func adapt(t *testing.T, caddyfile string) []byte {
	t.Helper()
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	return cfg
}

// caddyValidate runs `caddy validate` (testenv.RunCaddy) on the
// Caddyfile cfg with only env among the wabarelay settings of the environment, and returns its
// output and whether it succeeded.
func caddyValidate(t *testing.T, cfg string, env ...string) (string, bool) {
	t.Helper()
	return testenv.RunCaddy(t, cfg, env, []string{"WABARELAY_", "META_"}, "validate")
}

// validateEnv is a valid database and key for caddyValidate (validate dials nothing).
func validateEnv() []string {
	return []string{"WABARELAY_DATABASE_URL=postgres://u@127.0.0.1:1/x", "WABARELAY_ENCRYPTION_KEY=" + validateKey}
}

// validateKey is an encryption key (base64 of 32 bytes) for caddyValidate.
var validateKey = base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))

// honestyCaddyfile is a minimal Caddyfile with extra lines in the wabarelay option and the site.
func honestyCaddyfile(appExtra, siteExtra string) string {
	return fmt.Sprintf(`{
	admin off
	persist_config off
	wabarelay {
		database       {env.WABARELAY_DATABASE_URL}
		encryption_key {env.WABARELAY_ENCRYPTION_KEY}
		%s
	}
}
http://127.0.0.1:1 {
	handle_path /v1/* {
		wabarelay_api
	}
	%s
}
`, appExtra, siteExtra)
}

// TestValidateRunsStartChecks: `caddy validate` fails where `caddy run` would: a lease not
// longer than the (default) attempt timeout, with a message naming lease.
func TestValidateRunsStartChecks(t *testing.T) {
	t.Parallel()
	out, ok := caddyValidate(t, honestyCaddyfile("delivery {\n\t\t\tlease 5s\n\t\t}", ""), validateEnv()...)
	if ok || !strings.Contains(out, "lease") {
		t.Fatalf("validate of delivery { lease 5s }: ok=%v\n%s", ok, out)
	}
	out, ok = caddyValidate(t, honestyCaddyfile("delivery {\n\t\t\tlease 20s\n\t\t}", ""), validateEnv()...)
	if !ok {
		t.Fatalf("validate of delivery { lease 20s }:\n%s", out)
	}
	out, ok = caddyValidate(t, honestyCaddyfile("delivery {\n\t\t\troot_ca /nonexistent/ca.pem\n\t\t}", ""), validateEnv()...)
	if ok || !strings.Contains(out, "root_ca") {
		t.Fatalf("validate of a missing root_ca file: ok=%v\n%s", ok, out)
	}
}

// TestEmptyRedisPlaceholder: `redis {env.WABARELAY_REDIS_URL}` with the variable unset means no
// Redis (as the README's production Caddyfile promises: optional), and the start says so.
func TestEmptyRedisPlaceholder(t *testing.T) {
	t.Parallel()
	out, ok := caddyValidate(t, honestyCaddyfile("redis {env.WABARELAY_REDIS_URL}", ""), validateEnv()...)
	if !ok || !strings.Contains(out, "redis: not configured (WABARELAY_REDIS_URL empty); limits in memory") {
		t.Fatalf("validate with WABARELAY_REDIS_URL unset: ok=%v\n%s", ok, out)
	}
}

// TestMissingSettingNamed: a required setting from an unset variable is named, with its
// variable, rather than the global option being reported missing.
func TestMissingSettingNamed(t *testing.T) {
	t.Parallel()
	out, ok := caddyValidate(t, honestyCaddyfile("", ""), "WABARELAY_ENCRYPTION_KEY="+validateKey)
	if ok || !strings.Contains(out, "database") || !strings.Contains(out, "WABARELAY_DATABASE_URL") || strings.Contains(out, "not configured") {
		t.Fatalf("validate with WABARELAY_DATABASE_URL unset: ok=%v\n%s", ok, out)
	}
}

// TestTypedSwitches: allow_private_targets is a boolean (or an {env.*} placeholder resolved to
// one), logged as a warning whenever it is on, as is the dashboard's demo page; a value that is
// not a boolean is refused, so an environment variable cannot add configuration.
func TestTypedSwitches(t *testing.T) {
	t.Parallel()
	const (
		privateWarn = "delivery allow_private_targets is on"
		demoWarn    = "dashboard demo page is on"
	)
	cfg := honestyCaddyfile("delivery {\n\t\t\tallow_private_targets {env.WABARELAY_ALLOW_PRIVATE_TARGETS}\n\t\t}",
		"handle /dashboard* {\n\t\twabarelay_dashboard {\n\t\t\tdemo {\n\t\t\t\tfake_upstream {env.WABARELAY_DEMO_FAKE_UPSTREAM}\n\t\t\t}\n\t\t}\n\t}")
	out, ok := caddyValidate(t, cfg, append(validateEnv(), "WABARELAY_ALLOW_PRIVATE_TARGETS=true", "WABARELAY_DEMO_FAKE_UPSTREAM=http://127.0.0.1:8090")...)
	if !ok || !strings.Contains(out, privateWarn) || !strings.Contains(out, demoWarn) {
		t.Fatalf("switches on: ok=%v\n%s", ok, out)
	}
	out, ok = caddyValidate(t, cfg, validateEnv()...)
	if !ok || strings.Contains(out, privateWarn) || strings.Contains(out, demoWarn) {
		t.Fatalf("switches off: ok=%v\n%s", ok, out)
	}
	// the value the old splice took (a whole line) is no boolean
	out, ok = caddyValidate(t, cfg, append(validateEnv(), "WABARELAY_ALLOW_PRIVATE_TARGETS=allow_private_targets")...)
	if ok || !strings.Contains(out, "allow_private_targets") || !strings.Contains(out, "WABARELAY_ALLOW_PRIVATE_TARGETS") {
		t.Fatalf("switch set to a non-boolean: ok=%v\n%s", ok, out)
	}
	if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(honestyCaddyfile("delivery {\n\t\t\tallow_private_targets sometimes\n\t\t}", "")), nil); err == nil ||
		!strings.Contains(err.Error(), "allow_private_targets") {
		t.Fatalf("allow_private_targets sometimes: %v", err)
	}
}

// TestExampleCaddyfilesHonest: the repo's Caddyfile listens on loopback only and, like the
// README's production Caddyfile, bounds how long a client may take to send its headers and
// body; the README's Caddyfile validates with its optional variables unset.
func TestExampleCaddyfilesHonest(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, prod, ok := strings.Cut(string(readme), "## Production Caddyfile")
	if ok {
		_, prod, ok = strings.Cut(prod, "```caddyfile\n")
	}
	if ok {
		prod, _, ok = strings.Cut(prod, "```")
	}
	if !ok {
		t.Fatal("README: no production Caddyfile")
	}
	type server struct {
		Listen      []string `json:"listen"`
		ReadHeader  int64    `json:"read_header_timeout"`
		ReadTimeout int64    `json:"read_timeout"`
	}
	for name, file := range map[string]string{"repo Caddyfile": string(raw), "README Caddyfile": prod} {
		var parsed struct {
			Apps struct {
				HTTP struct {
					Servers map[string]server `json:"servers"`
				} `json:"http"`
			} `json:"apps"`
		}
		if err := json.Unmarshal(adapt(t, file), &parsed); err != nil || len(parsed.Apps.HTTP.Servers) == 0 {
			t.Fatalf("%s: %v", name, err)
		}
		for id, s := range parsed.Apps.HTTP.Servers {
			if s.ReadHeader <= 0 || time.Duration(s.ReadHeader) > 5*time.Second || s.ReadTimeout <= 0 || time.Duration(s.ReadTimeout) > 30*time.Second {
				t.Errorf("%s: server %s: read_header %v, read_body %v; want at most 5s and 30s", name, id, time.Duration(s.ReadHeader), time.Duration(s.ReadTimeout))
			}
			if name == "repo Caddyfile" {
				for _, l := range s.Listen {
					host, _, err := net.SplitHostPort(strings.TrimPrefix(l, "tcp/"))
					if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
						t.Errorf("repo Caddyfile: server %s listens on %q, not loopback only", id, l)
					}
				}
			}
		}
	}
	out, ok := caddyValidate(t, prod, validateEnv()...)
	if !ok || !strings.Contains(out, "redis: not configured (WABARELAY_REDIS_URL empty)") {
		t.Fatalf("README Caddyfile with WABARELAY_REDIS_URL unset: ok=%v\n%s", ok, out)
	}
}

// TestSlowInboundBodyCutOff: on the repo's Caddyfile (its read_body made 2s so the test is short),
// an inbound post whose body arrives a few bytes at a time is cut off within the read_body bound
// instead of holding its connection for as long as the client drips.
func TestSlowInboundBodyCutOff(t *testing.T) {
	t.Parallel()
	const bound = 2 * time.Second
	e := newRelayEnv(t)
	port := testenv.FreePort(t)
	host := strings.TrimPrefix(e.repoCaddy(port, func(cfg string) string {
		return strings.Replace(cfg, "read_body 30s", "read_body 2s", 1)
	}, e.metaAppEnv()...), "http://")

	conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	// at the end the answer is in hand: closing only frees the socket
	defer func() { _ = conn.Close() }()
	const size = 1000 // 100 drips of 10 bytes, 300 ms apart: 30 s if never cut off
	start := time.Now()
	if _, err := fmt.Fprintf(conn, "POST /webhooks/upstream HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", host, size); err != nil {
		t.Fatal(err)
	}
	answered := make(chan string, 1)
	go func() {
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			line = "connection closed: " + err.Error()
		}
		answered <- line
	}()
	drip := time.NewTicker(300 * time.Millisecond)
	defer drip.Stop()
	for sent := 0; ; {
		select {
		case line := <-answered:
			took := time.Since(start)
			t.Logf("after %v (%d of %d bytes sent): %q", took.Round(time.Millisecond), sent, size, strings.TrimSpace(line))
			// 5x the bound: the cut-off itself is the claim, not its precision
			if took > 5*bound {
				t.Fatalf("the dripping body held its connection %v (read_body %v)", took, bound)
			}
			// never acknowledged: the upstream must send it again
			if strings.HasPrefix(line, "HTTP/1.1 2") {
				t.Fatalf("a body cut off was answered %q", strings.TrimSpace(line))
			}
			return
		case <-drip.C:
			if sent < size {
				// A write fails once the relay has cut the connection off, which is what this
				// awaits: the reader above reports it.
				_, _ = conn.Write([]byte(strings.Repeat(" ", 10)))
				sent += 10
			}
			if time.Since(start) > 60*time.Second {
				t.Fatalf("the dripping body was not cut off in %v (read_body %v): %d bytes sent", time.Since(start), bound, sent)
			}
		}
	}
}
