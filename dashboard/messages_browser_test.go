package dashboard_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/wabarelay/wabarelay/internal/browsertest"
)

// TestBrowserMessages: at 375 and 1280 px, over real rows (messages, status events and their
// deliveries, relay log): the channel name on Channels leads to the channel's page, which draws
// the sends chart (four lines) and lists the messages with their badges and the explanation of
// a common error; the status filter and the search narrow the list; a wamid leads to the
// message's page, whose timeline shows the steps in order with their times and the time between
// them, and its deliveries link to the webhook. Each page fits the screen (checkLayout) and is
// saved as a screenshot; no console errors or CSP violations.
func TestBrowserMessages(t *testing.T) {
	t.Parallel()
	e, b := newBrowserEnv(t)
	m := newMessagesEnv(t, e)
	chPath := "/dashboard/channels/" + m.ch.ID.String()
	// The screens only read the data: they run in parallel.
	for _, v := range viewports {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			p := v.page(t, b)
			signIn(t, p, e, e.key)
			status, path := click(t, p, "#channel-"+m.ch.ID.String()+" h2 a")
			wantPage(t, status, path, http.StatusOK, chPath)
			wantText(t, p, "h1", "Channel Support line")
			wantText(t, p, `nav[aria-label=Main] a[aria-current=page]`, "Channels")
			p.Do(t, chromedp.WaitVisible(css(`svg.chart[aria-label^="Sends per"]`)))
			if n := browsertest.Eval[int](t, p, `new Set([...document.querySelectorAll('svg.chart rect.bar')].map(r => r.classList[1])).size`); n != 4 {
				t.Errorf("bars of %d series, want 4", n)
			}
			wantText(t, p, "#sends-h + .summary", "3 answered 2xx, 1 upstream error, 2 answered 429, 1 refused by the relay.")
			if n := browsertest.Eval[int](t, p, `document.querySelectorAll('li.message').length`); n != 3 {
				t.Errorf("%d messages listed, want 3", n)
			}
			failedRow := `li.message:has(a[href$="` + m.failed.wamid + `"])`
			wantText(t, p, failedRow+" .badge", "failed")
			wantText(t, p, failedRow, "+15550100002", "order-1002", "131047", "Outside the 24-hour window")
			wantText(t, p, `li.message:has(a[href$="`+m.read.wamid+`"]) .badge`, "read")
			checkLayout(t, p, "channel", v)

			// Filter by status.
			p.Do(t, chromedp.SetValue(css("#m-status"), "failed"))
			status, path = click(t, p, `form.filters button[type=submit]`)
			wantPage(t, status, path, http.StatusOK, chPath)
			if !strings.Contains(path, "status=failed") {
				t.Errorf("filter URL = %s", path)
			}
			if n := browsertest.Eval[int](t, p, `document.querySelectorAll('li.message').length`); n != 1 || !present(t, p, failedRow) {
				t.Errorf("status=failed: %d messages listed, want the failed one", n)
			}
			// Search by recipient, with any status.
			p.Do(t, chromedp.SetValue(css("#m-status"), ""), chromedp.SetValue(css("#m-q"), "+15550100001"))
			click(t, p, `form.filters button[type=submit]`)
			if n := browsertest.Eval[int](t, p, `document.querySelectorAll('li.message').length`); n != 2 || present(t, p, failedRow) {
				t.Errorf("search by recipient: %d messages listed, want the 2 to +15550100001", n)
			}
			// Search by idempotency key; nothing matches an unknown one.
			p.Do(t, chromedp.SetValue(css("#m-q"), "order-1002"))
			click(t, p, `form.filters button[type=submit]`)
			if n := browsertest.Eval[int](t, p, `document.querySelectorAll('li.message').length`); n != 1 || !present(t, p, failedRow) {
				t.Errorf("search by key: %d messages listed, want the failed one", n)
			}
			p.Do(t, chromedp.SetValue(css("#m-q"), "order-9999"))
			click(t, p, `form.filters button[type=submit]`)
			wantText(t, p, "#messages-h ~ p.empty", "No messages match.")
			checkLayout(t, p, "channel-no-match", v)
			status, path = click(t, p, `form.filters a`) // Clear
			wantPage(t, status, path, http.StatusOK, chPath)
			if path != chPath {
				t.Errorf("Clear leads to %s", path)
			}

			// The failed message's page.
			status, path = click(t, p, failedRow+" a.wamid")
			wantPage(t, status, path, http.StatusOK, "/dashboard/messages/"+m.failed.wamid)
			wantText(t, p, "h1", "Message")
			wantText(t, p, "main dl", m.failed.wamid, "Support line", "+15550100002", "order-1002", "Outside the 24-hour window")
			if got := browsertest.Eval[string](t, p, `[...document.querySelectorAll('ol.timeline li')].map(li => li.className).join(',')`); got != "step relay,step failed" {
				t.Errorf("timeline steps = %q", got)
			}
			wantText(t, p, "ol.timeline li.failed", "failed", "131047", "Re-engagement message", "Outside the 24-hour window", "+1.0 s")
			wantText(t, p, "ol.timeline li.relay", "HTTP 200", "140 ms")
			wantText(t, p, "li.delivery", "CRM", "message_status")
			checkLayout(t, p, "message-failed", v)

			// The read message's page: four steps, a second apart.
			p.Navigate(t, e.srv.URL+messagePage(m.read.wamid))
			if got := browsertest.Eval[string](t, p, `[...document.querySelectorAll('ol.timeline li')].map(li => li.className).join(',')`); got != "step relay,step sent,step delivered,step read" {
				t.Errorf("timeline steps = %q", got)
			}
			if got := browsertest.Eval[string](t, p, `[...document.querySelectorAll('ol.timeline .since')].map(s => s.innerText).join(',')`); got != "+1.0 s,+1.0 s,+1.0 s" {
				t.Errorf("times between steps = %q", got)
			}
			wantText(t, p, "ol.timeline li.relay", "replayed")
			checkLayout(t, p, "message-read", v)
			status, path = click(t, p, `li.delivery a[href*="/webhooks/"]`)
			wantPage(t, status, path, http.StatusOK, "/dashboard/webhooks/"+m.webhook.ID.String())
			p.AssertNoConsoleErrors(t)
		})
	}
}
