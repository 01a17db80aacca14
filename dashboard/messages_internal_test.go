package dashboard

import (
	"strings"
	"testing"
	"time"
)

// TestFmtDuration: durations written for people, under a millisecond in µs (never "0 ms" for
// a time that was not nothing), a negative one as none.
func TestFmtDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-300 * time.Millisecond: "0 ms",
		0:                       "0 ms",
		400 * time.Nanosecond:   "<1 µs",
		420 * time.Microsecond:  "420 µs",
		87*time.Millisecond + 400*time.Microsecond: "87 ms",
		2400 * time.Millisecond:                    "2.4 s",
		3*time.Minute + 5*time.Second:              "3 min 5 s",
		2*time.Hour + 10*time.Minute:               "2 h 10 min",
		76 * time.Hour:                             "3 d 4 h",
	} {
		if got := fmtDuration(d); got != want {
			t.Errorf("fmtDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestTimeSteps: each step gets the time since the one before (a status stamped in the relay
// call's second counts as none), a step of unknown time gets none and is left out of the total.
func TestTimeSteps(t *testing.T) {
	at := time.Date(2026, 11, 20, 10, 0, 0, 700_000_000, time.UTC)
	steps := []step{
		{Kind: "relay", At: at},
		{Kind: "sent", At: at.Truncate(time.Second)}, // upstream timestamps have whole seconds
		{Kind: "delivered", At: at.Add(2 * time.Second)},
		{Kind: "read"}, // no timestamp
		{Kind: "failed", At: at.Add(time.Minute)},
	}
	total := timeSteps(steps)
	var since []string
	for _, s := range steps {
		since = append(since, s.Since)
	}
	if got := strings.Join(since, "|"); got != "|0 ms|2.7 s||" {
		t.Errorf("since = %q", got)
	}
	if total != "1 min 0 s" {
		t.Errorf("total = %q, want 1 min 0 s", total)
	}
	if got := timeSteps([]step{{At: at}, {}}); got != "" {
		t.Errorf("total of one timed step = %q, want none", got)
	}
}

// TestCount: one thing, or many.
func TestCount(t *testing.T) {
	for n, want := range map[int]string{0: "0 upstream errors", 1: "1 upstream error", 2: "2 upstream errors"} {
		if got := count(n, "upstream error", "upstream errors"); got != want {
			t.Errorf("count(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestFmtMS: a delivery attempt's whole milliseconds, 0 as under one.
func TestFmtMS(t *testing.T) {
	for ms, want := range map[int]string{0: "<1 ms", 1: "1 ms", 35: "35 ms", 1234: "1.2 s"} {
		if got := fmtMS(ms); got != want {
			t.Errorf("fmtMS(%d) = %q, want %q", ms, got, want)
		}
	}
}

// TestNiceCeil: a chart's top is the smallest of 1, 2, 5 × 10ⁿ holding its tallest bar.
func TestNiceCeil(t *testing.T) {
	for v, want := range map[float64]float64{0: 1, 0.4: 1, 1: 1, 1.5: 2, 3: 5, 5: 5, 7: 10, 10: 10, 11: 20, 480: 500, 501: 1000} {
		if got := niceCeil(v); got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", v, got, want)
		}
	}
}
