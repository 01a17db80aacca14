package dashboard_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/dashboard"
	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestDemoHealthButtons: "Lower this number's quality" has the fake upstream lower the number's
// quality to YELLOW and post a signed phone_number_quality_update for the number's business
// account (the health read then answers YELLOW); "Show a closed window" has it post a message
// from the lapsed customer whose upstream timestamp is 25 hours old, then sends that customer a
// text through the relay and links its message page. Both take only the org's connected
// numbers; the fake's refusal is shown with its reason (502), never as a 500. The whole path
// through the service (the badge, the closed window on the message page) is e2e's
// TestDemoHealthAndWindow.
func TestDemoHealthButtons(t *testing.T) {
	const secret = "demo-app-secret"
	hook := testenv.NewReceiver(t)
	fake := fakegraph.New(fakegraph.WithAppSecret(secret), fakegraph.WithCallback(hook.URL+"/webhooks/upstream"), fakegraph.WithStatusDelay(time.Hour))
	fake.Start()
	t.Cleanup(fake.Close)
	// a stand-in for the relay, which accepts every send (the real one is e2e's)
	relay := testenv.NewReceiver(t, &testenv.ReceiverOpts{Respond: func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"messaging_product":"whatsapp","contacts":[{"input":"16505550125","wa_id":"16505550125"}],"messages":[{"id":"wamid.demo-window"}]}`))
	}})
	e := newEnv(t, func(o *dashboard.Options) {
		o.Demo = &dashboard.Demo{FakeUpstream: fake.URL(), Receiver: "https://127.0.0.1:1", Relay: relay.URL}
	})
	conn := e.Connection()
	ch := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Support line", Connection: conn})
	fake.AddNumber(conn.PhoneNumberID, conn.WabaID, "+1 555 0100", "Support")
	fake.AddToken("EAAtoken", []string{conn.PhoneNumberID}, []string{conn.WabaID})
	// a connected number the fake does not know: its refusal names the reason
	unknown := e.Connection()
	e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Other line", Connection: unknown})
	c := e.client()
	c.signIn(e.key)

	a := c.get("/dashboard/demo")
	wantStatus(t, a, http.StatusOK, "Lower this number's quality</button>", "Show a closed window</button>", "+16505550125")
	m := demoBatchRe.FindStringSubmatch(a.body)
	if m == nil {
		t.Fatalf("no batch:\n%s", a.body)
	}

	// bad input: 4xx, nothing posted
	wantStatus(t, c.post("/dashboard/demo/quality", url.Values{"phone_number_id": {"404"}}), http.StatusUnprocessableEntity, "Pick one of your connected channels.")
	wantStatus(t, c.post("/dashboard/demo/window", url.Values{"phone_number_id": {"404"}, "batch": {m[1]}}), http.StatusUnprocessableEntity, "Pick one of your connected channels.")
	wantStatus(t, c.post("/dashboard/demo/window", url.Values{"phone_number_id": {conn.PhoneNumberID}}), http.StatusUnprocessableEntity, "Reload the page")
	wantStatus(t, c.post("/dashboard/demo/quality", url.Values{"phone_number_id": {unknown.PhoneNumberID}}), http.StatusBadGateway,
		"did not post the quality update: fake upstream answered 400: unknown phone_number_id "+unknown.PhoneNumberID)
	if hook.Count() != 0 {
		t.Fatalf("%d posts after bad input", hook.Count())
	}

	// the quality
	a = c.post("/dashboard/demo/quality", url.Values{"phone_number_id": {conn.PhoneNumberID}})
	wantStatus(t, a, http.StatusOK, "lowered the number&#39;s quality to YELLOW")
	p := hook.WaitN(t, 1)[0]
	batch, err := inbound.Parse(p.Body)
	if err != nil || len(batch.Accounts) != 1 || batch.Accounts[0].Field != "phone_number_quality_update" || batch.Accounts[0].WabaID != conn.WabaID ||
		!inbound.VerifySignature(secret, p.Body, p.Header.Get("X-Hub-Signature-256")) {
		t.Fatalf("quality webhook %s: %+v %v", p.Body, batch, err)
	}
	req, _ := http.NewRequest("GET", fake.URL()+"/v26.0/"+conn.PhoneNumberID+"?fields=quality_rating", nil)
	req.Header.Set("Authorization", "Bearer EAAtoken")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		QualityRating string `json:"quality_rating"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if h.QualityRating != "YELLOW" {
		t.Fatalf("the health read after it: %q", h.QualityRating)
	}

	// the window
	before := time.Now().Add(-25 * time.Hour).Unix()
	a = c.post("/dashboard/demo/window", url.Values{"phone_number_id": {conn.PhoneNumberID}, "batch": {m[1]}})
	wantStatus(t, a, http.StatusOK, "last wrote 25h ago", "1 of 1 accepted for Support line", `href="/dashboard/messages/wamid.demo-window"`)
	p = hook.WaitN(t, 2)[1]
	batch, err = inbound.Parse(p.Body)
	if err != nil || len(batch.Items) != 1 {
		t.Fatalf("inbound webhook %s: %v", p.Body, err)
	}
	var d struct {
		Message struct{ From, Timestamp string }
	}
	_ = json.Unmarshal(batch.Items[0].Data, &d)
	ts, _ := strconv.ParseInt(d.Message.Timestamp, 10, 64)
	if d.Message.From != "16505550125" || ts < before || ts > time.Now().Add(-25*time.Hour).Unix() {
		t.Fatalf("the lapsed customer's message: from %s at %s (want about %d)", d.Message.From, d.Message.Timestamp, before)
	}
	sends := relay.Deliveries()
	if len(sends) != 1 || sends[0].Path != "/"+conn.PhoneNumberID+"/messages" {
		t.Fatalf("%d sends: %+v", len(sends), sends)
	}
	var b struct {
		To             string `json:"to"`
		IdempotencyKey string `json:"idempotency_key"`
	}
	if err := json.Unmarshal(sends[0].Body, &b); err != nil || b.To != "16505550125" || b.IdempotencyKey != "demo-window-"+m[1] ||
		sends[0].Header.Get("Authorization") != "Bearer "+ch.ChannelToken {
		t.Fatalf("send %s %v", sends[0].Body, sends[0].Header)
	}
	if !strings.Contains(a.body, "its message page shows the window") {
		t.Fatalf("no pointer to the message page:\n%s", a.body)
	}
}
