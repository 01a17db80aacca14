package dashboard

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/skip2/go-qrcode"

	"github.com/wabarelay/wabarelay/store"
)

// chartBucket is the width of one latency point.
const chartBucket = 15 * time.Minute

// charts are a webhook's last 24 h as server-rendered SVG, with a text summary for readers
// that do not see them.
type charts struct {
	Outcomes  template.HTML
	Latency   template.HTML
	Succeeded int
	Failed    int
	P50, P99  string
}

// Chart geometry: the lines' viewBox, which the page stretches to its width, under 16 px of labels.
const (
	chartW, chartH = 720.0, 160.0
	chartPad       = 4.0
)

// renderCharts draws attempts per minute by outcome and latency p50/p99 per bucket over the 24 h
// ending at now.
func renderCharts(now time.Time, minutes []store.DeliveryMinute, buckets []store.LatencyBucket) charts {
	start := now.Add(-24 * time.Hour).Truncate(time.Minute)
	const n = 24 * 60
	ok, bad := make([]float64, n), make([]float64, n)
	var c charts
	max := 1.0
	for _, m := range minutes {
		i := int(m.Minute.Sub(start) / time.Minute)
		if i < 0 || i >= n {
			continue
		}
		ok[i], bad[i] = float64(m.Succeeded), float64(m.Failed)
		c.Succeeded += m.Succeeded
		c.Failed += m.Failed
		max = maxf(max, ok[i], bad[i])
	}
	c.Outcomes = svgChart("Delivery attempts per minute, last 24 hours", fmt.Sprintf("peak %.0f/min", max), max,
		series{"ok", "succeeded (2xx)", ok}, series{"bad", "failed", bad})

	nb := int(24 * time.Hour / chartBucket)
	p50, p99 := make([]float64, nb), make([]float64, nb)
	lmax := 1.0
	var total, weighted50, worst99 float64
	for _, b := range buckets {
		i := int(b.Start.Sub(start) / chartBucket)
		if i < 0 || i >= nb {
			continue
		}
		p50[i], p99[i] = b.P50MS, b.P99MS
		lmax = maxf(lmax, b.P99MS)
		total += float64(b.Attempts)
		weighted50 += b.P50MS * float64(b.Attempts)
		worst99 = maxf(worst99, b.P99MS)
	}
	c.Latency = svgChart("Attempt latency per 15 minutes (p50 and p99), last 24 hours", fmt.Sprintf("max %.0f ms", lmax), lmax,
		series{"p50", "p50", p50}, series{"p99", "p99", p99})
	c.P50, c.P99 = "—", "—"
	if total > 0 {
		c.P50 = fmt.Sprintf("%.0f ms", weighted50/total)
		c.P99 = fmt.Sprintf("%.0f ms", worst99)
	}
	return c
}

// sendCharts are a channel's sends of the last 24 h as a server-rendered SVG chart, with the
// totals as text for readers that do not see it.
type sendCharts struct {
	Outcomes                                template.HTML
	OK, UpstreamError, RateLimited, Refused int
}

// renderSendCharts draws a channel's relay calls per minute by outcome (2xx, upstream error,
// 429, refused by the relay) over the 24 h ending at now: 1,440 minutes, the last one now's, so
// that the calls of the current minute are shown.
func renderSendCharts(now time.Time, minutes []store.SendMinute) sendCharts {
	const n = 24 * 60
	start := now.Truncate(time.Minute).Add(-(n - 1) * time.Minute)
	ok, upstream, limited, refused := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	var c sendCharts
	max := 1.0
	for _, m := range minutes {
		i := int(m.Minute.Sub(start) / time.Minute)
		if i < 0 || i >= n {
			continue
		}
		ok[i], upstream[i], limited[i], refused[i] = float64(m.OK), float64(m.UpstreamError), float64(m.RateLimited), float64(m.Refused)
		c.OK += m.OK
		c.UpstreamError += m.UpstreamError
		c.RateLimited += m.RateLimited
		c.Refused += m.Refused
		max = maxf(max, ok[i], upstream[i], limited[i], refused[i])
	}
	c.Outcomes = svgChart("Sends per minute by outcome, last 24 hours", fmt.Sprintf("peak %.0f/min", max), max,
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

// svgChart draws series as polylines on a shared scale. Everything in it is numbers or fixed
// text, escaped, so it is safe HTML. The outer SVG is in CSS pixels, so its text keeps its shape
// at any width; only the inner one, holding the lines, stretches to the width.
func svgChart(title, scale string, max float64, ss ...series) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" role="img" aria-label="%s">`, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<title>%s</title>`, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<svg width="100%%" height="%.0f" viewBox="0 0 %.0f %.0f" preserveAspectRatio="none">`, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<line class="axis" x1="0" y1="%.1f" x2="%.0f" y2="%.1f"/>`, chartH, chartW, chartH)
	for _, s := range ss {
		n := len(s.values)
		fmt.Fprintf(&b, `<polyline class="line %s" points="`, s.class)
		for i, v := range s.values {
			x := float64(i) * chartW / float64(n-1)
			y := chartH - chartPad - v/max*(chartH-2*chartPad)
			fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
		}
		b.WriteString(`"/>`)
	}
	b.WriteString(`</svg>`)
	fmt.Fprintf(&b, `<text class="label" x="2" y="%.0f">24 h ago</text>`, chartH+14)
	fmt.Fprintf(&b, `<text class="label" x="100%%" dx="-2" y="%.0f" text-anchor="end">now</text>`, chartH+14)
	fmt.Fprintf(&b, `<text class="label" x="2" y="12">%s</text>`, template.HTMLEscapeString(scale))
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
