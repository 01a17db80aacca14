package dashboard_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// seedUsage writes a folded usage bucket of org, day as days before today.
func seedUsage(e *env, org, ch uuid.UUID, daysAgo int, category, typ, country string, messages, billable int) {
	e.t.Helper()
	e.Exec(e.t, `INSERT INTO usage_daily (org_id, day, channel_id, category, pricing_type, country, messages, billable)
		VALUES ($1, (now() AT TIME ZONE 'UTC')::date - $2::int, $3, $4, $5, $6, $7, $8)`,
		org, daysAgo, ch, category, typ, country, messages, billable)
}

// TestUsagePage: the usage page, linked from the nav, shows daily bars by category (the
// biggest first), a table per channel with the window's totals, and a CSV download of the rows;
// a bad date is said and the default window shown; another org's channel is not found.
func TestUsagePage(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	c.signIn(e.key)
	support := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Support line"})
	sales := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Sales"})
	other := e.Channel(t, e.Org(t).ID)
	seedUsage(e, e.org.ID, support.ID, 0, "marketing", "regular", "US", 5, 5)
	seedUsage(e, e.org.ID, support.ID, 3, "marketing", "regular", "US", 2, 2)
	seedUsage(e, e.org.ID, support.ID, 1, "utility", "free_customer_service", "BR", 2, 0)
	seedUsage(e, e.org.ID, sales.ID, 1, "authentication", "regular", "IN", 1, 1)

	today := time.Now().UTC().Format("2006-01-02")
	since := time.Now().UTC().AddDate(0, 0, -29).Format("2006-01-02")
	a := c.get("/dashboard/usage")
	wantStatus(t, a, http.StatusOK,
		`<a href="/dashboard/usage" aria-current="page">Usage</a>`,
		`value="`+since+`"`, `value="`+today+`"`,
		`<rect class="bar c0"`, `<li class="c0">marketing</li>`, `<li class="c1">utility</li>`, `<li class="c2">authentication</li>`,
		"Messages: 10, billable: 8",
		`<h2>Support line</h2>`, `<h2>Sales</h2>`,
		// support's table: the window's days added up
		`<tr><td>marketing</td><td>regular</td><td>US</td><td>7</td><td>7</td><td>—</td></tr>`,
		`<tr><td>utility</td><td>free_customer_service</td><td>BR</td><td>2</td><td>0</td><td>—</td></tr>`,
		`href="/dashboard/usage.csv?since=`+since+`&amp;until=`+today+`"`)
	if strings.Index(a.body, "<h2>Support line</h2>") > strings.Index(a.body, "<h2>Sales</h2>") {
		t.Error("tables not in channel order") // (support was created first: a smaller UUIDv7)
	}
	if n := strings.Count(a.body, `<rect class="bar`); n != 4 {
		t.Errorf("%d bars, want 4 (one per day and category)", n)
	}

	csv := c.get("/dashboard/usage.csv?since=" + since + "&until=" + today)
	if csv.status != 200 || !strings.HasPrefix(csv.header.Get("Content-Type"), "text/csv") ||
		!strings.HasPrefix(csv.body, "day,channel_id,category,pricing_type,country,messages,billable,cost\n") ||
		strings.Count(csv.body, "\n") != 5 || !strings.Contains(csv.body, today+","+support.ID.String()+",marketing,regular,US,5,5,\n") {
		t.Fatalf("csv: %d %q\n%s", csv.status, csv.header.Get("Content-Type"), csv.body)
	}

	// one channel
	wantStatus(t, c.get("/dashboard/usage?channel_id="+sales.ID.String()), http.StatusOK, "Messages: 1, billable: 1", `<h2>Sales</h2>`)
	// a bad date: said, and the default window shown
	wantStatus(t, c.get("/dashboard/usage?since=nope"), http.StatusUnprocessableEntity,
		`&#34;since&#34; must be a date such as 2026-11-30`, "Messages: 10, billable: 8")
	wantStatus(t, c.get("/dashboard/usage?since=2020-01-01&until="+today), http.StatusUnprocessableEntity, "Usage window is longer than 92 days")
	// another org's channel
	wantStatus(t, c.get("/dashboard/usage?channel_id="+other.ID.String()), http.StatusNotFound)
	wantStatus(t, c.get("/dashboard/usage.csv?channel_id="+other.ID.String()), http.StatusNotFound)
}
