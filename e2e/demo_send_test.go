package e2e

import (
	"context"
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

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
	t.Parallel()
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
