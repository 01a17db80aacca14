package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

func TestInbound(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	origin := e.caddyWith("", fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}", testAppSecret, testVerifyToken),
		"handle /webhooks/upstream {\n wabarelay_inbound\n}")
	url := origin + "/webhooks/upstream"
	ctx := context.Background()

	// verification
	resp, err := http.Get(url + "?hub.mode=subscribe&hub.verify_token=" + testVerifyToken + "&hub.challenge=1158201444")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "1158201444" {
		t.Fatalf("verification: %d %q", resp.StatusCode, b)
	}
	resp, _ = http.Get(url + "?hub.mode=subscribe&hub.verify_token=wrong&hub.challenge=1")
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Fatalf("wrong verify token: %d", resp.StatusCode)
	}

	c1 := e.channelOn(true, pnid)
	c2 := e.channelOn(true, pnid2)
	orgB := e.fix.Org(t, &testenv.OrgOpts{Name: "B"})
	cB := e.fix.Channel(t, orgB.ID, &testenv.ChannelOpts{Name: "b",
		Connection: &store.Connection{PhoneNumberID: pnid3, WabaID: "w3", UpstreamToken: "t"}})
	hook := func(org uuid.UUID, events []string, chans ...uuid.UUID) uuid.UUID {
		w, _ := e.fix.Webhook(t, org, "https://h.example.com", &testenv.WebhookOpts{Events: events, ChannelIDs: chans})
		return w.ID
	}
	orgHook := hook(e.org, []string{"messages", "message_status"})
	statusHook := hook(e.org, []string{"message_status"})
	c2Hook := hook(e.org, []string{"messages", "message_status"}, c2.ID)
	bHook := hook(orgB.ID, []string{"messages", "message_status"})

	batch := upstreamBatch(map[string][2][]string{pnid: {{"a1", "a2", "a3"}, {"s1"}}, pnid2: {nil, {"s2"}}, "777": {{"x"}, nil}})
	// bad or missing signature: 401 and nothing stored
	for _, secret := range []string{"", "wrong-secret"} {
		if status, body := signedPost(t, url, secret, batch); status != 401 {
			t.Fatalf("signature %q: %d %s", secret, status, body)
		}
	}
	if n := e.upstreamEvents(); n != 0 {
		t.Fatalf("%d events stored from unsigned posts", n)
	}
	// 3 messages + 2 statuses (+1 message for an unknown number)
	status, body := signedPost(t, url, testAppSecret, batch)
	if status != 200 || !strings.Contains(body, `"events":5`) {
		t.Fatalf("batch: %d %s", status, body)
	}
	want := map[uuid.UUID]int{orgHook: 5, statusHook: 2, c2Hook: 1, bHook: 0}
	for id, n := range want {
		if got := e.countWhere("deliveries", "webhook_id", id); got != n {
			t.Errorf("webhook %v: %d deliveries, want %d", id, got, n)
		}
	}
	// the upstream re-sends: no new events or deliveries
	before := e.count("deliveries")
	if status, body := signedPost(t, url, testAppSecret, batch); status != 200 || !strings.Contains(body, `"duplicates":5`) {
		t.Fatalf("re-send: %d %s", status, body)
	}
	if after := e.count("deliveries"); after != before {
		t.Fatalf("re-send created %d deliveries", after-before)
	}
	// a medium received in an event is handed to its channel: the relay lets that channel (and
	// only it) fetch the medium; before the event it was out of scope
	const mediaID = "1040000000000001"
	e.fake.AddMedia(mediaID, pnid, "image/jpeg", []byte("jpeg"))
	proxy := origin + proxyPrefix
	expectRelayError(t, call(t, "GET", proxy+"/"+mediaID, c1.ChannelToken, ""), 403, "Path not allowed for this channel")
	image := `{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","changes":[{"field":"messages","value":{"messaging_product":"whatsapp",` +
		`"metadata":{"display_phone_number":"15550100","phone_number_id":"` + pnid + `"},"contacts":[{"profile":{"name":"Ann"},"wa_id":"15550001111"}],` +
		`"messages":[{"from":"15550001111","id":"wamid.img1","timestamp":"1700000002","type":"image","image":{"mime_type":"image/jpeg","sha256":"x","id":"` + mediaID + `"}}]}}]}]}`
	if status, body := signedPost(t, url, testAppSecret, image); status != 200 || !strings.Contains(body, `"events":1`) {
		t.Fatalf("image message: %d %s", status, body)
	}
	if r := call(t, "GET", proxy+"/"+mediaID, c1.ChannelToken, ""); r.status != 200 || !strings.Contains(string(r.body), mediaID) {
		t.Fatalf("received medium through the relay: %d %s", r.status, r.body)
	}
	if r := call(t, "GET", proxy+"/"+mediaID+"/download", c1.ChannelToken, ""); r.status != 200 || string(r.body) != "jpeg" ||
		r.header.Get("Content-Type") != "image/jpeg" {
		t.Fatalf("received medium downloaded through the relay: %d %s", r.status, r.body)
	}
	expectRelayError(t, call(t, "GET", proxy+"/"+mediaID, c2.ChannelToken, ""), 403, "Path not allowed for this channel")
	expectRelayError(t, call(t, "GET", proxy+"/"+mediaID+"/download", c2.ChannelToken, ""), 403, "Path not allowed for this channel")

	// signed but not a WhatsApp payload → 200 (counted as malformed, nothing stored); huge → 413
	if status, _ := signedPost(t, url, testAppSecret, `{"object":"page"}`); status != 200 {
		t.Fatalf("other object: %d", status)
	}
	if status, _ := signedPost(t, url, testAppSecret, `{"x":"`+strings.Repeat("a", 4<<20)+`"}`); status != 413 {
		t.Fatalf("huge body: %d", status)
	}
	// an account banned upstream deactivates its channels
	banned := `{"object":"whatsapp_business_account","entry":[{"id":"w3","time":1700000000,"changes":[{"field":"account_update","value":{"event":"ACCOUNT_BANNED"}}]}]}`
	if status, body := signedPost(t, url, testAppSecret, banned); status != 200 {
		t.Fatalf("account update: %d %s", status, body)
	}
	if c, _ := e.store.GetChannel(ctx, orgB.ID, cB.ID); c.Status != "inactive" {
		t.Fatalf("banned account's channel is %s", c.Status)
	}
	// a number removed upstream deactivates its channel (named by display number), and only it
	cR := e.fix.Channel(t, e.org, &testenv.ChannelOpts{Name: "r", Connection: &store.Connection{PhoneNumberID: "4444", WabaID: wabaID,
		DisplayPhoneNumber: "+1 555-0199", UpstreamToken: "t"}})
	removed := `{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","time":1700000000,"changes":[{"field":"account_update","value":{"event":"PHONE_NUMBER_REMOVED","phone_number":"15550199"}}]}]}`
	if status, body := signedPost(t, url, testAppSecret, removed); status != 200 {
		t.Fatalf("number removed: %d %s", status, body)
	}
	if c, _ := e.store.GetChannel(ctx, e.org, cR.ID); c.Status != "inactive" {
		t.Fatalf("removed number's channel is %s", c.Status)
	}
	if c, _ := e.store.GetChannel(ctx, e.org, c1.ID); c.Status != "active" {
		t.Fatalf("another number's channel is %s", c.Status)
	}
}

// TestInboundPostgresDown: while Postgres is unreachable the inbound handler answers 503 with
// Retry-After (the upstream then retries), never 200; once it is back, the same post is stored,
// once.
func TestInboundPostgresDown(t *testing.T) {
	t.Parallel()
	srv := testenv.StartPostgres(t)
	e := newRelayEnvOn(t, srv.CreateDB(t))
	origin := e.caddyWith("", fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}", testAppSecret, testVerifyToken),
		"handle /webhooks/upstream {\n wabarelay_inbound\n}")
	url := origin + "/webhooks/upstream"
	e.channelOn(true, pnid)
	e.fix.Webhook(t, e.org, "https://h.example.com")
	batch := upstreamBatch(map[string][2][]string{pnid: {{"d1", "d2"}, nil}})

	srv.Stop(t)
	if r := do(t, signedRequest(url, testAppSecret, batch)); r.status != 503 || r.header.Get("Retry-After") == "" {
		t.Fatalf("with Postgres down: %d %s (Retry-After %q), want 503 with Retry-After", r.status, r.body, r.header.Get("Retry-After"))
	}

	srv.Start(t)
	e.pool.Reset() // the test's own connections died with the server
	testenv.Eventually(t, 15*time.Second, func() bool {
		status, _ := signedPost(t, url, testAppSecret, batch)
		return status == 200
	}, "the post stored after Postgres is back")
	if n := e.upstreamEvents(); n != 2 {
		t.Fatalf("%d events stored after recovery, want 2", n)
	}
	if n := e.count("deliveries"); n != 2 {
		t.Fatalf("%d deliveries after recovery, want 2", n)
	}
}
