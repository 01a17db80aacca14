package caddymodule

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestDemoCaddyfileDefaults: without the demo's variables the repo's Caddyfile keeps the
// production settings (the real SDK, messages from facebook.com only, no private targets, no
// extra CA); with them, the demo's.
func TestDemoCaddyfileDefaults(t *testing.T) {
	raw, err := os.ReadFile("../Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	type parsed struct {
		Apps struct {
			Wabarelay *App `json:"wabarelay"`
		} `json:"apps"`
	}
	read := func() (*App, string) {
		cfg := adapt(t, string(raw))
		var p parsed
		if err := json.Unmarshal(cfg, &p); err != nil || p.Apps.Wabarelay == nil {
			t.Fatalf("adapted: %v %s", err, cfg)
		}
		return p.Apps.Wabarelay, string(cfg)
	}
	// sdk_url, allow_private_targets and root_ca are {env.*} placeholders resolved when the
	// config loads (as Provision does here); origin_suffix is substituted at adapt time
	resolved := func(app *App) (sdk string, private bool, rootCA string) {
		repl := caddy.NewReplacer()
		sdk, _ = resolveSecret(repl, "sdk_url", app.Meta.SDKURL, false)
		if sdk == "" {
			sdk = DefaultSDKURL
		}
		private, err := app.Delivery.AllowPrivateTargets.resolve(repl, "allow_private_targets")
		if err != nil {
			t.Fatal(err)
		}
		rootCA, _ = resolveSecret(repl, "root_ca", app.Delivery.RootCA, false)
		return sdk, private, rootCA
	}
	for _, v := range []string{"WABARELAY_SDK_URL", "WABARELAY_CONNECT_ORIGIN_SUFFIX", "WABARELAY_ALLOW_PRIVATE_TARGETS", "WABARELAY_DELIVERY_ROOT_CA"} {
		t.Setenv(v, "") // restores the variable after the test
		if err := os.Unsetenv(v); err != nil {
			t.Fatal(err)
		}
	}
	app, cfg := read()
	if app.Meta == nil || app.Delivery == nil || !strings.Contains(cfg, `"origin_suffix":"facebook.com"`) {
		t.Fatalf("defaults: meta %+v delivery %+v\n%s", app.Meta, app.Delivery, cfg)
	}
	if sdk, private, ca := resolved(app); sdk != DefaultSDKURL || private || ca != "" {
		t.Fatalf("defaults: sdk_url %q, allow_private_targets %v, root_ca %q", sdk, private, ca)
	}

	t.Setenv("WABARELAY_SDK_URL", "http://127.0.0.1:8090/sdk.js")
	t.Setenv("WABARELAY_CONNECT_ORIGIN_SUFFIX", "localhost")
	t.Setenv("WABARELAY_ALLOW_PRIVATE_TARGETS", "true")
	t.Setenv("WABARELAY_DELIVERY_ROOT_CA", "/tmp/demo ca.pem")
	app, cfg = read()
	if !strings.Contains(cfg, `"origin_suffix":"localhost"`) {
		t.Fatalf("demo: %s", cfg)
	}
	if sdk, private, ca := resolved(app); sdk != "http://127.0.0.1:8090/sdk.js" || !private || ca != "/tmp/demo ca.pem" {
		t.Fatalf("demo: sdk_url %q, allow_private_targets %v, root_ca %q", sdk, private, ca)
	}
}

// TestDemoRelayOption: `demo { relay <url> }` is read from the Caddyfile (one argument), and
// the repo's Caddyfile leaves it to its default (proxy_url).
func TestDemoRelayOption(t *testing.T) {
	site := func(demo string) string {
		return "{\n\twabarelay {\n\t\tdatabase postgres://x\n\t}\n}\nhttp://localhost:8080 {\n\twabarelay_dashboard {\n\t\tdemo {\n" + demo + "\t\t}\n\t}\n}\n"
	}
	cfg := adapt(t, site("\t\t\tfake_upstream http://127.0.0.1:8090\n\t\t\trelay http://127.0.0.1:9/upstream-proxy\n"))
	if !strings.Contains(string(cfg), `"demo":{"fake_upstream":"http://127.0.0.1:8090","relay":"http://127.0.0.1:9/upstream-proxy"}`) {
		t.Fatalf("adapted: %s", cfg)
	}
	for _, bad := range []string{"\t\t\trelay\n", "\t\t\trelay a b\n"} {
		if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site(bad)), nil); err == nil {
			t.Errorf("%q: adapted", bad)
		}
	}
	raw, err := os.ReadFile("../Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "\t\t\t\trelay ") || !strings.Contains(string(raw), "proxy_url http://localhost:8080/upstream-proxy") {
		t.Fatal("the repo's Caddyfile should leave demo { relay } to its default, proxy_url")
	}
}
