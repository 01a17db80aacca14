package dashboard_test

// Tests of the dashboard an operator lives in (issue 33, item 5), through the real handlers over
// a real Postgres: the charts count the current minute and show 1 h / 24 h / 7 d; the delivery
// log is newest first in one table, paged; a message page writes sub-millisecond latencies and
// the status each status delivery carried; the demo page picks a live channel and says why the
// fake upstream refused. The layout of these pages at 375 and 1280 px is checked in Chromium by
// TestBrowserOperatorPages (operator_browser_test.go).

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/dashboard"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// seedAttempt inserts an event, a delivery of it to webhook wh and one attempt started at `at`
// (created at `at` too), answered code in ms.
func seedAttempt(t *testing.T, e *env, wh, ch uuid.UUID, at time.Time, code, ms int) uuid.UUID {
	t.Helper()
	evID, delID := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	e.Exec(t, `INSERT INTO events (id, org_id, channel_id, type, dedupe_key, payload, created_at)
		VALUES ($1, $2, $3, 'messages', $4, '{}', $5)`, evID, e.org.ID, ch, evID.String(), at)
	e.Exec(t, `INSERT INTO deliveries (id, event_id, webhook_id, status, attempts, last_status_code, created_at)
		VALUES ($1, $2, $3, 'delivered', 1, $4, $5)`, delID, evID, wh, code, at)
	e.Exec(t, `INSERT INTO delivery_attempts (id, delivery_id, attempt, started_at, duration_ms, status_code, response_body)
		VALUES ($1, $2, 1, $3, $4, $5, '{"ok":true}')`, uuid.Must(uuid.NewV7()), delID, at, ms, code)
	return delID
}

// TestChartsCountTheCurrentMinute: sends and delivery attempts made in the current minute are
// counted and drawn on the channel's and the webhook's page, in every range (the chart's last
// bucket is the one holding now; it used to be left out, so right after 10 sends the page said
// "0 answered 2xx").
func TestChartsCountTheCurrentMinute(t *testing.T) {
	e := newEnv(t)
	ch := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Line"})
	wh, _ := e.Webhook(t, e.org.ID, "https://crm.example.com/hook", &testenv.WebhookOpts{Name: "CRM"})
	now := time.Now().UTC()
	seedRelayLog(t, e, e.org.ID, ch.ID, now, "200", "ok", 0, 10)
	seedAttempt(t, e, wh.ID, ch.ID, now, 200, 12)
	c := e.client()
	c.signIn(e.key)
	for _, q := range []string{"", "?range=1h", "?range=24h", "?range=7d"} {
		a := c.get("/dashboard/channels/" + ch.ID.String() + q)
		wantStatus(t, a, http.StatusOK, "10 answered 2xx, 0 upstream errors")
		if !strings.Contains(a.body, `<rect class="bar ok"`) {
			t.Errorf("channel page%s: no bar drawn for the current minute's sends", q)
		}
		a = c.get("/dashboard/webhooks/" + wh.ID.String() + q)
		wantStatus(t, a, http.StatusOK, "1 attempts succeeded, 0 failed; latency p50 12 ms, p99 12 ms.")
	}
}

// barRe finds a chart's bars: class, x, width, height.
var barRe = regexp.MustCompile(`<rect class="bar (\w+)" x="([\d.]+)" y="[\d.]+" width="([\d.]+)" height="([\d.]+)"/>`)

// TestChartRanges: ?range=1h, 24h (the default) and 7d show the sends of that span, in bars of a
// minute, 15 minutes and an hour, scaled to the tallest bar (which reaches the top, its value
// the scale's), with links to each range that keep the page's filters; an unknown range is the
// default. A burst on a 24-hour chart is a bar 1/96 of the width, not a one-pixel spike.
func TestChartRanges(t *testing.T) {
	e := newEnv(t)
	ch := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Line"})
	now := time.Now().UTC()
	if err := e.Store.EnsurePartitions(context.Background(), now.Add(-4*24*time.Hour), now); err != nil {
		t.Fatal(err)
	}
	seedRelayLog(t, e, e.org.ID, ch.ID, now.Add(-3*time.Hour), "200", "ok", 0, 5)
	seedRelayLog(t, e, e.org.ID, ch.ID, now.Add(-72*time.Hour), "429", "rate_limited", 0, 4)
	seedRelayLog(t, e, e.org.ID, ch.ID, now, "200", "ok", 0, 2)
	c := e.client()
	c.signIn(e.key)
	page := "/dashboard/channels/" + ch.ID.String()
	for _, tc := range []struct {
		query, heading, summary, scale string
		bars                           int
		width                          float64 // of a bar, at least, in the chart's 720 units
	}{
		{"range=1h", "Sends, last hour", "2 answered 2xx, 0 upstream errors, 0 answered 429", "2/min", 1, 10},
		{"", "Sends, last 24 hours", "7 answered 2xx, 0 upstream errors, 0 answered 429", "5/15 min", 2, 6},
		{"range=nonsense", "Sends, last 24 hours", "7 answered 2xx", "5/15 min", 2, 6},
		{"range=7d", "Sends, last 7 days", "7 answered 2xx, 0 upstream errors, 4 answered 429", "5/h", 3, 3.5},
	} {
		a := c.get(page + "?" + tc.query)
		wantStatus(t, a, http.StatusOK, tc.heading, tc.summary, ">"+tc.scale+"</text>")
		bars := barRe.FindAllStringSubmatch(a.body, -1)
		if len(bars) != tc.bars {
			t.Fatalf("%s: %d bars, want %d", tc.query, len(bars), tc.bars)
		}
		tallest := 0.0
		for _, b := range bars {
			if w := atof(t, b[3]); w < tc.width {
				t.Errorf("%s: a bar %.2f wide, want at least %.1f", tc.query, w, tc.width)
			}
			tallest = max(tallest, atof(t, b[4]))
		}
		if tallest != 144 { // chartH - chartPad - 12: the top of the scale
			t.Errorf("%s: the tallest bar is %.2f high, want 144 (scaled to the data)", tc.query, tallest)
		}
		for _, r := range []string{"1h", "24h", "7d"} {
			if !strings.Contains(a.body, `href="`+page+`?range=`+r+`"`) {
				t.Errorf("%s: no link to the %s range", tc.query, r)
			}
		}
	}
	// the current range is marked, and the links keep the filters
	a := c.get(page + "?range=7d&status=failed")
	wantStatus(t, a, http.StatusOK, `<a href="`+page+`?range=7d&amp;status=failed" aria-current="page">7 d</a>`,
		`href="`+page+`?range=1h&amp;status=failed"`, `<input type="hidden" name="range" value="7d">`)
	// empty: said so, not an empty box
	other := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Quiet"})
	wantStatus(t, c.get("/dashboard/channels/"+other.ID.String()+"?range=1h"), http.StatusOK, "nothing in the last hour")
}

func atof(t *testing.T, s string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestDeliveryLogNewestFirst: a webhook's delivery log lists the newest delivery first, in one
// table (a row per delivery, its attempts folded), 50 to a page; the next page goes on with the
// older ones, none twice.
func TestDeliveryLogNewestFirst(t *testing.T) {
	e := newEnv(t)
	ch := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Line"})
	wh, _ := e.Webhook(t, e.org.ID, "https://crm.example.com/hook", &testenv.WebhookOpts{Name: "CRM"})
	now := time.Now().UTC().Truncate(time.Second)
	var ids []uuid.UUID // oldest first
	for i := 52; i >= 1; i-- {
		ids = append(ids, seedAttempt(t, e, wh.ID, ch.ID, now.Add(-time.Duration(i)*time.Second), 200, i))
	}
	// one delivery with three attempts: one row, its attempts folded under it
	e.Exec(t, `INSERT INTO delivery_attempts (id, delivery_id, attempt, started_at, duration_ms, status_code, error)
		SELECT gen_random_uuid(), $1, g, $2::timestamptz + g * interval '1 millisecond', 0, 500, 'boom' FROM generate_series(2, 3) g`, ids[51], now)
	c := e.client()
	c.signIn(e.key)
	rowRe := regexp.MustCompile(`<tr class="delivery" id="delivery-([0-9a-f-]+)">`)
	a := c.get("/dashboard/webhooks/" + wh.ID.String())
	wantStatus(t, a, http.StatusOK, "All 3 attempts", "&lt;1 ms", "More deliveries")
	if n := strings.Count(a.body, "<table"); n != 1 {
		t.Errorf("%d tables on the page, want one for the whole log", n)
	}
	rows := rowRe.FindAllStringSubmatch(a.body, -1)
	if len(rows) != 50 {
		t.Fatalf("%d rows on the first page, want 50", len(rows))
	}
	for i, r := range rows {
		if want := ids[51-i].String(); r[1] != want {
			t.Fatalf("row %d is %s, want %s (newest first)", i, r[1], want)
		}
	}
	next := regexp.MustCompile(`<a href="([^"]+)" rel="next">More deliveries`).FindStringSubmatch(a.body)
	if next == nil {
		t.Fatal("no next page")
	}
	u, _ := url.Parse(strings.ReplaceAll(next[1], "&amp;", "&"))
	a = c.get(u.RequestURI())
	rows = rowRe.FindAllStringSubmatch(a.body, -1)
	if len(rows) != 2 || rows[0][1] != ids[1].String() || rows[1][1] != ids[0].String() {
		t.Fatalf("second page = %v, want the two oldest, newer first", rows)
	}
	if strings.Contains(a.body, "More deliveries") {
		t.Error("a third page is offered")
	}
}

// TestMessagePageLatencyAndCarriedStatus: a relay call under a millisecond reads in µs, never
// "0 ms"; each message_status delivery shows the status its event carried.
func TestMessagePageLatencyAndCarriedStatus(t *testing.T) {
	e := newEnv(t)
	m := newMessagesEnv(t, e)
	fast := sentMessage{wamid: "wamid.FAST0000000000000000001", to: "+15550100003", at: time.Now().UTC().Add(-time.Minute).Truncate(time.Second),
		statuses: []string{"sent", "delivered", "read"}}
	seedMessage(t, e, e.org.ID, m.ch.ID, "1001", fast) // latency 0 ms
	if err := e.Store.WriteRelayLog(context.Background(), []store.RelayCall{{At: fast.at.Add(time.Second), OrgID: e.org.ID, ChannelID: m.ch.ID,
		Status: 200, Outcome: "ok", Latency: 420 * time.Microsecond, Recipient: fast.to, WAMID: "wamid.FAST0000000000000000002"}}); err != nil {
		t.Fatal(err)
	}
	c := e.client()
	c.signIn(e.key)
	a := c.get(messagePage("wamid.FAST0000000000000000002"))
	wantStatus(t, a, http.StatusOK, "HTTP 200 in 420 µs")
	a = c.get(messagePage(fast.wamid))
	wantStatus(t, a, http.StatusOK, "HTTP 200 in &lt;1 µs")
	if strings.Contains(a.body, " in 0 ms") {
		t.Error(`a sub-millisecond relay call reads "0 ms"`)
	}
	for _, st := range fast.statuses {
		if !strings.Contains(a.body, `message_status: <span class="badge `+st+` carried"`) {
			t.Errorf("no delivery shows the status %s it carried:\n%s", st, a.body)
		}
	}
}

// TestDemoPicksALiveChannel: after a `make run` restart the demo page's forms default to the
// newest connected channel whose token is not known dead (the fake upstream forgot the numbers
// connected before it restarted), and a refusal of the fake upstream is shown with its reason.
func TestDemoPicksALiveChannel(t *testing.T) {
	fake := fakegraph.New(fakegraph.WithCallback("http://127.0.0.1:1/webhooks/upstream"), fakegraph.WithAppSecret("demo-secret"))
	fake.Start()
	t.Cleanup(fake.Close)
	e := newEnv(t, func(o *dashboard.Options) {
		o.Demo = &dashboard.Demo{FakeUpstream: fake.URL(), Receiver: "https://127.0.0.1:1"}
	})
	old := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Before the restart", Connection: e.Connection()})
	newest := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Since the restart", Connection: e.Connection()})
	dead := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Token dead", Connection: e.Connection()})
	e.Exec(t, `UPDATE channels SET connected_at = now() - interval '2 hours' WHERE id = $1`, old.ID)
	e.Exec(t, `UPDATE channels SET connected_at = now() - interval '1 hour' WHERE id = $1`, newest.ID)
	e.Exec(t, `UPDATE channels SET connected_at = now(), upstream_disconnected_at = now() WHERE id = $1`, dead.ID)
	c := e.client()
	c.signIn(e.key)
	a := c.get("/dashboard/demo")
	wantStatus(t, a, http.StatusOK, "Token dead (")
	opts := regexp.MustCompile(`<select id="emit-channel" name="phone_number_id"><option value="[^"]*">([^<(]+)`).FindStringSubmatch(a.body)
	if opts == nil || strings.TrimSpace(opts[1]) != "Since the restart" {
		t.Fatalf("the demo's first channel is %v, want the newest live one:\n%s", opts, a.body)
	}
	if i, j := strings.Index(a.body, ">Before the restart ("), strings.Index(a.body, ">Token dead ("); i < 0 || j < i {
		t.Errorf("the dead channel is not listed last")
	}
	// the fake does not know the number: its reason is on the page
	pn := testenv.QueryValue[string](t, e.Fixture, `SELECT phone_number_id FROM channels WHERE id = $1`, old.ID)
	wantStatus(t, c.post("/dashboard/demo/emit", url.Values{"phone_number_id": {pn}}), http.StatusBadGateway,
		"fake upstream answered 400: unknown phone_number_id "+pn)
}
