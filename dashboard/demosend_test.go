package dashboard_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/dashboard"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

var demoBatchRe = regexp.MustCompile(`name="batch" value="([0-9a-f]+)"`)

// TestDemoSendButton: "Send 10 demo messages" is offered only with the relay's address; it calls
// {relay}/<phone_number_id>/messages with the channel's token, a text body and an idempotency key
// per message, and shows each refusal with the upstream's message and code; a relay that cannot
// be reached is reported once (502), never as a 500. The whole path through the real relay is
// caddymodule's TestDemoSendTimelines.
func TestDemoSendButton(t *testing.T) {
	// the fake upstream stands in for the relay here: it refuses the channel's token (190)
	fake := fakegraph.New()
	fake.Start()
	t.Cleanup(fake.Close)
	e := newEnv(t, func(o *dashboard.Options) {
		o.Demo = &dashboard.Demo{FakeUpstream: fake.URL(), Receiver: "https://127.0.0.1:1"}
	})
	conn := e.Connection()
	ch := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Support line", Connection: conn})
	c := e.client()
	c.signIn(e.key)

	// no relay configured: no button, and the action refuses
	a := c.get("/dashboard/demo")
	wantStatus(t, a, http.StatusOK, "address is not configured")
	if strings.Contains(a.body, "Send 10 demo messages</button>") {
		t.Fatal("the button is offered without a relay")
	}
	wantStatus(t, c.post("/dashboard/demo/send", url.Values{"phone_number_id": {conn.PhoneNumberID}, "batch": {"0123456789abcdef"}}),
		http.StatusConflict, "not configured")

	send := func(relay string) answer {
		t.Helper()
		e := newEnv(t, func(o *dashboard.Options) {
			o.Demo = &dashboard.Demo{FakeUpstream: fake.URL(), Receiver: "https://127.0.0.1:1", Relay: relay}
		})
		conn = e.Connection()
		ch = e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Support line", Connection: conn})
		c := e.client()
		c.signIn(e.key)
		a := c.get("/dashboard/demo")
		m := demoBatchRe.FindStringSubmatch(a.body)
		if m == nil || !strings.Contains(a.body, "Send 10 demo messages</button>") {
			t.Fatalf("no send form:\n%s", a.body)
		}
		// another org's or an unknown number, and a form without its batch: 422, nothing sent
		wantStatus(t, c.post("/dashboard/demo/send", url.Values{"phone_number_id": {"404"}, "batch": {m[1]}}),
			http.StatusUnprocessableEntity, "Pick one of your connected channels.")
		wantStatus(t, c.post("/dashboard/demo/send", url.Values{"phone_number_id": {conn.PhoneNumberID}, "batch": {"x"}}),
			http.StatusUnprocessableEntity, "Reload the page")
		return c.post("/dashboard/demo/send", url.Values{"phone_number_id": {conn.PhoneNumberID}, "batch": {m[1]}})
	}

	// every call refused upstream: the page says so per message, 502 overall
	a = send(fake.URL() + "/v26.0")
	wantStatus(t, a, http.StatusBadGateway, "accepted none", "0 of 10 accepted", "(code 190)")
	if n := strings.Count(a.body, "(code 190)"); n != 10 {
		t.Fatalf("%d refusals shown", n)
	}
	calls := fake.RequestsTo("POST", "/"+conn.PhoneNumberID+"/messages")
	if len(calls) != 10 {
		t.Fatalf("%d relay calls", len(calls))
	}
	for i, r := range calls {
		var b struct {
			To             string `json:"to"`
			Type           string `json:"type"`
			Text           struct{ Body string }
			IdempotencyKey string `json:"idempotency_key"`
		}
		if err := json.Unmarshal(r.Body, &b); err != nil || b.Type != "text" || b.Text.Body == "" ||
			!strings.HasPrefix(b.IdempotencyKey, "demo-") || !strings.HasSuffix(b.IdempotencyKey, fmt.Sprintf("-%02d", i+1)) ||
			r.Header.Get("Authorization") != "Bearer "+ch.ChannelToken {
			t.Fatalf("call %d: %s %v (%v)", i, r.Body, r.Header, err)
		}
		// the last goes to the made-up recipient the fake reports undeliverable, the others not
		if (b.To == fakegraph.UndeliverableRecipient) != (i == 9) || fakegraph.DefaultUndeliverable(b.To) != (i == 9) {
			t.Errorf("call %d to %s", i, b.To)
		}
	}

	// a relay that cannot be reached: reported once, not ten times
	a = send("http://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)))
	wantStatus(t, a, http.StatusBadGateway, "The relay cannot be reached")
	if n := strings.Count(a.body, "The relay cannot be reached at"); n != 1 {
		t.Fatalf("reported %d times", n)
	}
}
