package managementapi_test

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
	"github.com/wabarelay/wabarelay/usage"
)

// seedUsage writes usage buckets of org straight into the rollup (folded) or the deltas (not
// folded yet): day as days before today.
func (e *env) seedUsage(folded bool, org, ch uuid.UUID, daysAgo int, category, typ, country string, messages, billable int) {
	e.t.Helper()
	table := "usage_deltas"
	if folded {
		table = "usage_daily"
	}
	e.Exec(e.t, `INSERT INTO `+table+` (org_id, day, channel_id, category, pricing_type, country, messages, billable)
		VALUES ($1, (now() AT TIME ZONE 'UTC')::date - $2::int, $3, $4, $5, $6, $7, $8)`,
		org, daysAgo, ch, category, typ, country, messages, billable)
}

func day(daysAgo int) string {
	return time.Now().UTC().AddDate(0, 0, -daysAgo).Format("2006-01-02")
}

// usageRows writes u's rows as "day channel category type country messages billable cost".
func usageRows(u managementapi.Usage, names map[uuid.UUID]string) []string {
	var out []string
	for _, r := range u.Rows {
		cost := "null"
		if r.Cost != nil {
			cost = *r.Cost
		}
		out = append(out, fmt.Sprintf("%s %s %s %s %s %d %d %s", r.Day, names[r.ChannelID], r.Category, r.PricingType, r.Country, r.Messages, r.Billable, cost))
	}
	return out
}

// TestUsageEndpoint: GET /usage answers the org's buckets of a window of UTC days (both bounds
// included; the last 30 days by default), the rollup and the deltas added up, ordered by day,
// channel, category, type and country; one channel with channel_id (another org's: 404); bad
// dates, a reversed or too long window and a bad format are 422; CSV with format=csv.
func TestUsageEndpoint(t *testing.T) {
	e := newEnv(t)
	a1, a2 := e.createChannel(e.keyA, "a1"), e.createChannel(e.keyA, "a2")
	b := e.createChannel(e.keyB, "b")
	names := map[uuid.UUID]string{a1.ID: "a1", a2.ID: "a2"}
	e.seedUsage(true, e.orgA, a1.ID, 0, "marketing", "regular", "US", 5, 5)
	e.seedUsage(false, e.orgA, a1.ID, 0, "marketing", "regular", "US", 2, 2) // not folded yet: added
	e.seedUsage(false, e.orgA, a1.ID, 0, "utility", "regular", "US", -1, -1) // a move out of a folded bucket
	e.seedUsage(true, e.orgA, a1.ID, 0, "utility", "regular", "US", 1, 1)    // … emptied: not listed
	e.seedUsage(true, e.orgA, a2.ID, 0, "authentication", "regular", "BR", 3, 3)
	e.seedUsage(true, e.orgA, a1.ID, 0, "service", "free_customer_service", "IN", 4, 0)
	e.seedUsage(true, e.orgA, a1.ID, 0, "marketing", "regular", "GB", 1, 1)
	e.seedUsage(true, e.orgA, a2.ID, 29, "utility", "regular", "DE", 6, 6)  // the default window's first day
	e.seedUsage(true, e.orgA, a2.ID, 30, "utility", "regular", "DE", 50, 5) // outside it
	e.seedUsage(false, e.orgA, a1.ID, 1, "marketing", "free_entry_point", "ZZ", 7, 0)
	e.seedUsage(true, e.orgB, b.ID, 0, "marketing", "regular", "US", 100, 100)

	get := func(query string) (managementapi.Usage, response) {
		t.Helper()
		r := e.do("GET", "/usage"+query, e.keyA, "")
		var u managementapi.Usage
		if r.status == 200 {
			r.json(t, &u)
		}
		return u, r
	}
	u, r := get("")
	if r.status != 200 || u.Since != day(29) || u.Until != day(0) {
		t.Fatalf("default window: %d %s", r.status, r.body)
	}
	// ordered by day, channel (a1 before a2: created first, a smaller UUIDv7), category, type, country
	want := []string{
		day(29) + " a2 utility regular DE 6 6 null",
		day(1) + " a1 marketing free_entry_point ZZ 7 0 null",
		day(0) + " a1 marketing regular GB 1 1 null",
		day(0) + " a1 marketing regular US 7 7 null",
		day(0) + " a1 service free_customer_service IN 4 0 null",
		day(0) + " a2 authentication regular BR 3 3 null",
	}
	if got := usageRows(u, names); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("rows:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if u.Totals.Messages != 28 || u.Totals.Billable != 17 || u.Totals.Cost != nil {
		t.Fatalf("totals: %+v", u.Totals)
	}
	if !strings.Contains(string(r.body), `"cost":null`) {
		t.Fatalf("costs not null: %s", r.body)
	}

	// inclusive bounds: since and until are in; the days around them are not
	u, _ = get("?since=" + day(1) + "&until=" + day(1))
	if got := usageRows(u, names); len(got) != 1 || got[0] != want[1] {
		t.Fatalf("one day: %v", got)
	}
	u, _ = get("?since=" + day(30) + "&until=" + day(29))
	if got := usageRows(u, names); len(got) != 2 || got[0] != day(30)+" a2 utility regular DE 50 5 null" || got[1] != want[0] {
		t.Fatalf("30 and 29 days ago: %v", got)
	}
	// until alone: the 30 days ending on it; since alone: until today
	if u, _ = get("?until=" + day(1)); u.Since != day(30) || u.Until != day(1) || len(u.Rows) != 3 {
		t.Fatalf("until alone: %+v", u)
	}
	if u, _ = get("?since=" + day(1)); u.Since != day(1) || u.Until != day(0) || len(u.Rows) != 5 {
		t.Fatalf("since alone: %+v", u)
	}
	// one channel
	u, r = get("?channel_id=" + a2.ID.String())
	if got := usageRows(u, names); r.status != 200 || len(got) != 2 || got[0] != want[0] || got[1] != want[5] || u.Totals.Messages != 9 {
		t.Fatalf("a2: %v %+v", got, u.Totals)
	}
	// 92 days, both counted: the longest window
	if _, r = get("?since=" + day(91) + "&until=" + day(0)); r.status != 200 {
		t.Fatalf("92 days: %d %s", r.status, r.body)
	}
	expectError(t, e.do("GET", "/usage?since="+day(92)+"&until="+day(0), e.keyA, ""), 422, "Usage window is longer than 92 days")
	expectError(t, e.do("GET", "/usage?since=2020-01-01", e.keyA, ""), 422, "Usage window is longer than 92 days")
	dateMsg := func(name string) string {
		return `"` + name + `" must be a date such as 2026-11-30 (YYYY-MM-DD, UTC)`
	}
	for query, msg := range map[string]string{
		"since=2026-13-01":                  dateMsg("since"),
		"since=yesterday":                   dateMsg("since"),
		"since=2026-1-5":                    dateMsg("since"),
		"since=2026-11-01T00:00:00Z":        dateMsg("since"),
		"until=2026-02-30":                  dateMsg("until"),
		"until=%FF":                         dateMsg("until"),
		"since=x&until=y":                   dateMsg("since"),
		"since=2026-11-02&until=2026-11-01": `"until" must not be before "since"`,
		"format=xml":                        `"format" must be one of: json, csv`,
		"format=xml&since=x":                `"format" must be one of: json, csv`,
	} {
		expectError(t, e.do("GET", "/usage?"+query, e.keyA, ""), 422, msg)
	}
	// another org's channel, an unknown one, not a UUID: 404
	for _, ch := range []string{b.ID.String(), uuid.NewString(), "nope"} {
		expectError(t, e.do("GET", "/usage?channel_id="+ch, e.keyA, ""), 404, "Channel not found")
	}
	// org B sees its own only
	r = e.do("GET", "/usage", e.keyB, "")
	var ub managementapi.Usage
	if r.json(t, &ub); len(ub.Rows) != 1 || ub.Rows[0].ChannelID != b.ID || ub.Totals.Messages != 100 {
		t.Fatalf("org B: %s", r.body)
	}

	// CSV: the header, then the rows in order, an unknown cost empty
	r = e.do("GET", "/usage?format=csv", e.keyA, "")
	if r.status != 200 || r.header.Get("Content-Type") != "text/csv; charset=utf-8" {
		t.Fatalf("csv: %d %q %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	recs, err := csv.NewReader(strings.NewReader(string(r.body))).ReadAll()
	if err != nil || len(recs) != 7 {
		t.Fatalf("csv: %v %q", err, r.body)
	}
	if strings.SplitN(string(r.body), "\n", 2)[0] != "day,channel_id,category,pricing_type,country,messages,billable,cost" {
		t.Fatalf("csv header: %q", r.body)
	}
	for i, rec := range recs[1:] {
		line := strings.Join([]string{rec[0], names[uuid.MustParse(rec[1])], rec[2], rec[3], rec[4], rec[5], rec[6], rec[7]}, " ")
		if line != strings.TrimSuffix(want[i], "null") {
			t.Errorf("csv line %d: %q, want %q", i+2, line, want[i])
		}
	}
}

// TestUsageCost: with a rate card, cost is billable × the price of the row's country and
// category, exactly; null where the card has no price; totals.cost adds up the known ones.
func TestUsageCost(t *testing.T) {
	card, err := usage.ParseRateCard(strings.NewReader("country,category,price\nUS,marketing,0.0250\nBR,authentication,0.0315\nIN,service,0\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(o *managementapi.Options) { o.RateCard = card })
	a1 := e.createChannel(e.keyA, "a1")
	e.seedUsage(true, e.orgA, a1.ID, 0, "marketing", "regular", "US", 7, 7)
	e.seedUsage(true, e.orgA, a1.ID, 0, "authentication", "regular", "BR", 3, 3)
	e.seedUsage(true, e.orgA, a1.ID, 0, "service", "free_customer_service", "IN", 4, 0)
	e.seedUsage(true, e.orgA, a1.ID, 0, "marketing", "regular", "GB", 1, 1) // no price
	r := e.do("GET", "/usage", e.keyA, "")
	var u managementapi.Usage
	r.json(t, &u)
	got := usageRows(u, map[uuid.UUID]string{a1.ID: "a1"})
	want := []string{
		day(0) + " a1 authentication regular BR 3 3 0.0945",
		day(0) + " a1 marketing regular GB 1 1 null",
		day(0) + " a1 marketing regular US 7 7 0.1750",
		day(0) + " a1 service free_customer_service IN 4 0 0.0000",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("rows:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if u.Totals.Cost == nil || *u.Totals.Cost != "0.2695" || u.Totals.Billable != 11 {
		t.Fatalf("totals: %+v", u.Totals)
	}
	r = e.do("GET", "/usage?format=csv", e.keyA, "")
	if !strings.Contains(string(r.body), ",GB,1,1,\n") || !strings.Contains(string(r.body), ",US,7,7,0.1750\n") {
		t.Fatalf("csv: %s", r.body)
	}
}

// TestUsageJSON: the usage's hand-written JSON is encoding/json's of the Usage (without HTML
// escaping), whatever text a category holds, with and without a rate card.
func TestUsageJSON(t *testing.T) {
	card, err := usage.ParseRateCard(strings.NewReader("country,category,price\nUS,unknown,1.5\nUS,marketing,0.0250\n"))
	if err != nil {
		t.Fatal(err)
	}
	d1, d2 := time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)
	rows := []store.UsageRow{
		{Day: d1, ChannelID: uuid.MustParse("0193a5e2-7c4d-7f1e-8a2b-3c4d5e6f7a8b"), Category: "mar\"ke\\ting\x01\n\t\r\b\f\x1f\x7f", PricingType: "régulier <&>", Country: "ZZ", Messages: 3, Billable: 3},
		{Day: d1, ChannelID: uuid.Nil, Category: "", PricingType: "unknown", Country: "US", Messages: 1, Billable: 0},
		{Day: d2, ChannelID: uuid.Nil, Category: "unknown", PricingType: "unknown", Country: "US", Messages: 7, Billable: 5},
	}
	for _, c := range []*usage.RateCard{nil, card} {
		for _, rs := range [][]store.UsageRow{rows, nil} {
			var want strings.Builder
			enc := json.NewEncoder(&want)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(managementapi.NewUsage(d1, d2, rs, c)); err != nil {
				t.Fatal(err)
			}
			if got := string(managementapi.AppendUsageJSON(nil, d1, d2, rs, c)); got != want.String() {
				t.Fatalf("appendUsageJSON:\n%s\nencoding/json:\n%s", got, want.String())
			}
		}
	}
}

// TestUsageCSVAsEncodingCSV: the CSV rows written by hand are byte for byte what encoding/csv
// writes, fields that need quotes included.
func TestUsageCSVAsEncodingCSV(t *testing.T) {
	card, err := usage.ParseRateCard(strings.NewReader("country,category,price\nUS,unknown,1.5\n"))
	if err != nil {
		t.Fatal(err)
	}
	d1 := time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	odd := []string{"", "plain", "a,b", `say "hi"`, "line\nbreak", "cr\rx", " lead", "\tlead", "\u00a0nbsp", `\.`, `x\.`, "régulier"}
	var rows []store.UsageRow
	for i, f := range odd {
		rows = append(rows, store.UsageRow{Day: d1, ChannelID: uuid.New(), Category: f, PricingType: odd[len(odd)-1-i], Country: "US", Messages: int64(i), Billable: -int64(i)})
	}
	rows = append(rows, store.UsageRow{Day: d1, Category: "unknown", PricingType: "unknown", Country: "US", Messages: 2, Billable: 2})
	u := managementapi.NewUsage(d1, d1, rows, card)
	var want strings.Builder
	cw := csv.NewWriter(&want)
	_ = cw.Write(managementapi.UsageCSVHeader)
	for _, r := range u.Rows {
		cost := ""
		if r.Cost != nil {
			cost = *r.Cost
		}
		_ = cw.Write([]string{r.Day, r.ChannelID.String(), r.Category, r.PricingType, r.Country, fmt.Sprint(r.Messages), fmt.Sprint(r.Billable), cost})
	}
	cw.Flush()
	var got strings.Builder
	if err := managementapi.WriteUsageCSV(&got, rows, card); err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() {
		t.Fatalf("WriteUsageCSV:\n%s\nencoding/csv:\n%s", got.String(), want.String())
	}
}
