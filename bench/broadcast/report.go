package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

// paceGoal is the issue's: the broadcast's achieved pace within 1% of its rate.
const paceGoal = 1.0

// pace is the broadcast's pace as the fake saw it.
type pace struct {
	n                 int
	first, last       time.Time
	perMinute, devPct float64
	minWin, maxWin    float64 // sends per minute of the slowest and fastest full 10-second window
	gaps              []time.Duration
}

func measurePace(sends []time.Time, rate int) pace {
	p := pace{n: len(sends)}
	if p.n < 2 {
		return p
	}
	slices.SortFunc(sends, func(a, b time.Time) int { return a.Compare(b) })
	p.first, p.last = sends[0], sends[p.n-1]
	p.perMinute = float64(p.n-1) / p.last.Sub(p.first).Minutes()
	p.devPct = (p.perMinute/float64(rate) - 1) * 100
	const win = 10 * time.Second
	full := int(p.last.Sub(p.first) / win)
	counts := make([]int, full)
	for i, t := range sends {
		if w := int(t.Sub(p.first) / win); w < full {
			counts[w]++
		}
		if i > 0 {
			p.gaps = append(p.gaps, t.Sub(sends[i-1]))
		}
	}
	for i, n := range counts {
		pm := float64(n) * float64(time.Minute/win)
		if i == 0 || pm < p.minWin {
			p.minWin = pm
		}
		p.maxWin = max(p.maxWin, pm)
	}
	slices.Sort(p.gaps)
	return p
}

// callStats summarises calls: how many, answered 2xx, 429, otherwise; latency p50/p99 in ms.
type callStats struct {
	n, ok, limited, other int
	p50, p99              float64
	perMinute             float64 // attempted per minute over span
}

func summarise(calls []call, span time.Duration) callStats {
	var s callStats
	var lat []time.Duration
	for _, c := range calls {
		s.n++
		switch {
		case c.status/100 == 2:
			s.ok++
		case c.status == 429:
			s.limited++
		default:
			s.other++
		}
		lat = append(lat, c.latency)
	}
	slices.Sort(lat)
	s.p50, s.p99 = benchkit.Quantile(lat, 0.5), benchkit.Quantile(lat, 0.99)
	if span > 0 {
		s.perMinute = float64(s.n) / span.Minutes()
	}
	return s
}

// checks collects the checks' lines.
type checks struct {
	ok    bool
	lines []string
}

func (c *checks) add(pass bool, format string, args ...any) {
	mark := "ok"
	if !pass {
		mark, c.ok = "FAILED", false
	}
	c.lines = append(c.lines, fmt.Sprintf("- %s: %s", mark, fmt.Sprintf(format, args...)))
}

// report prints the results as Markdown; it returns whether the checks passed.
func report(r *result) bool {
	c := r.c
	p := measurePace(r.sends, c.rate)
	var during []call // the callers' sends while the broadcast sent (first to last send)
	for _, cl := range r.calls {
		if !cl.at.Before(p.first) && !cl.at.After(p.last) {
			during = append(during, cl)
		}
	}
	span := p.last.Sub(p.first)
	lead := summarise(r.leadCalls, c.callerLead)
	dur := summarise(during, span)
	all := summarise(append(slices.Clone(r.leadCalls), r.calls...), 0)
	broadcast429 := r.refused429 - int64(all.limited)

	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	w("# Broadcast benchmark\n\n")
	w("`%s`\n\n", benchkit.CommandLine("broadcast"))
	w("%s. Load average (1, 5, 15 min): %s at start, %s at the end; the highest 1-minute figure seen while the broadcast sent: %.2f.\n\n",
		r.machine, r.loadStart, r.loadEnd, r.maxLoad)
	w("One Caddy: the relay with `rate_limit %d 1m` (relay log `per_channel %d`), the API, the broadcasts' sender (workers %s). ",
		c.limit, c.logPerChannel(), workersText(c))
	w("A broadcast of %d recipients at %d/min; callers at %d/min through the relay on the same channel, %d in flight at most, alone for %s first.\n\n",
		c.recipients, c.rate, c.callerRate, c.callerConc, c.callerLead)

	w("## Pace (the fake's record of the broadcast's sends)\n\n| measure | value |\n|---|--:|\n")
	w("| sends received | %d |\n", p.n)
	if p.n >= 2 {
		w("| first send after the broadcast's creation | %.0f ms |\n", benchkit.MS(p.first.Sub(r.created)))
		w("| first to last send | %.1f s (at the rate: %.1f s) |\n", span.Seconds(),
			(time.Duration(p.n-1) * time.Minute / time.Duration(c.rate)).Seconds())
		w("| **pace** | **%.1f /min** (rate %d: **%+.2f%%**) |\n", p.perMinute, c.rate, p.devPct)
		w("| slowest / fastest full 10 s window | %.0f / %.0f per min |\n", p.minWin, p.maxWin)
		w("| gap between sends p50 / p99 / max | %.1f / %.1f / %.1f ms (the rate's: %.1f ms) |\n",
			benchkit.Quantile(p.gaps, 0.5), benchkit.Quantile(p.gaps, 0.99), benchkit.MS(p.gaps[len(p.gaps)-1]),
			benchkit.MS(time.Minute/time.Duration(c.rate)))
		iv := time.Minute / time.Duration(c.rate)
		var long int
		var excess time.Duration
		for _, g := range p.gaps {
			if g > 2*iv {
				long++
				excess += g - iv
			}
		}
		w("| gaps longer than two intervals: how many, their time beyond one interval summed | %d, %.2f s (the span's excess over the rate's: %.2f s) |\n",
			long, excess.Seconds(), (span - time.Duration(p.n-1)*iv).Seconds())
		w("| completed (seen through the API, polled every %s) after the last send | %.1f s |\n", c.poll, r.done.Sub(p.last).Seconds())
	}
	w("| the relay's 429s to the broadcast's sends (relay_log + relay_counts, less the callers') | %d |\n", broadcast429)
	goal := "met"
	if p.devPct < -paceGoal || p.devPct > paceGoal {
		goal = "not met"
	}
	w("\nGoal: the pace within %.0f%% of the rate: **%s** (%+.2f%%).\n\n", paceGoal, goal, p.devPct)

	w("## The relay's callers\n\n| phase | sent | per min | 2xx | 429 | other | 2xx share | p50 ms | p99 ms |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	row := func(name string, s callStats) {
		perMin := "—"
		if s.perMinute > 0 {
			perMin = fmt.Sprintf("%.0f", s.perMinute)
		}
		w("| %s | %d | %s | %d | %d | %d | %.2f%% | %.1f | %.1f |\n", name, s.n, perMin, s.ok, s.limited, s.other,
			100*float64(s.ok)/float64(max(s.n, 1)), s.p50, s.p99)
	}
	row("alone (before the broadcast)", lead)
	row("while the broadcast sent (its first to last send)", dur)
	row("the whole run", all)
	if r.callerErrs != "" {
		w("\nCallers' errors other than 429: %s\n", r.callerErrs)
	}

	w("\n## Caddy's memory (VmRSS)\n\n| at start | at the broadcast's creation | peak while it sent (sampled every 250 ms) | at the end | VmHWM (the process's peak) |\n|--:|--:|--:|--:|--:|\n")
	w("| %.1f MB | %.1f MB | %.1f MB | %.1f MB | %.1f MB |\n", mb(r.rssStart), mb(r.rssCreate), mb(r.rssPeak), mb(r.rssEnd), mb(r.hwm))

	w("\n## Database growth\n\n`pg_database_size` before the broadcast's creation %s, after its end %s: **%s, %.0f bytes per recipient** (the callers' relay log rows of the same time included).\n\n",
		human(r.dbBefore), human(r.dbAfter), human(r.dbAfter-r.dbBefore), float64(r.dbAfter-r.dbBefore)/float64(c.recipients))
	w("| table (with its partitions, indexes, TOAST) | growth | per recipient |\n|---|--:|--:|\n")
	for _, t := range sizedTables {
		d := r.tablesAt[t] - r.tablesBefore[t]
		w("| %s | %s | %.0f B |\n", t, human(d), float64(d)/float64(c.recipients))
	}
	w("\nThe relay log at the end: %d rows and %d calls counted in relay_counts (refusals, calls above per_channel in a second) for %d callers' sends and %d broadcast sends.\n",
		r.relayLogRows, r.relayCounted, all.n, p.n)

	w("\n## CPU\n\n")
	perCaller := map[string]float64{}
	callsInBroadcast := 0
	for _, cl := range r.calls {
		if cl.at.Before(r.done) {
			callsInBroadcast++
		}
	}
	w("| process | µs per caller send (alone) | µs per broadcast send (its CPU during the broadcast, less %d caller sends at their cost) |\n|---|--:|--:|\n", callsInBroadcast)
	names := []string{"caddy", benchkit.PGBackends}
	for _, name := range names {
		perCaller[name] = float64(r.cpuLead[name].Microseconds()) / float64(max(lead.n, 1))
		bc := (float64(r.cpuBroadcast[name].Microseconds()) - perCaller[name]*float64(callsInBroadcast)) / float64(max(p.n, 1))
		w("| %s | %.0f | %.0f |\n", name, perCaller[name], bc)
	}
	w("\nTransactions committed in the bench database while the broadcast sent (pg_stat_database): %d, %.1f per broadcast send.\n",
		r.xactAfter-r.xactBefore, float64(r.xactAfter-r.xactBefore)/float64(max(p.n, 1)))
	w("\n(Over the broadcast in all: caddy %s, Postgres backends %s, over %s.)\n",
		r.cpuBroadcast["caddy"].Round(time.Millisecond), r.cpuBroadcast[benchkit.PGBackends].Round(time.Millisecond), r.done.Sub(r.created).Round(time.Millisecond))

	ck := checks{ok: true}
	ck.add(r.final.Status == "completed", "the broadcast's status: %s", r.final.Status)
	ck.add(r.none == 0 && r.more == 0 && r.once == c.recipients, "the fake's record: %d recipients sent exactly once, %d never, %d more than once (of %d)",
		r.once, r.none, r.more, c.recipients)
	ck.add(r.stray == 0, "template sends to numbers not in the broadcast: %d", r.stray)
	k := r.final.Counts
	ck.add(k.Total == c.recipients && k.Accepted+k.Sent+k.Delivered+k.Read == c.recipients && k.Queued == 0 && k.Failed == 0 && k.Unknown == 0,
		"the API's counts: total %d, queued %d, accepted %d, sent %d, delivered %d, read %d, failed %d, unknown %d",
		k.Total, k.Queued, k.Accepted, k.Sent, k.Delivered, k.Read, k.Failed, k.Unknown)
	ck.add(int64(all.ok) == r.callerAtFake, "the callers' 2xx answers %d, their sends at the fake %d", all.ok, r.callerAtFake)
	w("\n## Checks\n\n%s\n", strings.Join(ck.lines, "\n"))
	fmt.Print(sb.String())
	return ck.ok
}

func workersText(c config) string {
	if c.workers == 0 {
		return "4, the default"
	}
	return fmt.Sprint(c.workers)
}

func mb(kb int64) float64 { return float64(kb) / 1024 }

// human renders bytes as kB or MB.
func human(b int64) string {
	switch {
	case b >= 10<<20 || b <= -10<<20:
		return fmt.Sprintf("%.1f MB", float64(b)/(1<<20))
	default:
		return fmt.Sprintf("%.0f kB", float64(b)/1024)
	}
}
