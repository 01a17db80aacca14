package dashboard_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/dashboard"
	"github.com/wabarelay/wabarelay/internal/browsertest"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestBrowserOperatorPages: at 375 and 1280 px, the pages an operator lives in (issue 33, item
// 5): a channel's page right after 10 sends counts them (with the 3 of the last half hour) and draws them, and its 1 h link shows
// them as a bar a sixtieth of the chart wide; a webhook with 31 deliveries lists them newest
// first in one compact table (at most 64 px a delivery at 1280 px; it took 150); a message's
// deliveries show the status each carried; every table scrolls inside its own box, which at
// 375 px says so ("Scroll sideways") and is narrower than its table, while the page never
// scrolls sideways (checkLayout); at 1280 px the line is not shown. No console errors or CSP
// violations; screenshots of each page.
func TestBrowserOperatorPages(t *testing.T) {
	t.Parallel()
	e, b := newBrowserEnv(t)
	m := newMessagesEnv(t, e)
	now := time.Now().UTC()
	seedRelayLog(t, e, e.org.ID, m.ch.ID, now, "200", "ok", 0, 10)
	hook, _ := e.Webhook(t, e.org.ID, "https://crm.example.com/hooks/whatsapp/all-events", &testenv.WebhookOpts{Name: "Everything"})
	var newest uuid.UUID
	for i := 31; i >= 1; i-- {
		newest = seedAttempt(t, e, hook.ID, m.ch.ID, now.Add(-time.Duration(i)*time.Minute), 200, 20+i)
	}
	e.Exec(t, `INSERT INTO delivery_attempts (id, delivery_id, attempt, started_at, duration_ms, status_code, error, response_body)
		VALUES (gen_random_uuid(), $1, 2, now(), 1234, 502, 'bad gateway', '{"error":{"message":"upstream_connect_error_or_disconnect_reset_before_headers"}}')`, newest)
	chPath, whPath := "/dashboard/channels/"+m.ch.ID.String(), "/dashboard/webhooks/"+hook.ID.String()

	// The screens only read the data: they run in parallel.
	for _, v := range viewports {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			p := v.page(t, b)
			signIn(t, p, e, e.key)
			// tables: each in a scroll box; at 375 px the box says it scrolls and is narrower
			// than the table, at 1280 px the line is hidden
			scrollBoxes := func(name string, wantTables int) {
				t.Helper()
				got := browsertest.Eval[[]string](t, p, `[...document.querySelectorAll('main table')].map(tb => {
					const box = tb.parentElement;
					if (!box.classList.contains('scroll') || getComputedStyle(box).overflowX !== 'auto') return 'unboxed';
					const hint = getComputedStyle(box, '::before');
					return (box.classList.contains('wide') ? 'wide' : 'box') + ' ' + (hint.display !== 'none' && hint.content.includes('Scroll sideways') ? 'hint' : 'nohint') +
						' ' + (box.scrollWidth > box.clientWidth ? 'scrolls' : 'fits');
				})`)
				if len(got) != wantTables {
					t.Fatalf("%s: %d tables, want %d", name, len(got), wantTables)
				}
				for _, g := range got {
					if g == "unboxed" {
						t.Errorf("%s: a table not in a scroll box", name)
					} else if strings.HasPrefix(g, "wide") && (v.width < 720) != (g == "wide hint scrolls") {
						t.Errorf("%s at %d px: wide table is %q", name, v.width, g)
					}
				}
			}

			// the channel page, right after 10 sends
			p.Navigate(t, e.srv.URL+chPath)
			wantText(t, p, "#sends-h", "Sends, last 24 hours")
			wantText(t, p, "#sends-h + .summary", "13 answered 2xx")
			checkLayout(t, p, "operator-channel", v)
			status, path := click(t, p, `nav.ranges a[href$="range=1h"]`)
			wantPage(t, status, path, http.StatusOK, chPath)
			wantText(t, p, "#sends-h", "Sends, last hour")
			wantText(t, p, "#sends-h + .summary", "13 answered 2xx")
			wantText(t, p, `nav.ranges a[aria-current=page]`, "1 h")
			chartW := browsertest.Eval[float64](t, p, `document.querySelector('figure svg.chart').getBoundingClientRect().width`)
			barW := browsertest.Eval[float64](t, p, `Math.max(...[...document.querySelectorAll('figure svg.chart rect.bar')].map(r => r.getBoundingClientRect().width))`)
			if barW < chartW/60*0.8 {
				t.Errorf("the current minute's bar is %.1f px wide in a %.0f px chart of an hour, want about a sixtieth", barW, chartW)
			}
			checkLayout(t, p, "operator-channel-1h", v)

			// the delivery log: newest first, one compact table
			p.Navigate(t, e.srv.URL+whPath)
			if got := browsertest.Eval[string](t, p, `document.querySelector('table.delivery-log tbody tr').id`); got != "delivery-"+newest.String() {
				t.Errorf("first row %s, want the newest delivery", got)
			}
			wantText(t, p, "#delivery-"+newest.String(), "502", "1.2 s", "bad gateway")
			if n := browsertest.Eval[int](t, p, `document.querySelectorAll('main table').length`); n != 1 {
				t.Errorf("%d tables on the webhook page, want 1", n)
			}
			scrollBoxes("delivery-log", 1)
			if v.width == 1280 {
				h := browsertest.Eval[float64](t, p, `(() => { const rows = document.querySelectorAll('[id^="delivery-"]');
					return rows[rows.length-1].getBoundingClientRect().bottom - rows[0].getBoundingClientRect().top; })()`)
				t.Logf("31 deliveries take %.0f px at 1280 px", h)
				if h > 31*64 {
					t.Errorf("31 deliveries take %.0f px at 1280 px, want at most %d", h, 31*64)
				}
			}
			checkLayout(t, p, "operator-delivery-log", v)

			// a message's deliveries: the status each carried
			p.Navigate(t, e.srv.URL+messagePage(m.read.wamid))
			if got := browsertest.Eval[string](t, p, `[...document.querySelectorAll('li.delivery .carried')].map(s => s.innerText).join(',')`); got != "sent,delivered,read" {
				t.Errorf("carried statuses = %q", got)
			}
			checkLayout(t, p, "operator-message", v)

			p.Navigate(t, e.srv.URL+"/dashboard/api-keys")
			scrollBoxes("api-keys", 1)
			checkLayout(t, p, "operator-api-keys", v)
			p.AssertNoConsoleErrors(t)
		})
	}
}

// TestBrowserDemoPage: at 375 and 1280 px, the demo page after a `make run` restart: its send
// form defaults to the channel connected since (not the older one the fake upstream forgot);
// "Send 10 demo messages" refused upstream lists each refusal with the upstream's status, message
// and code in a table that scrolls in its own box (saying so at 375 px), the page never
// sideways; "Send an incoming message" for the forgotten number says the fake's reason.
func TestBrowserDemoPage(t *testing.T) {
	t.Parallel()
	browsertest.ChromiumPath(t)
	// the fake stands in for the relay too: it refuses the channels' tokens (190)
	// Each screen has a fake upstream and a dashboard of its own, so the two run in parallel.
	for _, v := range viewports {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			fake := fakegraph.New(fakegraph.WithCallback("http://127.0.0.1:1/webhooks/upstream"), fakegraph.WithAppSecret("demo-secret"))
			fake.Start()
			t.Cleanup(fake.Close)
			e, b := newBrowserEnv(t, func(o *dashboard.Options) {
				o.Demo = &dashboard.Demo{FakeUpstream: fake.URL(), Receiver: "https://127.0.0.1:1", Relay: fake.URL() + "/v26.0"}
			})
			old := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Before the restart", Connection: e.Connection()})
			newest := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Since the restart", Connection: e.Connection()})
			e.Exec(t, `UPDATE channels SET connected_at = now() - interval '2 hours' WHERE id = $1`, old.ID)
			e.Exec(t, `UPDATE channels SET connected_at = now() - interval '1 hour' WHERE id = $1`, newest.ID)
			pn := func(id uuid.UUID) string {
				return testenv.QueryValue[string](t, e.Fixture, `SELECT phone_number_id FROM channels WHERE id = $1`, id)
			}
			p := v.page(t, b)
			signIn(t, p, e, e.key)
			p.Navigate(t, e.srv.URL+"/dashboard/demo")
			if got := valueOf(t, p, "#send-channel"); got != pn(newest.ID) {
				t.Errorf("the send form's channel is %s, want the newest (%s)", got, pn(newest.ID))
			}
			checkLayout(t, p, "demo", v)
			status, _ := click(t, p, `form[action$="/demo/send"] button[type=submit]`)
			if status != http.StatusBadGateway {
				t.Fatalf("send: HTTP %d, want 502 (all refused)", status)
			}
			wantText(t, p, "table.demo-sends tbody tr", "answered 4", "(code 190)")
			got := browsertest.Eval[string](t, p, `(() => { const box = document.querySelector('table.demo-sends').parentElement;
				const hint = getComputedStyle(box, '::before');
				return box.className + ' ' + (hint.display !== 'none' ? 'hint' : 'nohint') + ' ' + (box.scrollWidth > box.clientWidth ? 'scrolls' : 'fits'); })()`)
			if want := map[bool]string{true: "scroll wide hint scrolls", false: "scroll wide nohint fits"}[v.width < 720]; got != want {
				t.Errorf("the sends table's box is %q, want %q", got, want)
			}
			checkLayout(t, p, "demo-sent", v)
			p.Do(t, chromedp.SetValue(css("#emit-channel"), pn(old.ID)))
			status, _ = click(t, p, `form[action$="/demo/emit"] button[type=submit]`)
			if status != http.StatusBadGateway {
				t.Fatalf("emit: HTTP %d, want 502", status)
			}
			wantText(t, p, `.error[role=alert]`, "fake upstream answered 400: unknown phone_number_id "+pn(old.ID))
			checkLayout(t, p, "demo-emit-refused", v)
			p.AssertNoConsoleErrors(t, http.StatusBadGateway)
		})
	}
}
