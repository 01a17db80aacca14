package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// kindEvent is what a test reads of a delivered channel_status or template event.
type kindEvent struct {
	ID            uuid.UUID `json:"id"`
	Type          string    `json:"type"`
	ChannelID     uuid.UUID `json:"channel_id"`
	PhoneNumberID *string   `json:"phone_number_id"`
	Data          struct {
		store.ChannelStatusData
		Template json.RawMessage `json:"template"`
	} `json:"data"`
}

// distinctEvents returns the receiver's deliveries as events, one per event id, in the order
// they first arrived.
func distinctEvents(t *testing.T, rc *testenv.Receiver) []kindEvent {
	t.Helper()
	seen := map[uuid.UUID]bool{}
	var evs []kindEvent
	for _, d := range rc.Deliveries() {
		var e kindEvent
		if err := json.Unmarshal(d.Body, &e); err != nil {
			t.Fatalf("delivery %s: %v", d.Body, err)
		}
		if !seen[e.ID] {
			seen[e.ID] = true
			evs = append(evs, e)
		}
	}
	return evs
}

// TestChannelAndTemplateEvents (DESIGN §5b "Event kinds") at the HTTP boundary: a webhook
// subscribed to channel_status and message_template_status_update receives, signed:
// upstream_disconnected once after several concurrent relay sends met the upstream's 190; the
// operator's deactivation (CLI); one template event per channel of the business account for a
// signed template webhook post; and the deletion (management API), sent to the webhook that
// covered the channel when it was deleted.
func TestChannelAndTemplateEvents(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n retry_delays 200ms 200ms 200ms\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, testenv.CAFile(t, rc.Certificate()))
	site := "handle /webhooks/upstream {\n wabarelay_inbound\n}\nhandle_path /v1/* {\n wabarelay_api\n}"
	origin := e.caddyWith("", appExtra, site)

	ch := e.channelOn(true, pnid)
	ch2 := e.channelOn(true, pnid2)
	_, secret := e.fix.Webhook(t, e.org, rc.URL+"/hook", &testenv.WebhookOpts{Name: "ops",
		Events: []string{store.EventChannelStatus, store.EventTemplateStatus}, ChannelIDs: []uuid.UUID{ch.ID, ch2.ID}})
	rc.Verify(secret)
	// a messages-only webhook receives none of them
	other := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	e.fix.Webhook(t, e.org, other.URL+"/messages-only", &testenv.WebhookOpts{Events: []string{store.EventMessages}})

	// (both numbers share the upstream token: their health reads at connect are done first, so
	// that none of them meets the revoked token and disconnects ch2 before the operator does)
	testenv.Eventually(t, testenv.Patience, func() bool {
		return e.countRows(`SELECT count(*) FROM channel_health WHERE channel_id = ANY ($1) AND checked_at IS NOT NULL`,
			[]uuid.UUID{ch.ID, ch2.ID}) == 2
	}, "the health reads at connect")

	// 1. The token dies: concurrent sends all reach the upstream (it answers after 300 ms) and
	// all meet its 190; the channel's state changes once.
	e.fake.RevokeToken(realToken)
	e.fake.SetLatency(300 * time.Millisecond)
	before := len(e.fake.RequestsTo("POST", "/messages"))
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := call(t, "POST", origin+proxyPrefix+"/"+pnid+"/messages", ch.ChannelToken, textBody); r.status != 503 {
				t.Errorf("send with a dead token: %d %s", r.status, r.body)
			}
		}()
	}
	wg.Wait()
	e.fake.SetLatency(0)
	met190 := len(e.fake.RequestsTo("POST", "/messages")) - before
	t.Logf("%d concurrent sends met the 190", met190)
	if met190 < 2 {
		t.Fatalf("%d sends reached the upstream, want several", met190)
	}
	testenv.Eventually(t, testenv.Patience, func() bool { return len(distinctEvents(t, rc)) >= 1 }, "the disconnection delivered")

	// 2. The operator deactivates ch2 (CLI).
	if out, err := runCLI(t, "channel", "deactivate", "--id", ch2.ID.String(), "--database", e.dsn, "--encryption-key", e.keyB64); err != nil || len(out) != 1 || out[0]["status"] != "inactive" {
		t.Fatalf("deactivate: %v %v", out, err)
	}

	// 3. A signed template webhook of the business account: one event per channel of it.
	value := `{"event":"APPROVED","message_template_id":1689556908129832,"message_template_name":"order_confirmation","message_template_language":"en-US","reason":"NONE","message_template_category":"UTILITY"}`
	body := `{"entry":[{"id":"` + wabaID + `","time":1751247548,"changes":[{"value":` + value + `,"field":"message_template_status_update"}]}],"object":"whatsapp_business_account"}`
	if status, answer := signedPost(t, origin+"/webhooks/upstream", testAppSecret, body); status != 200 || answer != `{"duplicates":0,"events":2}`+"\n" {
		t.Fatalf("template webhook: %d %s", status, answer)
	}

	// 4. ch is deleted through the API (force: it is active).
	_, apiKey := e.fix.APIKey(t, e.org)
	req, _ := http.NewRequest("DELETE", origin+"/v1/channels/"+ch.ID.String()+"?force=true", nil)
	req.Header.Set("X-Api-Key", apiKey)
	if r := do(t, req); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}

	testenv.Eventually(t, testenv.Patience, func() bool { return len(distinctEvents(t, rc)) >= 5 && e.undelivered() == 0 },
		"every event delivered")
	type seen struct {
		typ                      string
		ch                       uuid.UUID
		previous, status, reason string
	}
	var got []seen
	templates := map[uuid.UUID]string{}
	for _, ev := range distinctEvents(t, rc) {
		pn := map[uuid.UUID]string{ch.ID: pnid, ch2.ID: pnid2}[ev.ChannelID]
		if ev.PhoneNumberID == nil || *ev.PhoneNumberID != pn {
			t.Errorf("event %s of channel %s: phone_number_id %v, want %s", ev.Type, ev.ChannelID, ev.PhoneNumberID, pn)
		}
		if ev.Type == store.EventTemplateStatus {
			templates[ev.ChannelID] = string(ev.Data.Template)
			continue
		}
		got = append(got, seen{ev.Type, ev.ChannelID, ev.Data.PreviousStatus, ev.Data.Status, ev.Data.Reason})
	}
	want := []seen{
		{"channel_status", ch.ID, "active", "upstream_disconnected", "upstream_token_invalid"},
		{"channel_status", ch2.ID, "active", "inactive", "operator"},
		{"channel_status", ch.ID, "upstream_disconnected", "deleted", "deleted"},
	}
	// deliveries of a webhook with ordering "none" go out in parallel: compare as sets
	sortSeen := func(s []seen) {
		slices.SortFunc(s, func(a, b seen) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	}
	sortSeen(got)
	sortSeen(want)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("channel_status events\n got %v\nwant %v", got, want)
	}
	if len(templates) != 2 || templates[ch.ID] != value || templates[ch2.ID] != value {
		t.Errorf("template events by channel: %v", templates)
	}
	if n := e.countRows(`SELECT count(*) FROM events WHERE channel_id = $1 AND type = 'channel_status'`, ch.ID); n != 3 {
		t.Errorf("%d channel_status events of ch stored, want 3 (connected, upstream_disconnected, deleted)", n)
	}
	if other.Count() != 0 {
		t.Errorf("the messages-only webhook got %d deliveries", other.Count())
	}
}
