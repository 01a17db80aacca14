package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestNumberHealth (DESIGN §5c "Number health") at the HTTP boundary: a connected channel's
// health is filled from the upstream with no event; a phone_number_quality_update posted twice
// to the inbound endpoint yields one more upstream read, the new quality on GET
// /v1/channels/{id}, and one channel_health event, signed, at the webhook subscribed to it.
func TestNumberHealth(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, testenv.CAFile(t, rc.Certificate()))
	site := "handle /webhooks/upstream {\n wabarelay_inbound\n}\nhandle_path /v1/* {\n wabarelay_api\n}"
	origin := e.caddyWith("", appExtra, site)
	ch := e.channelOn(true, pnid)
	_, secret := e.fix.Webhook(t, e.org, rc.URL+"/hook", &testenv.WebhookOpts{Events: []string{store.EventChannelHealth}, ChannelIDs: []uuid.UUID{ch.ID}})
	rc.Verify(secret)
	_, key := e.fix.APIKey(t, e.org)

	health := func() map[string]*string {
		t.Helper()
		r := apiCall(t, "GET", origin+"/v1/channels/"+ch.ID.String(), key, "")
		var c struct {
			Health map[string]*string `json:"health"`
		}
		if r.status != 200 || json.Unmarshal(r.body, &c) != nil {
			t.Fatalf("GET channel: %d %s", r.status, r.body)
		}
		return c.Health
	}
	// waiting reads the store (polling the API would meet its rate limit); the API is read once
	// the value is there
	quality := func() string {
		c, err := e.store.GetChannel(context.Background(), e.org, ch.ID)
		if err != nil {
			t.Fatal(err)
		}
		if q := c.Health.QualityRating; q != nil {
			return *q
		}
		return ""
	}
	testenv.Eventually(t, testenv.Patience, func() bool { return quality() == "GREEN" }, "the health read at connect")
	if h := health(); h["checked_at"] == nil || h["messaging_limit"] == nil || *h["messaging_limit"] != "TIER_2K" {
		t.Fatalf("health after connect %v", h)
	}

	e.fake.SetNumberHealth(pnid, fakegraph.NumberHealth{QualityRating: "YELLOW"})
	post := `{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","time":1744823932,"changes":[{"field":"phone_number_quality_update",` +
		`"value":{"display_phone_number":"15550100","event":"FLAGGED","current_limit":"TIER_2K"}}]}]}`
	for range 2 {
		if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, post); status != 200 {
			t.Fatalf("inbound: %d %s", status, body)
		}
	}
	testenv.DueHealthReads(t, e.fix.Pool) // (the two webhooks joined one read, due 30 s after the first)
	testenv.Eventually(t, testenv.Patience, func() bool { return quality() == "YELLOW" }, "the read after the webhooks")
	if h := health(); h["quality_rating"] == nil || *h["quality_rating"] != "YELLOW" {
		t.Fatalf("GET /v1/channels/{id} health %v", h)
	}
	ds := rc.WaitN(t, 1)
	var ev struct {
		Type string `json:"type"`
		Data struct {
			Changed  []string        `json:"changed"`
			Upstream json.RawMessage `json:"upstream"`
		} `json:"data"`
	}
	if err := json.Unmarshal(ds[0].Body, &ev); err != nil || ev.Type != "channel_health" || !slices.Equal(ev.Data.Changed, []string{"quality_rating"}) ||
		string(ev.Data.Upstream) != `{"field":"phone_number_quality_update","value":{"display_phone_number":"15550100","event":"FLAGGED","current_limit":"TIER_2K"}}` {
		t.Fatalf("delivery %s (%v)", ds[0].Body, err)
	}
	// the metric counts the channel under its new rating
	testenv.Eventually(t, testenv.Patience, func() bool {
		r := apiCall(t, "GET", origin+"/metrics", "", "")
		return strings.Contains(string(r.body), `caddy_wabarelay_channels_by_quality{quality_rating="YELLOW"} 1`) &&
			!strings.Contains(string(r.body), `caddy_wabarelay_channels_by_quality{quality_rating="GREEN"}`)
	}, "caddy_wabarelay_channels_by_quality{quality_rating=\"YELLOW\"} 1")
	if n := e.fake.HealthReads(pnid); n != 2 {
		t.Fatalf("upstream health reads: %d, want 2 (connect, and one for both webhooks)", n)
	}
	if n := len(rc.Deliveries()); n != 1 {
		t.Fatalf("%d deliveries, want one channel_health event", n)
	}
}
