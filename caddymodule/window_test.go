package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestWindowGuardOption: wabarelay_proxy { window_guard annotate|enforce|off } adapts to the
// relay handler's window_guard (left out when not given: the default), and anything else is
// refused by name.
func TestWindowGuardOption(t *testing.T) {
	site := func(line string) string {
		return "{\n\twabarelay {\n\t\tdatabase {env.DB}\n\t\tencryption_key {env.KEY}\n\t}\n}\n:8080 {\n\twabarelay_proxy {\n\t\t" + line + "\n\t}\n}"
	}
	for _, mode := range []string{"annotate", "enforce", "off"} {
		if cfg := string(adapt(t, site("window_guard "+mode))); !strings.Contains(cfg, `"window_guard":"`+mode+`"`) {
			t.Errorf("window_guard %s: adapted to\n%s", mode, cfg)
		}
	}
	if cfg := string(adapt(t, site("rate_limit 50"))); strings.Contains(cfg, "window_guard") {
		t.Errorf("no window_guard given: adapted to\n%s", cfg)
	}
	for _, bad := range []string{"window_guard", "window_guard strict", "window_guard enforce now", `window_guard ""`} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site(bad)), nil)
		if err == nil || !strings.Contains(err.Error(), "window_guard") && !strings.Contains(err.Error(), "argument") {
			t.Errorf("%s: err = %v, want it refused", bad, err)
		}
	}
}
