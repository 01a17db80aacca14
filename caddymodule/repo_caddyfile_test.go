package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestRepoCaddyfileServesEverything: the repo's Caddyfile, as `make run` uses it (only its
// port changed, and the upstream pointed at the fake), serves all four capabilities:
// management API, relay, connect link and the upstream's webhook intake.
func TestRepoCaddyfileServesEverything(t *testing.T) {
	raw, err := os.ReadFile("../Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	e := newRelayEnv(t, "")
	port := testenv.FreePort(t)
	host := "localhost:" + strconv.Itoa(port)
	cfg := strings.ReplaceAll(string(raw), "localhost:8080", host)
	e.caddyFile(cfg, port,
		"WABARELAY_DATABASE_URL="+e.dsn, "WABARELAY_ENCRYPTION_KEY="+e.keyB64,
		"WABARELAY_UPSTREAM="+e.fake.URL()+"/v26.0",
		"META_APP_ID=app-1", "META_APP_SECRET=app-secret", "META_CONFIG_ID=cfg-1", "META_VERIFY_TOKEN=verify-me")
	origin := "http://" + host

	// management API
	_, key, err := e.store.CreateAPIKey(context.Background(), e.org, "repo", nil)
	if err != nil {
		t.Fatal(err)
	}
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

	// relay: once connected, a send goes through to the upstream
	if err := e.store.ConnectChannel(context.Background(), uuid.MustParse(ch.ID), store.Connection{PhoneNumberID: pnid, WabaID: wabaID,
		DisplayPhoneNumber: "+1 555 0100", UpstreamToken: realToken}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool {
		return call(t, "POST", origin+"/upstream-proxy/"+pnid+"/messages", ch.ChannelToken, textBody).status == 200
	})

	// intake: the upstream's verification and a signed post of a message for the number
	r = call(t, "GET", origin+"/webhooks/upstream?hub.mode=subscribe&hub.verify_token=verify-me&hub.challenge=4242", "", "")
	if r.status != 200 || string(r.body) != "4242" {
		t.Fatalf("intake verification: %d %s", r.status, r.body)
	}
	status, body := signedPost(t, origin+"/webhooks/upstream", "app-secret", upstreamBatch(map[string][2][]string{pnid: {{"repo1"}, nil}}))
	if status != 200 || e.count("events") != 1 {
		t.Fatalf("intake post: %d %s, events stored %d", status, body, e.count("events"))
	}
}
