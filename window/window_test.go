package window_test

import (
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/window"
)

// TestDecideBoundaries pins the rule to the second on a stub clock: open until exactly
// last_inbound_at + 24 h, closed from that instant; without a message, closed once the channel
// has been receiving for 24 h (the instant included), unknown before, and unknown for a channel
// that is not receiving.
func TestDecideBoundaries(t *testing.T) {
	clk := clock.NewStub(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	last := clk.Now().Add(-time.Hour)
	longAgo := clk.Now().Add(-72 * time.Hour)
	expires := last.Add(24 * time.Hour)

	check := func(what string, lastInbound, since time.Time, want window.State, wantExpires time.Time) {
		t.Helper()
		got, exp := window.Decide(lastInbound, since, clk.Now())
		if got != want || !exp.Equal(wantExpires) {
			t.Errorf("%s at %s: %s (expires %v), want %s (expires %v)", what, clk.Now().Format(time.RFC3339), got, exp, want, wantExpires)
		}
	}

	check("an hour after the message", last, longAgo, window.Open, expires)
	check("the message, a channel not receiving", last, time.Time{}, window.Open, expires)
	clk.Set(expires.Add(-time.Second))
	check("a second before the end", last, longAgo, window.Open, expires)
	clk.Set(expires)
	check("at the end", last, longAgo, window.Closed, expires)
	check("at the end, a channel not receiving", last, time.Time{}, window.Closed, expires)
	clk.Set(expires.Add(time.Second))
	check("a second after", last, longAgo, window.Closed, expires)

	// nothing received from the customer
	since := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clk.Set(since.Add(24*time.Hour - time.Second))
	check("receiving for 24 h minus a second", time.Time{}, since, window.Unknown, time.Time{})
	clk.Set(since.Add(24 * time.Hour))
	check("receiving for exactly 24 h", time.Time{}, since, window.Closed, time.Time{})
	clk.Advance(time.Second)
	check("receiving for 24 h and a second", time.Time{}, since, window.Closed, time.Time{})
	check("not receiving", time.Time{}, time.Time{}, window.Unknown, time.Time{})
}

// TestNormalizeWAID: '+', spaces and dashes are ignored; anything else is refused, as are no
// digit and more than 32.
func TestNormalizeWAID(t *testing.T) {
	for in, want := range map[string]string{
		"15550100": "15550100", "+1 555-0100": "15550100", "+15550100": "15550100", " 1-5 ": "15",
		"12345678901234567890123456789012": "12345678901234567890123456789012",
	} {
		if got, ok := window.NormalizeWAID(in); !ok || got != want {
			t.Errorf("NormalizeWAID(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "+", " - ", "1555a0100", "user.abc", "1555.0100", "(555)0100", "1555\x000100",
		"１５５５", "123456789012345678901234567890123"} {
		if got, ok := window.NormalizeWAID(in); ok {
			t.Errorf("NormalizeWAID(%q) = %q, accepted", in, got)
		}
	}
}
