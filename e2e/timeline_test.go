package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// statusPost is an upstream post of one status of message wamid to the number pnid.
func statusPost(wamid, status string, ts int64) string {
	return `{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","changes":[{"field":"messages","value":` +
		`{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550100","phone_number_id":"` + pnid + `"},` +
		fmt.Sprintf(`"statuses":[{"id":%q,"status":%q,"timestamp":"%d","recipient_id":"15557654321"}]}}]}]}`, wamid, status, ts)
}

// timelineJSON is GET /messages/{wamid}'s answer, every field as sent.
type timelineJSON struct {
	WAMID      string           `json:"wamid"`
	ChannelID  string           `json:"channel_id"`
	Direction  string           `json:"direction"`
	To         *string          `json:"to"`
	From       *string          `json:"from"`
	Status     string           `json:"status"`
	Error      *json.RawMessage `json:"error"`
	RelayCall  *json.RawMessage `json:"relay_call"`
	Statuses   []map[string]any `json:"statuses"`
	Deliveries []struct {
		WebhookID string `json:"webhook_id"`
		EventID   string `json:"event_id"`
		Type      string `json:"type"`
		Status    string `json:"status"`
		Attempts  int    `json:"attempts"`
	} `json:"deliveries"`
}

// TestMessageTimelineThroughCaddy: the upstream posts a message's statuses out of order (read,
// then delivered, then sent) and an incoming message; two webhooks receive them. GET
// /v1/messages/{wamid} then shows the outgoing message read, its statuses in upstream order,
// and each status event delivered once to each webhook; the incoming message's timeline shows
// its sender and its two deliveries; another org's key gets 404; the channel's list shows the
// message.
func TestMessageTimelineThroughCaddy(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	rc1, rc2 := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true}), testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n retry_delays 200ms 200ms 200ms\n timeout 5s\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, testenv.CAFile(t, rc1.Certificate(), rc2.Certificate()))
	origin := e.caddyWith("", appExtra, "handle /webhooks/upstream {\n wabarelay_inbound\n}\nhandle_path /v1/* {\n wabarelay_api\n}")
	_, key := e.fix.APIKey(t, e.org)
	_, otherKey := e.fix.APIKey(t, e.fix.Org(t).ID)
	ch := e.channelOn(true, pnid)
	events := []string{"messages", "message_status"}
	w1, s1 := e.fix.Webhook(t, e.org, rc1.URL+"/one", &testenv.WebhookOpts{Name: "one", Events: events})
	w2, s2 := e.fix.Webhook(t, e.org, rc2.URL+"/two", &testenv.WebhookOpts{Name: "two", Events: events})
	rc1.Verify(s1)
	rc2.Verify(s2)

	const out = "wamid.HBgLMTU1NTc2NTQzMjEVAgARGBI/OUT+="
	for _, s := range []struct {
		status string
		ts     int64
	}{{"read", 1700000300}, {"delivered", 1700000200}, {"sent", 1700000100}} {
		if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, statusPost(out, s.status, s.ts)); status != 200 {
			t.Fatalf("inbound %s: %d %s", s.status, status, body)
		}
	}
	if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, conversationBatch([]string{"IN1"}, []string{"15551112222"})); status != 200 {
		t.Fatalf("inbound message: %d %s", status, body)
	}

	// every delivery delivered (each event once to each webhook)
	get := func(wamid, key string) (int, timelineJSON) {
		t.Helper()
		r := apiCall(t, "GET", origin+"/v1/messages/"+url.PathEscape(wamid), key, "")
		var tl timelineJSON
		if r.status == 200 {
			if err := json.Unmarshal(r.body, &tl); err != nil {
				t.Fatalf("timeline: %s", r.body)
			}
		}
		return r.status, tl
	}
	allDelivered := func(tl timelineJSON, n int) bool {
		if len(tl.Deliveries) != n {
			return false
		}
		for _, d := range tl.Deliveries {
			if d.Status != "delivered" {
				return false
			}
		}
		return true
	}
	var tl timelineJSON
	testenv.Eventually(t, time.Minute, func() bool {
		_, tl = get(out, key)
		return allDelivered(tl, 6)
	}, "the three status events delivered to both webhooks")

	if tl.WAMID != out || tl.ChannelID != ch.ID.String() || tl.Direction != "outgoing" || tl.Status != "read" || tl.Error != nil || tl.RelayCall != nil {
		t.Errorf("outgoing timeline: %+v", tl)
	}
	if tl.To == nil || *tl.To != "15557654321" || tl.From == nil || *tl.From != "+1 555 0100" {
		t.Errorf("to %v from %v", tl.To, tl.From)
	}
	var order []string
	for _, s := range tl.Statuses {
		order = append(order, fmt.Sprint(s["status"], "@", s["timestamp"], " ", s["error"]))
	}
	want := []string{"sent@2023-11-14T22:15:00.000Z <nil>", "delivered@2023-11-14T22:16:40.000Z <nil>", "read@2023-11-14T22:18:20.000Z <nil>"}
	if !slices.Equal(order, want) {
		t.Errorf("statuses:\n%v\nwant\n%v", order, want)
	}
	perWebhook := map[string][]string{}
	for _, d := range tl.Deliveries {
		if d.Type != "message_status" || d.Attempts != 1 {
			t.Errorf("delivery %+v", d)
		}
		perWebhook[d.WebhookID] = append(perWebhook[d.WebhookID], d.EventID)
	}
	got1, got2 := perWebhook[w1.ID.String()], perWebhook[w2.ID.String()]
	slices.Sort(got1)
	slices.Sort(got2)
	if len(perWebhook) != 2 || len(got1) != 3 || !slices.Equal(got1, got2) || len(slices.Compact(slices.Clone(got1))) != 3 {
		t.Errorf("deliveries per webhook: %v", perWebhook)
	}
	// the events the receivers got are the timeline's
	for _, id := range got1 {
		if rc1.PerEvent()[id] != 1 || rc2.PerEvent()[id] != 1 {
			t.Errorf("event %s: received %d and %d times", id, rc1.PerEvent()[id], rc2.PerEvent()[id])
		}
	}

	testenv.Eventually(t, time.Minute, func() bool {
		_, tl = get("wamid.IN1", key)
		return allDelivered(tl, 2)
	}, "the incoming message delivered to both webhooks")
	if tl.Direction != "incoming" || tl.Status != "received" || tl.From == nil || *tl.From != "15551112222" || tl.To == nil || *tl.To != "+1 555 0100" ||
		len(tl.Statuses) != 0 || tl.RelayCall != nil || tl.Deliveries[0].Type != "messages" || tl.Deliveries[0].WebhookID == tl.Deliveries[1].WebhookID {
		t.Errorf("incoming timeline: %+v", tl)
	}

	for _, c := range []struct{ wamid, key string }{{out, otherKey}, {"wamid.IN1", otherKey}, {"wamid.NONE", key}} {
		r := apiCall(t, "GET", origin+"/v1/messages/"+url.PathEscape(c.wamid), c.key, "")
		if r.status != 404 || strings.TrimSpace(string(r.body)) != `{"error":"Message not found"}` {
			t.Errorf("%s: %d %s", c.wamid, r.status, r.body)
		}
	}

	r := apiCall(t, "GET", origin+"/v1/channels/"+ch.ID.String()+"/messages?status=read", key, "")
	var list []map[string]any
	if r.status != 200 || json.Unmarshal(r.body, &list) != nil || len(list) != 1 || list[0]["wamid"] != out || list[0]["to"] != "15557654321" {
		t.Errorf("list: %d %s", r.status, r.body)
	}
	if r := apiCall(t, "GET", origin+"/v1/channels/"+ch.ID.String()+"/messages", otherKey, ""); r.status != 404 {
		t.Errorf("other org's list: %d %s", r.status, r.body)
	}
}
