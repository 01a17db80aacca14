package dashboard

import (
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/skip2/go-qrcode"

	"github.com/wabarelay/wabarelay/store"
)

// A chart shows one of chartRanges, chosen with the page's ?range= (default defaultRange), as
// bars of chartRange.Bucket each: 60 of a minute over an hour, 96 of 15 minutes over 24 hours,
// 168 of an hour over 7 days, so that a burst is a bar as wide as its bucket, never a one-pixel
// spike, and the height is scaled to the tallest bar. The last bar is the bucket holding now:
// the current minute counts (chartRange.window).

// chartRange is a span of time the charts can show.
type chartRange struct {
	// Name is the ?range= value; Label says the span in words ("24 hours"), Ago its start ("24 h").
	Name, Label, Ago string
	// Span is how far back the chart reaches; Bucket is one bar's width, a divisor of Span.
	Span, Bucket time.Duration
	// Per names a bucket in the charts' units ("minute", "15 minutes", "hour").
	Per string
}

// chartRanges are the ranges offered, in the order of their links.
var chartRanges = []chartRange{
	{Name: "1h", Label: "hour", Ago: "1 h", Span: time.Hour, Bucket: time.Minute, Per: "minute"},
	{Name: "24h", Label: "24 hours", Ago: "24 h", Span: 24 * time.Hour, Bucket: 15 * time.Minute, Per: "15 minutes"},
	{Name: "7d", Label: "7 days", Ago: "7 d", Span: 7 * 24 * time.Hour, Bucket: time.Hour, Per: "hour"},
}

// defaultRange is the range of a page without ?range= (or with one it does not know).
const defaultRange = "24h"

// parseRange returns the chart range named v, or the default one.
func parseRange(v string) chartRange {
	for _, cr := range chartRanges {
		if cr.Name == v {
			return cr
		}
	}
	return parseRange(defaultRange)
}

// window returns the start of the chart's first bucket and how many buckets it has: the last
// one is the bucket holding now, so what happened in the current minute is drawn and counted.
func (cr chartRange) window(now time.Time) (start time.Time, n int) {
	n = int(cr.Span / cr.Bucket)
	return now.UTC().Truncate(cr.Bucket).Add(-time.Duration(n-1) * cr.Bucket), n
}

// since is the start of the chart's data: the first bucket's start.
func (cr chartRange) since(now time.Time) time.Time {
	start, _ := cr.window(now)
	return start
}

// rangeLink is one of a chart's range links.
type rangeLink struct {
	Label, URL string
	Current    bool
}

// rangeLinks are the links to the page at path with each chart range, keeping the other query
// parameters (filters, cursors) of a GET of it; after a form's POST, only the range.
func rangeLinks(r *http.Request, path string, cur chartRange) []rangeLink {
	out := make([]rangeLink, len(chartRanges))
	for i, cr := range chartRanges {
		q := url.Values{}
		if r.Method == http.MethodGet {
			q = r.URL.Query()
		}
		q.Set("range", cr.Name)
		out[i] = rangeLink{Label: cr.Ago, URL: path + "?" + q.Encode(), Current: cr.Name == cur.Name}
	}
	return out
}

// charts are a webhook's delivery attempts over a range as server-rendered SVG, with a text
// summary for readers that do not see them.
type charts struct {
	Range     chartRange
	Ranges    []rangeLink
	Outcomes  template.HTML
	Latency   template.HTML
	Succeeded int
	Failed    int
	P50, P99  string
}

// Chart geometry: the bars' viewBox, which the page stretches to its width, under 16 px of labels.
const (
	chartW, chartH = 720.0, 160.0
	chartPad       = 4.0
)

// renderCharts draws attempts per bucket by outcome (stacked bars) and their latency p50 and
// p99 per bucket over cr ending with now's bucket.
func renderCharts(now time.Time, cr chartRange, buckets []store.DeliveryBucket) charts {
	start, n := cr.window(now)
	ok, bad := make([]float64, n), make([]float64, n)
	p50, p99 := make([]float64, n), make([]float64, n)
	c := charts{Range: cr}
	var total, weighted50, worst99 float64
	for _, b := range buckets {
		i, in := slot(start, cr.Bucket, n, b.Start)
		if !in {
			continue
		}
		ok[i], bad[i] = float64(b.Succeeded), float64(b.Failed)
		p50[i], p99[i] = b.P50MS, b.P99MS
		c.Succeeded += b.Succeeded
		c.Failed += b.Failed
		attempts := float64(b.Succeeded + b.Failed)
		total += attempts
		weighted50 += b.P50MS * attempts
		worst99 = maxf(worst99, b.P99MS)
	}
	c.Outcomes = barChart(fmt.Sprintf("Delivery attempts per %s, last %s", cr.Per, cr.Label), cr.axis(), "/"+shortPer(cr), true,
		series{"ok", "succeeded (2xx)", ok}, series{"bad", "failed", bad})
	c.Latency = barChart(fmt.Sprintf("Attempt latency per %s (p50 and p99), last %s", cr.Per, cr.Label), cr.axis(), " ms", false,
		series{"p99", "p99", p99}, series{"p50", "p50", p50})
	c.P50, c.P99 = "—", "—"
	if total > 0 {
		c.P50 = fmt.Sprintf("%.0f ms", weighted50/total)
		c.P99 = fmt.Sprintf("%.0f ms", worst99)
	}
	return c
}

// slot returns the index of the bucket starting at t among n from start, and whether it is one.
func slot(start time.Time, bucket time.Duration, n int, t time.Time) (int, bool) {
	if t.Before(start) {
		return 0, false
	}
	i := int(t.Sub(start) / bucket)
	return i, i < n
}

// shortPer is a bucket in the scale's short form: "min", "15 min", "h".
func shortPer(cr chartRange) string {
	switch cr.Bucket {
	case time.Minute:
		return "min"
	case time.Hour:
		return "h"
	}
	return fmt.Sprintf("%.0f min", cr.Bucket.Minutes())
}

// sendCharts are a channel's sends over a range as a server-rendered SVG chart, with the
// totals as text for readers that do not see it.
type sendCharts struct {
	Range                                   chartRange
	Ranges                                  []rangeLink
	Outcomes                                template.HTML
	OK, UpstreamError, RateLimited, Refused int
}

// renderSendCharts draws a channel's relay calls per bucket by outcome (2xx, upstream error,
// 429, refused by the relay) as stacked bars over cr ending with now's bucket, so that the calls
// of the current minute are shown and counted.
func renderSendCharts(now time.Time, cr chartRange, minutes []store.SendMinute) sendCharts {
	start, n := cr.window(now)
	ok, upstream, limited, refused := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	c := sendCharts{Range: cr}
	for _, m := range minutes {
		i, in := slot(start, cr.Bucket, n, m.Minute)
		if !in {
			continue
		}
		ok[i], upstream[i], limited[i], refused[i] = float64(m.OK), float64(m.UpstreamError), float64(m.RateLimited), float64(m.Refused)
		c.OK += m.OK
		c.UpstreamError += m.UpstreamError
		c.RateLimited += m.RateLimited
		c.Refused += m.Refused
	}
	c.Outcomes = barChart(fmt.Sprintf("Sends per %s by outcome, last %s", cr.Per, cr.Label), cr.axis(), "/"+shortPer(cr), true,
		series{"ok", "2xx", ok}, series{"upstream", "upstream error", upstream},
		series{"limited", "429", limited}, series{"refused", "refused", refused})
	return c
}

type series struct {
	class, label string
	values       []float64
}

// legendInSVG is the most series whose legend fits in the chart's top line beside its scale on
// a 320 px screen; a chart of more has its legend below it, in HTML, where it wraps.
const legendInSVG = 2

// niceCeil is the smallest of 1, 2, 5, 10, 20, 50, … at least v (v > 0): the chart's top.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// chartAxis are a bar chart's texts: the labels under its first and last bar, and what it says
// when it has nothing to draw.
type chartAxis struct {
	From, To, Empty string
}

// axis is the chart axis of a range ending now.
func (cr chartRange) axis() chartAxis {
	return chartAxis{From: cr.Ago + " ago", To: "now", Empty: "nothing in the last " + cr.Label}
}

// barChart draws series as bars, one per value (bucket of time): stacked (the bars of a bucket add up)
// or, unstacked, drawn over each other in order (the first the tallest, as p99 behind p50). The
// height is scaled to the tallest bar, rounded up to 1, 2 or 5 × 10ⁿ, written at the top with
// unit; a bucket with a value has a bar of at least one unit of height, so that a single event
// among thousands is seen. Everything in it is numbers or fixed text, escaped, so it is safe
// HTML. The outer SVG is in CSS pixels, so its text keeps its shape at any width; only the inner
// one, holding the bars, stretches to the width.
func barChart(title string, axis chartAxis, unit string, stacked bool, ss ...series) template.HTML {
	n := len(ss[0].values)
	peak, any := 0.0, false
	for i := range n {
		sum := 0.0
		for _, s := range ss {
			v := s.values[i]
			any = any || v > 0
			if stacked {
				sum += v
			} else {
				sum = maxf(sum, v)
			}
		}
		peak = maxf(peak, sum)
	}
	top := niceCeil(peak)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" role="img" aria-label="%s">`, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<title>%s</title>`, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<svg width="100%%" height="%.0f" viewBox="0 0 %.0f %.0f" preserveAspectRatio="none">`, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<line class="grid" x1="0" y1="%.1f" x2="%.0f" y2="%.1f"/>`, chartPad+12, chartW, chartPad+12)
	fmt.Fprintf(&b, `<line class="axis" x1="0" y1="%.1f" x2="%.0f" y2="%.1f"/>`, chartH, chartW, chartH)
	w := chartW / float64(n)
	gap := 0.0
	if w >= 4 {
		gap = w * 0.15
	}
	usable := chartH - chartPad - 12
	for i := range n {
		y := chartH
		for _, s := range ss {
			v := s.values[i]
			if v <= 0 {
				continue
			}
			h := math.Max(v/top*usable, 1)
			if !stacked {
				y = chartH
			}
			y -= h
			fmt.Fprintf(&b, `<rect class="bar %s" x="%.2f" y="%.2f" width="%.2f" height="%.2f"/>`, s.class, float64(i)*w+gap/2, y, w-gap, h)
		}
	}
	b.WriteString(`</svg>`)
	fmt.Fprintf(&b, `<text class="label" x="2" y="%.0f">%s</text>`, chartH+14, template.HTMLEscapeString(axis.From))
	fmt.Fprintf(&b, `<text class="label" x="100%%" dx="-2" y="%.0f" text-anchor="end">%s</text>`, chartH+14, template.HTMLEscapeString(axis.To))
	fmt.Fprintf(&b, `<text class="label" x="2" y="12">%s%s</text>`, strconv.FormatFloat(top, 'f', -1, 64), template.HTMLEscapeString(unit))
	if !any {
		fmt.Fprintf(&b, `<text class="label nodata" x="50%%" y="%.0f" text-anchor="middle">%s</text>`, chartH/2+4, template.HTMLEscapeString(axis.Empty))
	}
	if len(ss) > legendInSVG {
		b.WriteString(`</svg><ul class="chart-legend">`)
		for _, s := range ss {
			fmt.Fprintf(&b, `<li class="%s">%s</li>`, s.class, template.HTMLEscapeString(s.label))
		}
		b.WriteString(`</ul>`)
		return template.HTML(b.String())
	}
	b.WriteString(`<text class="legend" x="100%" dx="-4" y="12" text-anchor="end">`)
	for i, s := range ss {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, `<tspan class="%s">■ %s</tspan>`, s.class, template.HTMLEscapeString(s.label))
	}
	b.WriteString(`</text></svg>`)
	return template.HTML(b.String())
}

func maxf(a float64, bs ...float64) float64 {
	for _, b := range bs {
		if b > a {
			a = b
		}
	}
	return a
}

// qrSVG draws content as a QR code in SVG (one path of dark modules), or nothing if it does
// not fit a QR code.
func qrSVG(content, label string) template.HTML {
	q, err := qrcode.New(content, qrcode.Medium)
	if err != nil {
		return ""
	}
	bm := q.Bitmap() // includes the quiet zone
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="qr" viewBox="0 0 %d %d" role="img" aria-label="%s" shape-rendering="crispEdges"><path d="`,
		len(bm), len(bm), template.HTMLEscapeString(label))
	for y, row := range bm {
		for x, dark := range row {
			if dark {
				fmt.Fprintf(&b, "M%d %dh1v1h-1z", x, y)
			}
		}
	}
	b.WriteString(`"/></svg>`)
	return template.HTML(b.String())
}
