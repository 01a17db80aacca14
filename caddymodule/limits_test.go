package caddymodule

import (
	"fmt"
	"strings"
	"testing"
)

// TestLimitsOption: the `limits` global option reaches the management API: at the configured
// caps, creations through Caddy are refused with 422 naming the limit.
// Not parallel: it loads Caddy in process, where one configuration runs at a time.
func TestLimitsOption(t *testing.T) {
	in := startInstance(t, "limits {\n\t\t\twebhooks_per_org 2\n\t\t\tapi_keys_per_org 2\n\t\t}")
	hook := `{"name":"w","url":"https://crm.example.com/h","events":["messages"]}`
	for i, want := range []int{201, 201, 422} {
		status, body, err := in.request("POST", "/v1/webhooks", hook)
		if err != nil || status != want {
			t.Fatalf("webhook %d: %d %s %v, want %d", i+1, status, body, err, want)
		}
		if want == 422 && !strings.Contains(string(body), "at most 2 webhooks (wabarelay limits webhooks_per_org)") {
			t.Fatalf("webhook %d: %s", i+1, body)
		}
	}
	// the org has its test key: one more reaches the cap of 2
	for i, want := range []int{201, 422} {
		status, body, err := in.request("POST", "/v1/api_keys", `{}`)
		if err != nil || status != want {
			t.Fatalf("api key %d: %d %s %v, want %d", i+2, status, body, err, want)
		}
		if want == 422 && !strings.Contains(string(body), fmt.Sprintf("at most %d API keys", 2)) {
			t.Fatalf("api key %d: %s", i+2, body)
		}
	}
}
