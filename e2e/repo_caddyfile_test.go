package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/docs"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestRepoCaddyfileServesEverything: the repo's Caddyfile, as `make run` uses it with a Meta app
// (only its port changed, and the upstream pointed at the fake), serves every capability:
// management API, relay, connect link, the upstream's webhook endpoint (inbound) and the dashboard. (Without a Meta app,
// the demo: TestDemoRepoCaddyfile.)
func TestRepoCaddyfileServesEverything(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	origin := e.repoCaddy(testenv.FreePort(t), nil, e.metaAppEnv()...)

	// management API
	_, key := e.fix.APIKey(t, e.org, &testenv.APIKeyOpts{Name: "repo"})
	req, _ := http.NewRequest("POST", origin+"/v1/channels", strings.NewReader(`{"name":"Support"}`))
	req.Header.Set("x-api-key", key)
	req.Header.Set("Content-Type", "application/json")
	r := do(t, req)
	var ch struct {
		ID           string `json:"id"`
		ChannelToken string `json:"channel_token"`
		ConnectURL   string `json:"connect_url"`
	}
	if r.status != 201 || json.Unmarshal(r.body, &ch) != nil || !strings.HasPrefix(ch.ConnectURL, origin+"/connect/") {
		t.Fatalf("create channel: %d %s", r.status, r.body)
	}

	// the API's own OpenAPI document, without a key (docs/openapi.yaml as embedded)
	if r := call(t, "GET", origin+"/v1/openapi.yaml", "", ""); r.status != 200 || !bytes.Equal(r.body, docs.OpenAPI) ||
		r.header.Get("Content-Type") != "application/yaml" {
		t.Fatalf("openapi.yaml: %d %v, %d bytes", r.status, r.header, len(r.body))
	}

	// connect link: the token moves into a cookie, the page is served token-free
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(ch.ConnectURL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) == 0 {
		t.Fatalf("connect link: %d %v", resp.StatusCode, resp.Header)
	}
	// without the demo's settings (scripts/dev.sh sets them when no Meta app is configured) the
	// page loads Meta's SDK and takes signup messages from facebook.com only
	req, _ = http.NewRequest("GET", origin+"/connect/", nil)
	req.AddCookie(resp.Cookies()[0])
	r = do(t, req)
	if r.status != 200 || !strings.Contains(string(r.body), `data-sdk-url="https://connect.facebook.net/en_US/sdk.js"`) ||
		!strings.Contains(string(r.body), `data-origin-suffix="facebook.com"`) ||
		!strings.Contains(r.header.Get("Content-Security-Policy"), "script-src 'self' https://connect.facebook.net;") {
		t.Fatalf("connect page: %d %v\n%s", r.status, r.header, r.body)
	}

	// relay: once connected, a send goes through to the upstream
	if err := e.store.ConnectChannel(context.Background(), uuid.MustParse(ch.ID), store.Connection{PhoneNumberID: pnid, WabaID: wabaID,
		DisplayPhoneNumber: "+1 555 0100", UpstreamToken: realToken}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		return call(t, "POST", origin+"/upstream-proxy/"+pnid+"/messages", ch.ChannelToken, textBody).status == 200
	}, "a send through the connected channel")

	// inbound: the upstream's verification and a signed post of a message for the number
	r = call(t, "GET", origin+"/webhooks/upstream?hub.mode=subscribe&hub.verify_token=verify-me&hub.challenge=4242", "", "")
	if r.status != 200 || string(r.body) != "4242" {
		t.Fatalf("inbound verification: %d %s", r.status, r.body)
	}
	status, body := signedPost(t, origin+"/webhooks/upstream", "app-secret", upstreamBatch(map[string][2][]string{pnid: {{"repo1"}, nil}}))
	if status != 200 || e.upstreamEvents() != 1 {
		t.Fatalf("inbound post: %d %s, events stored %d", status, body, e.upstreamEvents())
	}

	// dashboard: the sign-in page, with its demo page off (no fake upstream configured)
	r = call(t, "GET", origin+"/dashboard/login", "", "")
	if r.status != 200 || !strings.Contains(string(r.body), "API key of your organization") ||
		!strings.Contains(r.header.Get("Content-Security-Policy"), "script-src 'self'") || strings.Contains(string(r.body), "/dashboard/demo") {
		t.Fatalf("dashboard: %d %v\n%s", r.status, r.header, r.body)
	}
}
