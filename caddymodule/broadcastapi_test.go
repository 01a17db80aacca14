package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/relay"
)

// TestManagementRelayLimit: the management API bounds a broadcast's rate_per_minute by the relay
// handler's limit per minute, read when a broadcast is created (a reload's relay handler
// registers after the app's provisioning): 0 without a relay handler (the API's default then).
func TestManagementRelayLimit(t *testing.T) {
	a := &App{logger: zap.NewNop()}
	limit := a.managementOptions().RelayLimitPerMinute
	if limit == nil {
		t.Fatal("RelayLimitPerMinute not set")
	}
	if n := limit(); n != 0 {
		t.Fatalf("no relay handler: %d", n)
	}
	a.registerRelay(&relay.Relay{}, 1000, time.Minute)
	if n := limit(); n != 1000 {
		t.Fatalf("relay limit 1000/min: the API reads %d", n)
	}
}

// TestBroadcastRateThroughCaddy: through Caddy, a broadcast's default rate is half the relay
// handler's rate_limit per minute and a rate above it is refused, naming the limit.
func TestBroadcastRateThroughCaddy(t *testing.T) {
	f := testenv.NewStore(t)
	org := f.Org(t)
	_, key := f.APIKey(t, org.ID)
	ch := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: f.Connection()})
	t.Setenv("WBR_TEST_DATABASE", f.DSN)
	t.Setenv("WBR_TEST_KEY", f.KeyB64)
	port := testenv.FreePort(t)
	if err := caddy.Load(adapt(t, fmt.Sprintf(`{
	admin off
	persist_config off
	wabarelay {
		database       {env.WBR_TEST_DATABASE}
		encryption_key {env.WBR_TEST_KEY}
		broadcasts {
			workers 0
		}
	}
}
http://127.0.0.1:%d {
	handle_path /v1/* {
		wabarelay_api
	}
	handle_path /upstream-proxy/* {
		wabarelay_proxy {
			rate_limit 300 30s
		}
	}
}`, port)), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	post := func(extra string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("POST", fmt.Sprintf("http://127.0.0.1:%d/v1/channels/%s/broadcasts", port, ch.ID), strings.NewReader(
			`{"name":"b","template":{"name":"hello_world","language":{"code":"en_US"}},"recipients":[{"to":"15550100"}]`+extra+`}`))
		req.Header.Set("X-Api-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	// 300 per 30 s: 600 a minute
	if status, b := post(""); status != 201 || b["rate_per_minute"] != float64(300) {
		t.Fatalf("default: %d %v", status, b)
	}
	if status, b := post(`,"rate_per_minute":600`); status != 201 || b["rate_per_minute"] != float64(600) {
		t.Fatalf("at the limit: %d %v", status, b)
	}
	if status, b := post(`,"rate_per_minute":601`); status != 422 || b["error"] != `"rate_per_minute" must be between 1 and 600` {
		t.Fatalf("over the limit: %d %v", status, b)
	}
}
