package caddymodule

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestProxyPassesEveryLine: every line inside wabarelay_proxy other than its own reaches the
// reverse_proxy it expands to (as php_fastcgi passes its lines on); an unknown line is refused
// with its name, never dropped.
func TestProxyPassesEveryLine(t *testing.T) {
	cfg := adapt(t, `{
	wabarelay {
		database {env.DB}
		encryption_key {env.KEY}
	}
}
:8080 {
	wabarelay_proxy {
		rate_limit 50 1m
		flush_interval -1
		header_up X-A b
		transport http {
			read_timeout 5s
		}
	}
}`)
	var parsed struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []json.RawMessage `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(cfg, &parsed); err != nil {
		t.Fatal(err)
	}
	s := string(cfg)
	for _, want := range []string{`"flush_interval":-1`, `"X-A":["b"]`, `"read_timeout":5000000000`,
		`"requests":50`, `"response_header_timeout":30000000000`, `"tls":{}`, `"max_idle_conns_per_host":1024`} {
		if !strings.Contains(s, want) {
			t.Errorf("adapted config lacks %s:\n%s", want, s)
		}
	}

	_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(":8080 {\n\twabarelay_proxy {\n\t\tno_such_line 1\n\t}\n}"), nil)
	if err == nil || !strings.Contains(err.Error(), "no_such_line") {
		t.Fatalf("unknown line: err = %v, want it refused by name", err)
	}
}
