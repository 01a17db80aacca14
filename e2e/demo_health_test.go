package e2e

import (
	"context"
	"html"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestDemoHealthAndWindow: on the repo's Caddyfile as `make run` runs the demo, the Demo page's
// "Lower this number's quality" has the fake upstream post a phone_number_quality_update, the
// service reads the number's health after it (YELLOW), the Channels page shows the badge and the
// demo receiver gets the channel_health event, signed;
// "Show a closed window" has the fake post a message from a customer whose upstream timestamp is
// 25 hours old and sends that customer a text through the relay, whose message page shows the
// customer's window closed.
func TestDemoHealthAndWindow(t *testing.T) {
	t.Parallel()
	w := startDemo(t)
	ch, su := w.connectChannel(t, "Support line")
	c := w.signIn(t)
	id := uuid.MustParse(ch.ID)
	// waiting reads the store (polling the dashboard would meet the key's rate limit)
	quality := func() string {
		got, err := w.store.GetChannel(context.Background(), w.org, id)
		if err != nil {
			t.Fatal(err)
		}
		if q := got.Health.QualityRating; q != nil {
			return *q
		}
		return ""
	}
	testenv.Eventually(t, testenv.Patience, func() bool { return quality() == "GREEN" }, "the health read at connect")
	// the demo webhook (messages, message_status and channel_health) to the fake's receiver
	if st, page := c.do("POST", "/dashboard/demo/webhook", url.Values{}); st != 201 {
		t.Fatalf("demo webhook: %d %.600s", st, page)
	}

	st, page := c.do("GET", "/dashboard/demo", nil)
	m := batchRe.FindStringSubmatch(page)
	if st != 200 || m == nil || !strings.Contains(page, "Lower this number's quality") || !strings.Contains(page, "Show a closed window") {
		t.Fatalf("demo page: %d %.3000s", st, page)
	}

	// the number goes YELLOW
	st, page = c.do("POST", "/dashboard/demo/quality", url.Values{"phone_number_id": {su.PhoneNumberID}})
	if st != 200 || !strings.Contains(page, "lowered the number&#39;s quality to YELLOW") {
		t.Fatalf("quality: %d %.3000s", st, page)
	}
	testenv.DueHealthReads(t, w.store.Pool()) // (due 30 s after the webhook)
	testenv.Eventually(t, testenv.Patience, func() bool { return quality() == "YELLOW" }, "the health read after the webhook")
	if st, page = c.do("GET", "/dashboard/channels", nil); st != 200 || !strings.Contains(page, "quality YELLOW") {
		t.Fatalf("channels page: %d %.3000s", st, page)
	}
	// the change reached the demo receiver as a channel_health event, signed with the webhook's secret
	testenv.Eventually(t, testenv.Patience, func() bool {
		return w.countRows(`SELECT count(*) FROM deliveries d JOIN events e ON e.id = d.event_id
			WHERE e.type = 'channel_health' AND d.status = 'delivered'`) == 1
	}, "the channel_health delivery")
	if st, page = c.do("GET", "/dashboard/demo", nil); st != 200 || !strings.Contains(page, "<span>channel_health</span>") ||
		strings.Contains(page, "not verified") || !strings.Contains(page, "&#34;changed&#34;:[&#34;quality_rating&#34;]") {
		t.Fatalf("demo page after the change: %d %.6000s", st, page)
	}

	// a window closes
	st, page = c.do("POST", "/dashboard/demo/window", url.Values{"phone_number_id": {su.PhoneNumberID}, "batch": {m[1]}})
	l := messageLinkRe.FindStringSubmatch(page)
	if st != 200 || l == nil || !strings.Contains(page, "1 of 1 accepted for Support line") {
		t.Fatalf("window: %d %.3000s", st, page)
	}
	wamid, err := url.PathUnescape(html.UnescapeString(l[1]))
	if err != nil {
		t.Fatal(err)
	}
	// the message's page exists once the send is on the timeline (its first status)
	testenv.Eventually(t, testenv.Patience, func() bool {
		st, page = c.do("GET", "/dashboard/messages/"+url.PathEscape(wamid), nil)
		return st == 200
	}, "the message page")
	if !strings.Contains(page, `badge window-closed">closed</span>`) || !strings.Contains(page, "the customer last wrote more than 24 hours ago") {
		t.Fatalf("message page: %.4000s", page)
	}
}
