package dashboard

import (
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/managementapi"
)

// The usage page (DESIGN §5c "Usage by pricing category"): the org's outgoing messages by
// pricing category over a window of UTC days — daily bars by category, a table per channel,
// and the rows as a CSV download — read through the API's Service (Service.Usage), so its
// window, checks and messages are GET /usage's.

// usageData is what the usage page shows.
type usageData struct {
	// Since, Until and ChannelID are the window shown (the form's values).
	Since, Until, ChannelID string
	Channels                []managementapi.Channel // the org's channels, for the filter and names
	Usage                   managementapi.Usage
	Chart                   template.HTML
	Tables                  []usageTable
	CSVURL                  string
}

// usageTable is one channel's table.
type usageTable struct {
	Name string // the channel's name, or its id when it was deleted
	managementapi.ChannelUsage
}

// usageQuery is the usage query of a page or download request's parameters.
func usageQuery(r *http.Request) managementapi.UsageQuery {
	q := r.URL.Query()
	return managementapi.UsageQuery{Since: formText(q.Get("since")), Until: formText(q.Get("until")), ChannelID: q.Get("channel_id")}
}

// usage serves the usage page. A window the API refuses is said on the page, which then shows
// the default window.
func (h *Handler) usage(w http.ResponseWriter, r *http.Request, s *session) {
	p := page{Session: s, Title: "Usage", Nav: "usage"}
	status := http.StatusOK
	q := usageQuery(r)
	u, err := h.opt.API.Usage(r.Context(), h.principal(r, s), q)
	if e, ok := errors.AsType[*managementapi.Error](err); ok && e.Status == http.StatusUnprocessableEntity {
		p.Error, status = e.Message, e.Status
		q = managementapi.UsageQuery{ChannelID: q.ChannelID}
		u, err = h.opt.API.Usage(r.Context(), h.principal(r, s), q)
	}
	if err != nil {
		h.readError(w, r, s, err)
		return
	}
	channels, err := h.opt.API.ListChannels(r.Context(), h.principal(r, s))
	if err != nil {
		h.readError(w, r, s, err)
		return
	}
	d := usageData{Since: u.Since, Until: u.Until, ChannelID: q.ChannelID, Channels: channels, Usage: u}
	d.Chart = renderUsageChart(u)
	names := map[uuid.UUID]string{}
	for _, c := range channels {
		names[c.ID] = c.Name
	}
	for _, c := range h.opt.API.UsageByChannel(u) {
		name, ok := names[c.ChannelID]
		if !ok {
			name = "Deleted channel " + c.ChannelID.String()
		}
		d.Tables = append(d.Tables, usageTable{Name: name, ChannelUsage: c})
	}
	csvq := url.Values{"since": {u.Since}, "until": {u.Until}}
	if q.ChannelID != "" {
		csvq.Set("channel_id", q.ChannelID)
	}
	d.CSVURL = h.opt.BasePath + "/usage.csv?" + csvq.Encode()
	p.Data = d
	h.render(w, r, status, "usage", p)
}

// usageCSV serves the usage as a CSV download: GET /usage?format=csv's answer.
func (h *Handler) usageCSV(w http.ResponseWriter, r *http.Request, s *session) {
	if err := h.opt.API.ServeUsageCSV(r.Context(), w, h.principal(r, s), usageQuery(r)); err != nil {
		h.readError(w, r, s, err)
	}
}

// usageCategoryClasses is how many categories the chart colours apart; the rest are added up
// as "other".
const usageCategoryClasses = 6

// renderUsageChart draws u's messages per day as bars stacked by category (the categories with
// the most messages first; beyond usageCategoryClasses, "other"), one bar per day of the window,
// with the legend below it.
func renderUsageChart(u managementapi.Usage) template.HTML {
	since, err1 := time.Parse(managementapi.UsageDateLayout, u.Since)
	until, err2 := time.Parse(managementapi.UsageDateLayout, u.Until)
	if err1 != nil || err2 != nil || until.Before(since) {
		return ""
	}
	n := int(until.Sub(since)/(24*time.Hour)) + 1
	totals := map[string]int64{}
	for _, r := range u.Rows {
		totals[r.Category] += r.Messages
	}
	cats := make([]string, 0, len(totals))
	for c := range totals {
		cats = append(cats, c)
	}
	slices.SortFunc(cats, func(a, b string) int {
		if totals[a] != totals[b] {
			if totals[a] > totals[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	class := map[string]int{}
	labels := cats
	if len(cats) > usageCategoryClasses {
		labels = append(slices.Clone(cats[:usageCategoryClasses-1]), "other")
	}
	for i, c := range cats {
		class[c] = min(i, len(labels)-1)
	}
	bars := make([][]float64, n) // day → class → messages
	for i := range bars {
		bars[i] = make([]float64, len(labels))
	}
	for _, r := range u.Rows {
		d, err := time.Parse(managementapi.UsageDateLayout, r.Day)
		if err != nil {
			continue
		}
		if i := int(d.Sub(since) / (24 * time.Hour)); i >= 0 && i < n {
			bars[i][class[r.Category]] += float64(r.Messages)
		}
	}
	peak := 1.0
	for _, b := range bars {
		var sum float64
		for _, v := range b {
			sum += v
		}
		peak = maxf(peak, sum)
	}
	title := fmt.Sprintf("Outgoing messages per day by pricing category, %s to %s", u.Since, u.Until)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart usage" role="img" aria-label="%s">`, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<title>%s</title>`, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<svg width="100%%" height="%.0f" viewBox="0 0 %.0f %.0f" preserveAspectRatio="none">`, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<line class="axis" x1="0" y1="%.1f" x2="%.0f" y2="%.1f"/>`, chartH, chartW, chartH)
	slot := chartW / float64(n)
	for i, day := range bars {
		y := chartH
		for c, v := range day {
			if v == 0 {
				continue
			}
			hgt := v / peak * (chartH - 2*chartPad)
			y -= hgt
			fmt.Fprintf(&b, `<rect class="bar c%d" x="%.2f" y="%.2f" width="%.2f" height="%.2f"><title>%s %s: %.0f</title></rect>`,
				c, float64(i)*slot+slot*0.1, y, slot*0.8, hgt,
				since.AddDate(0, 0, i).Format(managementapi.UsageDateLayout), template.HTMLEscapeString(labels[c]), v)
		}
	}
	b.WriteString(`</svg>`)
	fmt.Fprintf(&b, `<text class="label" x="2" y="%.0f">%s</text>`, chartH+14, u.Since)
	fmt.Fprintf(&b, `<text class="label" x="100%%" dx="-2" y="%.0f" text-anchor="end">%s</text>`, chartH+14, u.Until)
	fmt.Fprintf(&b, `<text class="label" x="2" y="12">peak %.0f/day</text>`, peak)
	b.WriteString(`</svg><ul class="chart-legend">`)
	for i, l := range labels {
		fmt.Fprintf(&b, `<li class="c%d">%s</li>`, i, template.HTMLEscapeString(l))
	}
	b.WriteString(`</ul>`)
	return template.HTML(b.String())
}
