package caddymodule

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestHealthRefreshOption: `health_refresh` takes a positive duration or `off`, kept as written
// in the JSON config; anything else is refused by the adapter naming the option, and given as
// JSON, by Validate.
func TestHealthRefreshOption(t *testing.T) {
	cfg := func(line string) string {
		return "{\n\twabarelay {\n\t\tdatabase {env.DB}\n\t\t" + line + "\n\t}\n}\n:80 {\n\trespond ok\n}"
	}
	for _, v := range []string{"off", "30m", "6h"} {
		out := adapt(t, cfg("health_refresh "+v))
		var parsed struct {
			Apps struct {
				Wabarelay struct {
					HealthRefresh string `json:"health_refresh"`
				} `json:"wabarelay"`
			} `json:"apps"`
		}
		if err := json.Unmarshal(out, &parsed); err != nil || parsed.Apps.Wabarelay.HealthRefresh != v {
			t.Fatalf("health_refresh %s: adapted to %q (%v)", v, parsed.Apps.Wabarelay.HealthRefresh, err)
		}
		if err := (&App{HealthRefresh: v}).Validate(); err != nil {
			t.Fatalf("health_refresh %s: Validate: %v", v, err)
		}
	}
	for _, v := range []string{"soon", "0s", "-1h", "on", "", "6h 1h"} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg("health_refresh "+v)), nil)
		if err == nil || !strings.Contains(err.Error(), "health_refresh") && v != "" && v != "6h 1h" {
			t.Errorf("health_refresh %q: adapt error %v, want a refusal naming the option", v, err)
		}
		if v != "" && v != "6h 1h" {
			if err := (&App{HealthRefresh: v}).Validate(); err == nil || !strings.Contains(err.Error(), "health_refresh") {
				t.Errorf("health_refresh %q: Validate %v", v, err)
			}
		}
	}
}
