package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/wabarelay/wabarelay/internal/browsertest"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestDemoRepoCaddyfile: the demo from end to end on the repo's Caddyfile, without a browser:
// a channel created with the API, its connect link completed with what the demo SDK hands the
// page, a send through the relay reaching the fake with the signup's token, and an incoming
// message emitted by the fake stored and delivered to a webhook on this machine, with the
// send's "sent", "delivered" and "read" statuses.
func TestDemoRepoCaddyfile(t *testing.T) {
	t.Parallel()
	w := startDemo(t)

	r := w.api("POST", "/channels", `{"name":"Support line"}`)
	var ch demoChannel
	if r.status != 201 || json.Unmarshal(r.body, &ch) != nil || ch.Status != "pending" {
		t.Fatalf("create channel: %d %s", r.status, r.body)
	}

	// the connect page loads the fake's SDK, and its policy lets it
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar}
	resp, err := client.Get(ch.ConnectURL)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	csp := resp.Header.Get("Content-Security-Policy")
	if resp.StatusCode != 200 || !strings.Contains(string(page), `data-sdk-url="`+w.fake.URL()+`/sdk.js"`) ||
		!strings.Contains(string(page), `data-origin-suffix="localhost"`) || !strings.Contains(csp, "script-src 'self' "+w.fake.URL()+";") {
		t.Fatalf("connect page: %d, CSP %q\n%s", resp.StatusCode, csp, page)
	}

	// completion with what the SDK hands the page (as the page posts it)
	su := w.sdkSignup(w.fake.URL() + "/sdk.js")
	r = call(t, "POST", w.origin+"/connect/"+ch.ChannelToken, "",
		`{"code":"`+su.Code+`","phone_number_id":"`+su.PhoneNumberID+`","waba_id":"`+su.WabaID+`"}`)
	if r.status != 200 || json.Unmarshal(r.body, &ch) != nil || ch.Status != "active" || ch.PhoneNumberID == nil ||
		*ch.PhoneNumberID != su.PhoneNumberID || ch.DisplayPhoneNumber == nil || *ch.DisplayPhoneNumber != su.DisplayPhoneNumber {
		t.Fatalf("completion: %d %s", r.status, r.body)
	}
	if sub, _ := w.fake.Subscribed(su.WabaID); !sub {
		t.Fatal("the demo business account is not subscribed")
	}

	// a second channel connects its own number (a new fetch of the SDK)
	r = w.api("POST", "/channels", `{"name":"Sales line"}`)
	var ch2 demoChannel
	if r.status != 201 || json.Unmarshal(r.body, &ch2) != nil {
		t.Fatalf("create the second channel: %d %s", r.status, r.body)
	}
	su2 := w.sdkSignup(w.fake.URL() + "/sdk.js")
	r = call(t, "POST", w.origin+"/connect/"+ch2.ChannelToken, "",
		`{"code":"`+su2.Code+`","phone_number_id":"`+su2.PhoneNumberID+`","waba_id":"`+su2.WabaID+`"}`)
	if r.status != 200 || su2.PhoneNumberID == su.PhoneNumberID {
		t.Fatalf("second completion: %d %s", r.status, r.body)
	}

	// a webhook to the receiver on this machine
	r = w.api("POST", "/webhooks", `{"name":"demo receiver","url":"`+w.receiver+`","events":["messages","message_status"]}`)
	if r.status != 201 {
		t.Fatalf("create webhook: %d %s", r.status, r.body)
	}

	// a send through the relay reaches the fake with the upstream token of the first signup (the
	// fake answers 200 only to a token allowed for that number)
	r = call(t, "POST", w.origin+"/upstream-proxy/"+su.PhoneNumberID+"/messages", ch.ChannelToken,
		`{"messaging_product":"whatsapp","to":"16505551234","type":"text","text":{"body":"Hello from wabarelay"}}`)
	var sent struct {
		Messages []struct{ ID string } `json:"messages"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &sent) != nil || len(sent.Messages) != 1 {
		t.Fatalf("relay send: %d %s", r.status, r.body)
	}
	got := w.fake.RequestsTo("POST", "/"+su.PhoneNumberID+"/messages")
	if len(got) != 1 || !strings.HasPrefix(got[0].Header.Get("Authorization"), "Bearer EAAG") {
		t.Fatalf("the fake got %d sends (%v)", len(got), got)
	}
	// and the other channel's number stays out of its reach
	if r := call(t, "POST", w.origin+"/upstream-proxy/"+su2.PhoneNumberID+"/messages", ch.ChannelToken, `{}`); r.status != 403 {
		t.Fatalf("send to the other number: %d %s", r.status, r.body)
	}

	// an incoming message for the last number connected: stored, then delivered
	if err := w.fake.EmitMessage(context.Background(), w.origin+"/webhooks/upstream", demoAppSecret, su.PhoneNumberID, "", "Hello"); err != nil {
		t.Fatal(err)
	}
	if n := w.countWhere("events", "type", "messages"); n != 1 {
		t.Fatalf("%d message events stored", n)
	}
	want := map[string]bool{"messages": false, "sent": false, "delivered": false, "read": false}
	for !want["messages"] || !want["sent"] || !want["delivered"] || !want["read"] {
		b := w.nextDelivery(t)
		var ev struct {
			Type      string `json:"type"`
			ChannelID string `json:"channel_id"`
			Data      struct {
				Message struct {
					Text struct{ Body string } `json:"text"`
				} `json:"message"`
				Status struct {
					ID     string `json:"id"`
					Status string `json:"status"`
				} `json:"status"`
			} `json:"data"`
		}
		if err := json.Unmarshal(b, &ev); err != nil || ev.ChannelID != ch.ID {
			t.Fatalf("delivery %s", b)
		}
		switch {
		case ev.Type == "messages" && ev.Data.Message.Text.Body == "Hello":
			want["messages"] = true
		case ev.Type == "message_status" && ev.Data.Status.ID == sent.Messages[0].ID:
			want[ev.Data.Status.Status] = true
		default:
			t.Fatalf("unexpected delivery %s", b)
		}
	}

	// POST /_fake/inbound with no number names the last signup completed (the second one)
	r = call(t, "POST", w.fake.URL()+"/_fake/inbound", "", `{"text":"Hi sales"}`)
	if r.status != 200 || !strings.Contains(string(r.body), `"phone_number_id": "`+su2.PhoneNumberID+`"`) {
		t.Fatalf("_fake/inbound: %d %s", r.status, r.body)
	}
	if b := w.nextDelivery(t); !strings.Contains(string(b), `"channel_id":"`+ch2.ID+`"`) || !strings.Contains(string(b), "Hi sales") {
		t.Fatalf("delivery %s", b)
	}
}

// TestDemoDashboard: the demo through the dashboard on the repo's Caddyfile, as a newcomer
// clicks it (forms posted by a cookie-keeping client): sign in with the demo key, create a
// channel, connect it with what the demo SDK hands the page, create the demo webhook, press
// "Send an incoming message" — and the Demo page shows the message delivered to the fake's
// receiver with its signature verified against the webhook's secret.
func TestDemoDashboard(t *testing.T) {
	t.Parallel()
	w := startDemo(t)
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	csrfRe := regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	var csrf string
	send := func(method, path string, form url.Values) (int, string) {
		t.Helper()
		var body io.Reader
		if form != nil {
			form.Set("csrf", csrf)
			body = strings.NewReader(form.Encode())
		}
		req, _ := http.NewRequest(method, w.origin+path, body)
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if m := csrfRe.FindSubmatch(b); m != nil {
			csrf = string(m[1])
		}
		return resp.StatusCode, string(b)
	}
	send("GET", "/dashboard/login", nil)
	if st, b := send("POST", "/dashboard/login", url.Values{"api_key": {w.apiKey}}); st != 200 || !strings.Contains(b, ">Demo</a>") {
		t.Fatalf("sign-in: %d %.400s", st, b)
	}
	if st, b := send("POST", "/dashboard/channels", url.Values{"name": {"Support line"}}); st != 200 || !strings.Contains(b, "Channel created") {
		t.Fatalf("create channel: %d %.400s", st, b)
	}
	chans, err := w.store.ListChannels(context.Background(), w.org)
	if err != nil || len(chans) != 1 {
		t.Fatalf("channels: %v %v", chans, err)
	}
	su := w.sdkSignup(w.fake.URL() + "/sdk.js")
	if r := call(t, "POST", w.origin+"/connect/"+chans[0].ChannelToken, "",
		`{"code":"`+su.Code+`","phone_number_id":"`+su.PhoneNumberID+`","waba_id":"`+su.WabaID+`"}`); r.status != 200 {
		t.Fatalf("completion: %d %s", r.status, r.body)
	}
	if st, b := send("POST", "/dashboard/demo/webhook", url.Values{}); st != 201 || !strings.Contains(b, "Demo webhook created") {
		t.Fatalf("demo webhook: %d %.400s", st, b)
	}
	if st, b := send("POST", "/dashboard/demo/emit", url.Values{"phone_number_id": {su.PhoneNumberID}, "text": {"Hello from the test"}}); st != 200 ||
		!strings.Contains(b, "The fake upstream sent an incoming message") {
		t.Fatalf("emit: %d %.600s", st, b)
	}
	// The delivery is asynchronous: poll the Demo page (a condition, with a wide margin).
	testenv.Eventually(t, 60*time.Second, func() bool {
		st, b := send("GET", "/dashboard/demo", nil)
		if st != 200 {
			t.Fatalf("demo page: %d %.400s", st, b)
		}
		if strings.Contains(b, "not verified") {
			t.Fatalf("a delivery did not verify:\n%s", b)
		}
		return strings.Contains(b, "signature verified") && strings.Contains(b, "Hello from the test")
	}, "the Demo page to show the message verified")
}

// TestDemoBrowser: the newcomer's path of the demo in headless Chromium, on the repo's
// Caddyfile as `make run` runs it: sign in to the dashboard with the demo key, create a channel,
// open its connect link, click Connect WhatsApp and Connect in the stand-in's dialog (the number
// it made up is connected), send through the relay with the channel's token, create the demo
// webhook and press "Send an incoming message" on the Demo page — which then lists the message
// (and the send's statuses) as delivered with their signatures verified. A second link is
// cancelled in the dialog and its channel stays pending. No console error, no CSP violation;
// screenshots under artifacts/demo/.
func TestDemoBrowser(t *testing.T) {
	t.Parallel()
	browsertest.ChromiumPath(t)
	w := startDemo(t)
	p := browsertest.Start(t).NewPage(t)
	click := func(sel string) {
		t.Helper()
		p.Load(t, chromedp.Click(chromedp.CSS(sel)))
	}
	text := func(sel string) string {
		t.Helper()
		return browsertest.Run(t, p, chromedp.Text(chromedp.CSS(sel)))
	}

	p.Navigate(t, w.origin+"/dashboard/login")
	p.Do(t, chromedp.SendKeys(chromedp.ID("api_key"), w.apiKey))
	click(`form[action$="/login"] button[type=submit]`)
	p.Do(t, chromedp.SendKeys(chromedp.ID("channel-name"), "Support line"))
	click(`form[action$="/channels"] button[type=submit]`)
	link := browsertest.Run(t, p, chromedp.Value(chromedp.CSS(`.connect input`)))
	if !strings.HasPrefix(link, w.origin+"/connect/") {
		t.Fatalf("connect link %q", link)
	}

	// The connect page with the fake's stand-in SDK.
	p.Navigate(t, link)
	p.Do(t, chromedp.WaitVisible(chromedp.CSS(`#demo-sdk-notice`)))
	notice := text(`#demo-sdk-notice`)
	p.Do(t, chromedp.Click(chromedp.CSS(`#connect-button`)), chromedp.WaitVisible(chromedp.CSS(`#demo-sdk-dialog`)))
	dialog := text(`#demo-sdk-dialog`)
	p.Screenshot(t, "demo", "signup-dialog.png")
	p.Do(t, chromedp.Click(chromedp.CSS(`#demo-sdk-connect`)), chromedp.WaitVisible(chromedp.CSS(`#connect-app[data-state="success"]`)))
	status := text(`#status`)
	pnid := w.fake.LastSignup()
	if !strings.Contains(notice, "+1 555 0101") || !strings.Contains(dialog, "Connecting +1 555 0101") ||
		!strings.Contains(dialog, pnid) || !strings.Contains(status, "+1 555 0101 is now connected to Support line") {
		t.Fatalf("notice %q\ndialog %q\nstatus %q", notice, dialog, status)
	}

	// Back on the dashboard: the channel is active with that number.
	p.Navigate(t, w.origin+"/dashboard/channels")
	if card := text(`.channel`); !strings.Contains(card, "active") || !strings.Contains(card, pnid) {
		t.Fatalf("channel card after connecting: %q", card)
	}
	chans, err := w.store.ListChannels(context.Background(), w.org)
	if err != nil || len(chans) != 1 {
		t.Fatalf("channels: %v %v", chans, err)
	}

	// The Demo page: the demo webhook, a send through the relay, an incoming message.
	p.Navigate(t, w.origin+"/dashboard/demo")
	click(`form[action$="/demo/webhook"] button[type=submit]`)
	if r := call(t, "POST", w.origin+"/upstream-proxy/"+pnid+"/messages", chans[0].ChannelToken,
		`{"messaging_product":"whatsapp","to":"16505551234","type":"text","text":{"body":"Hello from wabarelay"}}`); r.status != 200 {
		t.Fatalf("relay send: %d %s", r.status, r.body)
	}
	p.Do(t, chromedp.SetValue(chromedp.ID("emit-text"), "Hello from the browser"))
	click(`form[action$="/demo/emit"] button[type=submit]`)
	// Deliveries are asynchronous: reload the page until the message is listed (a condition,
	// bounded by the kit's generous step timeout per reload and 60 s in all).
	deadline := time.Now().Add(60 * time.Second)
	for {
		list := text(`#got-h + p + ul, .deliveries`)
		body := browsertest.Eval[string](t, p, `document.body.innerText`)
		if strings.Contains(body, "not verified") {
			t.Fatalf("a delivery did not verify:\n%s", body)
		}
		if strings.Contains(body, "Hello from the browser") && strings.Count(body, "signature verified") >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the deliveries never all showed as verified:\n%s\n%s", list, body)
		}
		p.Navigate(t, w.origin+"/dashboard/demo")
	}
	p.Screenshot(t, "demo", "received-verified.png")

	// Cancel: another page load makes up another number; cancelling leaves the channel pending.
	r := w.api("POST", "/channels", `{"name":"Sales line"}`)
	var ch2 demoChannel
	if r.status != 201 || json.Unmarshal(r.body, &ch2) != nil {
		t.Fatalf("create channel: %d %s", r.status, r.body)
	}
	p.Navigate(t, ch2.ConnectURL)
	p.Do(t, chromedp.WaitVisible(chromedp.CSS(`#demo-sdk-notice`)))
	notice = text(`#demo-sdk-notice`)
	p.Do(t, chromedp.Click(chromedp.CSS(`#connect-button`)), chromedp.WaitVisible(chromedp.CSS(`#demo-sdk-cancel`)),
		chromedp.Click(chromedp.CSS(`#demo-sdk-cancel`)), chromedp.WaitVisible(chromedp.CSS(`#connect-app[data-state="cancelled"]`)))
	if status := text(`#status`); !strings.Contains(notice, "+1 555 0102") || !strings.Contains(status, "Phone number setup") {
		t.Fatalf("notice %q, status %q", notice, status)
	}
	if r := w.api("GET", "/channels/"+ch2.ID, ""); !strings.Contains(string(r.body), `"status":"pending"`) {
		t.Fatalf("channel after cancel: %s", r.body)
	}
	p.AssertNoConsoleErrors(t)
}
