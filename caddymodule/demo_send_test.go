package caddymodule

import (
	"context"
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// dashboardClient is a signed-in dashboard session on the demo's Caddy (a cookie-keeping client
// posting forms as the browser does).
type dashboardClient struct {
	t      *testing.T
	origin string
	http   *http.Client
}

func (w *demoWorld) signIn(t *testing.T) *dashboardClient {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &dashboardClient{t: t, origin: w.origin, http: &http.Client{Jar: jar, Timeout: 60 * time.Second}}
	if st, b := c.do("POST", "/dashboard/login", url.Values{"api_key": {w.apiKey}}); st != 200 || !strings.Contains(b, ">Demo</a>") {
		t.Fatalf("sign-in: %d %.400s", st, b)
	}
	return c
}

// do sends a request (a form post when form is set) and returns the status and the page.
func (c *dashboardClient) do(method, path string, form url.Values) (int, string) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, c.origin+path, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// connectChannel creates a channel through the API and connects a number the demo SDK made up.
func (w *demoWorld) connectChannel(t *testing.T, name string) (demoChannel, fakegraph.Signup) {
	t.Helper()
	r := w.api("POST", "/channels", `{"name":"`+name+`"}`)
	var ch demoChannel
	if r.status != 201 || json.Unmarshal(r.body, &ch) != nil {
		t.Fatalf("create channel: %d %s", r.status, r.body)
	}
	su := w.sdkSignup(w.fake.URL() + "/sdk.js")
	if r := call(t, "POST", w.origin+"/connect/"+ch.ChannelToken, "",
		`{"code":"`+su.Code+`","phone_number_id":"`+su.PhoneNumberID+`","waba_id":"`+su.WabaID+`"}`); r.status != 200 {
		t.Fatalf("completion: %d %s", r.status, r.body)
	}
	return ch, su
}

var (
	batchRe       = regexp.MustCompile(`name="batch" value="([0-9a-f]+)"`)
	messageLinkRe = regexp.MustCompile(`href="/dashboard/messages/([^"]+)"`)
)

// TestDemoSendTimelines: on the repo's Caddyfile as `make run` runs the demo, the Demo page's
// "Send 10 demo messages" makes 10 relay calls (the relay's address defaults to proxy_url) with
// the channel's token and an idempotency key each; the fake upstream accepts all ten and posts
// sent, delivered and read for nine of them and a failed status with error 131026 for the one to
// the made-up recipient, all stored by the service's inbound endpoint; the page links each wamid
// to its message page. Posting the same form again sends nothing twice (replayed), and bad
// input is refused with a 4xx.
func TestDemoSendTimelines(t *testing.T) {
	w := startDemo(t)
	ch, su := w.connectChannel(t, "Support line")
	c := w.signIn(t)

	st, page := c.do("GET", "/dashboard/demo", nil)
	m := batchRe.FindStringSubmatch(page)
	if st != 200 || m == nil || !strings.Contains(page, "Send 10 demo messages") || !strings.Contains(page, w.origin+"/upstream-proxy") {
		t.Fatalf("demo page: %d %.2000s", st, page)
	}
	form := url.Values{"phone_number_id": {su.PhoneNumberID}, "batch": {m[1]}}
	st, page = c.do("POST", "/dashboard/demo/send", form)
	if st != 200 || !strings.Contains(page, "10 of 10 accepted for Support line") {
		t.Fatalf("send: %d %.3000s", st, page)
	}

	// ten relay calls reached the fake, with the upstream token, without the idempotency key
	calls := w.fake.RequestsTo("POST", "/"+su.PhoneNumberID+"/messages")
	if len(calls) != 10 {
		t.Fatalf("the fake got %d sends", len(calls))
	}
	var recipients []string
	for _, r := range calls {
		var b map[string]any
		if err := json.Unmarshal(r.Body, &b); err != nil || b["type"] != "text" || b["idempotency_key"] != nil ||
			!strings.HasPrefix(r.Header.Get("Authorization"), "Bearer EAAG") {
			t.Fatalf("send %s (%v)", r.Body, err)
		}
		recipients = append(recipients, b["to"].(string))
	}
	if distinct := slices.Compact(slices.Sorted(slices.Values(recipients))); len(distinct) != 10 ||
		!slices.Contains(recipients, fakegraph.UndeliverableRecipient) {
		t.Fatalf("recipients %v: want 10 distinct, one of them %s", recipients, fakegraph.UndeliverableRecipient)
	}

	// the page links each wamid to its message page
	var pageWAMIDs []string
	for _, l := range messageLinkRe.FindAllStringSubmatch(page, -1) {
		wamid, err := url.PathUnescape(html.UnescapeString(l[1]))
		if err != nil || !strings.HasPrefix(wamid, "wamid.") {
			t.Fatalf("link %q: %v", l[1], err)
		}
		pageWAMIDs = append(pageWAMIDs, wamid)
	}
	if len(pageWAMIDs) != 10 {
		t.Fatalf("%d message links on the page:\n%.3000s", len(pageWAMIDs), page)
	}

	// the statuses the fake posted, stored as events: 9 × sent, delivered, read and 1 × failed
	testenv.Eventually(t, testenv.Patience, func() bool {
		return w.countWhere("events", "type", "message_status") >= 28
	}, "28 status events stored")
	rows, err := w.pool.Query(context.Background(), `SELECT payload FROM events WHERE type = 'message_status' AND channel_id = $1`, ch.ID)
	if err != nil {
		t.Fatal(err)
	}
	statuses := map[string][]string{} // wamid → statuses
	failedCode := map[string]float64{}
	n := 0
	for rows.Next() {
		var payload []byte
		if err := rows.Scan(&payload); err != nil {
			t.Fatal(err)
		}
		var ev struct {
			Data struct {
				Status struct {
					ID          string `json:"id"`
					Status      string `json:"status"`
					RecipientID string `json:"recipient_id"`
					Errors      []struct {
						Code  float64 `json:"code"`
						Title string  `json:"title"`
					} `json:"errors"`
				} `json:"status"`
			} `json:"data"`
		}
		if err := json.Unmarshal(payload, &ev); err != nil {
			t.Fatal(err)
		}
		s := ev.Data.Status
		statuses[s.ID] = append(statuses[s.ID], s.Status)
		if s.Status == "failed" {
			if len(s.Errors) != 1 || s.Errors[0].Title != "Message undeliverable" || s.RecipientID != fakegraph.UndeliverableRecipient {
				t.Fatalf("failed status %s", payload)
			}
			failedCode[s.ID] = s.Errors[0].Code
		}
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 28 || len(statuses) != 10 || len(failedCode) != 1 {
		t.Fatalf("%d status events for %d messages, %d failed: %v", n, len(statuses), len(failedCode), statuses)
	}
	for _, wamid := range pageWAMIDs {
		got := slices.Sorted(slices.Values(statuses[wamid]))
		if code, failed := failedCode[wamid]; failed {
			if code != fakegraph.CodeUndeliverable || !slices.Equal(got, []string{"failed"}) {
				t.Fatalf("the undeliverable message %s: %v, code %v", wamid, got, code)
			}
		} else if !slices.Equal(got, []string{"delivered", "read", "sent"}) {
			t.Fatalf("message %s: %v", wamid, got)
		}
	}

	// the same form again: every call replayed from the idempotency store, nothing re-sent
	st, page = c.do("POST", "/dashboard/demo/send", form)
	if st != 200 || !strings.Contains(page, "10 of 10 accepted") || strings.Count(page, ">replayed<") != 10 {
		t.Fatalf("re-post: %d %.3000s", st, page)
	}
	if n := len(w.fake.RequestsTo("POST", "/"+su.PhoneNumberID+"/messages")); n != 10 {
		t.Fatalf("the re-post reached the fake: %d sends", n)
	}

	// bad input: 4xx with a message, nothing sent
	for _, tc := range []struct {
		form url.Values
		want string
	}{
		{url.Values{"phone_number_id": {su.PhoneNumberID}, "batch": {"nope"}}, "Reload the page"},
		{url.Values{"phone_number_id": {su.PhoneNumberID}}, "Reload the page"},
		{url.Values{"phone_number_id": {"404"}, "batch": {m[1]}}, "Pick one of your connected channels."},
	} {
		if st, page := c.do("POST", "/dashboard/demo/send", tc.form); st != http.StatusUnprocessableEntity || !strings.Contains(page, tc.want) {
			t.Errorf("%v: %d %.600s", tc.form, st, page)
		}
	}
	if n := len(w.fake.RequestsTo("POST", "/messages")); n != 10 {
		t.Fatalf("refused forms reached the fake: %d sends", n)
	}
}

// TestDemoRelayOption: `demo { relay <url> }` is read from the Caddyfile (one argument), and
// the repo's Caddyfile leaves it to its default (proxy_url).
func TestDemoRelayOption(t *testing.T) {
	site := func(demo string) string {
		return "{\n\twabarelay {\n\t\tdatabase postgres://x\n\t}\n}\nhttp://localhost:8080 {\n\twabarelay_dashboard {\n\t\tdemo {\n" + demo + "\t\t}\n\t}\n}\n"
	}
	cfg := adapt(t, site("\t\t\tfake_upstream http://127.0.0.1:8090\n\t\t\trelay http://127.0.0.1:9/upstream-proxy\n"))
	if !strings.Contains(string(cfg), `"demo":{"fake_upstream":"http://127.0.0.1:8090","relay":"http://127.0.0.1:9/upstream-proxy"}`) {
		t.Fatalf("adapted: %s", cfg)
	}
	for _, bad := range []string{"\t\t\trelay\n", "\t\t\trelay a b\n"} {
		if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site(bad)), nil); err == nil {
			t.Errorf("%q: adapted", bad)
		}
	}
	raw, err := os.ReadFile("../Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "\t\t\t\trelay ") || !strings.Contains(string(raw), "proxy_url http://localhost:8080/upstream-proxy") {
		t.Fatal("the repo's Caddyfile should leave demo { relay } to its default, proxy_url")
	}
}
