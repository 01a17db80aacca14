package managementapi

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/store"
	"github.com/wabarelay/wabarelay/usage"
)

// Usage by pricing category (DESIGN §5c): GET /usage, in JSON or CSV.

// The usage window: UTC days, both bounds included.
const (
	// MaxUsageDays is the longest window a usage query may cover.
	MaxUsageDays = 92
	// DefaultUsageDays is the window of a query that names neither bound: the last 30 days,
	// today included.
	DefaultUsageDays = 30
	// UsageDateLayout is the layout of the usage's days (since, until, day).
	UsageDateLayout = "2006-01-02"
)

// Messages of the usage query's refusals.
const (
	MsgUsageWindow = "Usage window is longer than 92 days"
	MsgUsageOrder  = `"until" must not be before "since"`
	MsgUsageFormat = `"format" must be one of: json, csv`
)

// errUsageDate refuses a date parameter that is not YYYY-MM-DD.
func errUsageDate(name string) *Error {
	return unprocessable(`"%s" must be a date such as 2026-11-30 (YYYY-MM-DD, UTC)`, name)
}

// UsageQuery is a usage query as given: the query parameters of GET /usage, and the
// dashboard's usage page. Empty fields take their defaults.
type UsageQuery struct {
	// Since and Until are the first and last UTC day, YYYY-MM-DD, both included. Until
	// defaults to today, Since to DefaultUsageDays days ending on Until.
	Since, Until string
	// ChannelID keeps one channel of the org ("" for all, deleted channels included).
	ChannelID string
}

// Usage is the JSON form of an org's usage over a window.
type Usage struct {
	Since  string      `json:"since"`
	Until  string      `json:"until"`
	Rows   []UsageRow  `json:"rows"`
	Totals UsageTotals `json:"totals"`
}

// UsageRow is the JSON form of one bucket of the usage: the outgoing messages counted on a day,
// of a channel, under a pricing category and type, to a recipient country.
type UsageRow struct {
	Day         string    `json:"day"`
	ChannelID   uuid.UUID `json:"channel_id"`
	Category    string    `json:"category"`
	PricingType string    `json:"pricing_type"`
	Country     string    `json:"country"`
	Messages    int64     `json:"messages"`
	Billable    int64     `json:"billable"`
	// Cost is billable × the rate card's price of the country and category, a decimal string;
	// null without a rate card, or when the card lists no such price.
	Cost *string `json:"cost"`
}

// UsageTotals are the sums of a usage's rows. Cost is the sum of the rows' costs that are
// known (a row without a price adds nothing: compare billable with the priced rows); null
// without a rate card.
type UsageTotals struct {
	Messages int64   `json:"messages"`
	Billable int64   `json:"billable"`
	Cost     *string `json:"cost"`
}

// usageWindow resolves a query's days (see UsageQuery), checked in the order since, until, the
// order of the two, the window's length.
func usageWindow(q UsageQuery, now time.Time) (since, until time.Time, e *Error) {
	parse := func(name, v string) (time.Time, *Error) {
		t, err := time.Parse(UsageDateLayout, v)
		if err != nil {
			return t, errUsageDate(name)
		}
		return t, nil
	}
	if q.Since != "" {
		if since, e = parse("since", q.Since); e != nil {
			return
		}
	}
	y, m, d := now.UTC().Date()
	until = time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	if q.Until != "" {
		if until, e = parse("until", q.Until); e != nil {
			return
		}
	}
	if q.Since == "" {
		since = until.AddDate(0, 0, 1-DefaultUsageDays)
	}
	switch {
	case until.Before(since):
		e = unprocessable("%s", MsgUsageOrder)
	case until.Sub(since) >= MaxUsageDays*24*time.Hour:
		e = unprocessable("%s", MsgUsageWindow)
	}
	return
}

// Usage returns the org's usage by pricing category over a window of UTC days (DESIGN §5c), its
// rows ordered by day, channel id, category, pricing type and country, priced by the rate card
// (Options.RateCard). A channel_id that names no channel of the org is 404 Channel not found.
func (s *Service) Usage(ctx context.Context, p Principal, q UsageQuery) (Usage, error) {
	since, until, rows, err := s.usageRows(ctx, p, q)
	if err != nil {
		return Usage{}, err
	}
	return newUsage(since, until, rows, s.opt.RateCard), nil
}

// usageRows checks a usage query and reads its window's stored rows.
func (s *Service) usageRows(ctx context.Context, p Principal, q UsageQuery) (since, until time.Time, rows []store.UsageRow, err error) {
	since, until, e := usageWindow(q, time.Now())
	if e != nil {
		return since, until, nil, e
	}
	f := store.UsageFilter{Since: since, Until: until}
	if q.ChannelID != "" {
		if f.ChannelID, err = id(q.ChannelID, MsgChannelNotFound); err != nil {
			return since, until, nil, err
		}
	}
	if rows, err = s.opt.Store.Usage(ctx, p.Key.OrgID, f); err != nil {
		return since, until, nil, s.storeError(err)
	}
	return since, until, rows, nil
}

// newUsage prices stored usage rows with card (nil: no costs).
func newUsage(since, until time.Time, rows []store.UsageRow, card *usage.RateCard) Usage {
	out := Usage{Since: since.Format(UsageDateLayout), Until: until.Format(UsageDateLayout), Rows: make([]UsageRow, len(rows))}
	total := card.Total()
	var lastDay time.Time
	var dayText string // (rows come day by day: each day's text made once)
	for i, r := range rows {
		if i == 0 || !r.Day.Equal(lastDay) {
			lastDay, dayText = r.Day, r.Day.Format(UsageDateLayout)
		}
		out.Rows[i] = UsageRow{Day: dayText, ChannelID: r.ChannelID, Category: r.Category,
			PricingType: r.PricingType, Country: r.Country, Messages: r.Messages, Billable: r.Billable}
		if cost, ok := total.Cost(r.Country, r.Category, r.Billable); ok {
			out.Rows[i].Cost = &cost
		}
		out.Totals.Messages += r.Messages
		out.Totals.Billable += r.Billable
	}
	if card != nil {
		t := total.String()
		out.Totals.Cost = &t
	}
	return out
}

// UsageCSVHeader is the first line of the usage in CSV.
var UsageCSVHeader = []string{"day", "channel_id", "category", "pricing_type", "country", "messages", "billable", "cost"}

// WriteUsageCSV writes the usage of stored rows priced by card (Usage's, as newUsage makes it)
// as CSV (RFC 4180, CRLF-free: one "\n" per line): the header line UsageCSVHeader, then one line
// per row in the rows' order, a null cost empty. Written as encoding/csv's Writer writes (a field
// quoted when it needs it), from the stored rows, without a record's strings per row: an org's
// window holds up to hundreds of thousands of rows (bench/usage).
func WriteUsageCSV(w io.Writer, rows []store.UsageRow, card *usage.RateCard) error {
	_, err := w.Write(appendUsageCSV(make([]byte, 0, 128+96*len(rows)), rows, card))
	return err
}

// appendUsageCSV appends WriteUsageCSV's bytes to b: built whole and written once, as the JSON
// (bench/usage: the download's p99 followed its writes).
func appendUsageCSV(b []byte, rows []store.UsageRow, card *usage.RateCard) []byte {
	for i, h := range UsageCSVHeader {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendCSVField(b, h)
	}
	b = append(b, '\n')
	total := card.Total()
	var lastDay time.Time
	var day [10]byte
	for i := range rows {
		r := &rows[i]
		if i == 0 || !r.Day.Equal(lastDay) {
			lastDay = r.Day
			r.Day.AppendFormat(day[:0], UsageDateLayout)
		}
		b = append(b, day[:]...)
		b = appendUUID(append(b, ','), r.ChannelID)
		b = appendCSVField(append(b, ','), r.Category)
		b = appendCSVField(append(b, ','), r.PricingType)
		b = appendCSVField(append(b, ','), r.Country)
		b = strconv.AppendInt(append(b, ','), r.Messages, 10)
		b = strconv.AppendInt(append(b, ','), r.Billable, 10)
		b = append(b, ',')
		// (a cost is digits and a point: never quoted)
		if c, ok := total.AppendCost(b, r.Country, r.Category, r.Billable); ok {
			b = c
		}
		b = append(b, '\n')
	}
	return b
}

// appendCSVField appends the CSV field f to b quoted as encoding/csv's Writer quotes it: when it
// holds a comma, a quote or a line break, starts with a space (unicode.IsSpace) or is `\.`; its
// quotes doubled.
func appendCSVField(b []byte, f string) []byte {
	if f == "" {
		return b
	}
	if r, _ := utf8.DecodeRuneInString(f); !strings.ContainsAny(f, ",\"\r\n") && !unicode.IsSpace(r) && f != `\.` {
		return append(b, f...)
	}
	b = append(b, '"')
	for i := 0; i < len(f); i++ {
		if f[i] == '"' {
			b = append(b, '"')
		}
		b = append(b, f[i])
	}
	return append(b, '"')
}

// usage answers GET /usage: JSON, or CSV with ?format=csv (text/csv, a download named after the
// window).
func (h *Handler) usage(q *call) {
	qs := q.r.URL.Query()
	format := qs.Get("format")
	if format != "" && format != "json" && format != "csv" {
		q.fail(unprocessable("%s", MsgUsageFormat))
		return
	}
	uq := UsageQuery{Since: qs.Get("since"), Until: qs.Get("until"), ChannelID: qs.Get("channel_id")}
	since, until, rows, err := h.svc.usageRows(q.ctx(), q.p, uq)
	if err != nil {
		q.fail(err)
		return
	}
	if format == "csv" {
		serveUsageCSV(q.w, since, until, rows, h.svc.opt.RateCard)
		return
	}
	// (as httpx.WriteJSON writes, encoded by hand from the stored rows: a window can hold a few
	// hundred thousand rows, which encoding/json takes several times longer to write; bench/usage)
	hdr := q.w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Content-Type-Options", "nosniff")
	q.w.WriteHeader(http.StatusOK)
	b := appendUsageJSON(make([]byte, 0, 256+200*len(rows)), since, until, rows, h.svc.opt.RateCard)
	_, _ = q.w.Write(b) // (a write error: the client has gone)
}

// appendUsageJSON appends the JSON form of the usage of stored rows priced by card (Usage's, as
// newUsage makes it) and a newline to b: encoding/json's bytes, but for its escaping of HTML
// characters and of U+2028 and U+2029 (valid JSON as they are).
func appendUsageJSON(b []byte, since, until time.Time, rows []store.UsageRow, card *usage.RateCard) []byte {
	b = append(b, `{"since":"`...)
	b = since.AppendFormat(b, UsageDateLayout)
	b = append(b, `","until":"`...)
	b = until.AppendFormat(b, UsageDateLayout)
	b = append(b, `","rows":[`...)
	total := card.Total()
	var messages, billable int64
	var lastDay time.Time
	var day [10]byte
	for i := range rows {
		r := &rows[i]
		if i > 0 {
			b = append(b, ',')
		}
		if i == 0 || !r.Day.Equal(lastDay) {
			lastDay = r.Day
			r.Day.AppendFormat(day[:0], UsageDateLayout)
		}
		b = append(b, `{"day":"`...)
		b = append(b, day[:]...)
		b = append(b, `","channel_id":"`...)
		b = appendUUID(b, r.ChannelID)
		b = append(b, `","category":`...)
		b = appendJSONString(b, r.Category)
		b = append(b, `,"pricing_type":`...)
		b = appendJSONString(b, r.PricingType)
		b = append(b, `,"country":`...)
		b = appendJSONString(b, r.Country)
		b = append(b, `,"messages":`...)
		b = strconv.AppendInt(b, r.Messages, 10)
		b = append(b, `,"billable":`...)
		b = strconv.AppendInt(b, r.Billable, 10)
		b = append(b, `,"cost":`...)
		n := len(b)
		var ok bool
		if b, ok = total.AppendCost(append(b, '"'), r.Country, r.Category, r.Billable); ok {
			b = append(b, '"')
		} else {
			b = append(b[:n], "null"...)
		}
		b = append(b, '}')
		messages += r.Messages
		billable += r.Billable
	}
	b = append(b, `],"totals":{"messages":`...)
	b = strconv.AppendInt(b, messages, 10)
	b = append(b, `,"billable":`...)
	b = strconv.AppendInt(b, billable, 10)
	b = append(b, `,"cost":`...)
	if card != nil {
		b = appendJSONString(b, total.String())
	} else {
		b = append(b, "null"...)
	}
	return append(b, "}}\n"...)
}

// appendUUID appends id in its canonical form (uuid.UUID.String's, without its allocation).
func appendUUID(b []byte, id uuid.UUID) []byte {
	const hex = "0123456789abcdef"
	for i, c := range id {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hex[c>>4], hex[c&0xf])
	}
	return b
}

// appendJSONString appends s as a JSON string: quotes, backslashes and control characters
// escaped, the rest (valid UTF-8, as the store keeps text) as it is.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// ServeUsageCSV answers GET /usage?format=csv for p and q: as Usage, written as a CSV download
// (text/csv; charset=utf-8, attachment usage-<since>-<until>.csv). A query Usage refuses is its
// error, nothing written.
func (s *Service) ServeUsageCSV(ctx context.Context, w http.ResponseWriter, p Principal, q UsageQuery) error {
	since, until, rows, err := s.usageRows(ctx, p, q)
	if err != nil {
		return err
	}
	serveUsageCSV(w, since, until, rows, s.opt.RateCard)
	return nil
}

// serveUsageCSV answers stored usage rows priced by card as a CSV download.
func serveUsageCSV(w http.ResponseWriter, since, until time.Time, rows []store.UsageRow, card *usage.RateCard) {
	w.Header().Set("Content-Type", "text/csv; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="usage-`+since.Format(UsageDateLayout)+`-`+until.Format(UsageDateLayout)+`.csv"`)
	w.WriteHeader(http.StatusOK)
	_ = WriteUsageCSV(w, rows, card) // (a write error: the client has gone)
}

// ChannelUsage is one channel's usage over a whole window, for the dashboard's table per
// channel: a row per category, pricing type and country (the days added up), and its totals.
type ChannelUsage struct {
	ChannelID uuid.UUID
	Rows      []UsageRow // Day empty
	Totals    UsageTotals
}

// UsageByChannel adds u's rows up per channel, and per category, pricing type and country
// within it, priced by the rate card (a price is per country and category, so the sum of a
// group's costs is its billable × the price). Channels and rows keep u's order.
func (s *Service) UsageByChannel(u Usage) []ChannelUsage {
	card := s.opt.RateCard
	type key struct{ cat, typ, country string }
	var out []ChannelUsage
	at := map[uuid.UUID]int{}
	rowAt := map[uuid.UUID]map[key]int{}
	for _, r := range u.Rows {
		ci, ok := at[r.ChannelID]
		if !ok {
			ci = len(out)
			at[r.ChannelID], rowAt[r.ChannelID] = ci, map[key]int{}
			out = append(out, ChannelUsage{ChannelID: r.ChannelID})
		}
		c := &out[ci]
		k := key{r.Category, r.PricingType, r.Country}
		ri, ok := rowAt[r.ChannelID][k]
		if !ok {
			ri = len(c.Rows)
			rowAt[r.ChannelID][k] = ri
			c.Rows = append(c.Rows, UsageRow{ChannelID: r.ChannelID, Category: r.Category, PricingType: r.PricingType, Country: r.Country})
		}
		c.Rows[ri].Messages += r.Messages
		c.Rows[ri].Billable += r.Billable
		c.Totals.Messages += r.Messages
		c.Totals.Billable += r.Billable
	}
	for i := range out {
		c := &out[i]
		total := card.Total()
		for j := range c.Rows {
			r := &c.Rows[j]
			if cost, ok := total.Cost(r.Country, r.Category, r.Billable); ok {
				r.Cost = &cost
			}
		}
		if card != nil {
			t := total.String()
			c.Totals.Cost = &t
		}
	}
	return out
}
