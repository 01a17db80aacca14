// Package window decides the WhatsApp customer-service window (DESIGN §5c "Customer-service
// window"): a business may send a customer free-form messages for 24 hours after the customer's
// last message; outside it, only templates. The rule is one pure function, [Decide], used by the
// management API (GET /channels/{id}/contacts/{wa_id}), the dashboard and the relay
// (the Wabarelay-Window header and window_guard), so that they never disagree on the same facts.
package window

import "time"

// Length is how long a customer's window stays open after their last incoming message.
const Length = 24 * time.Hour

// State is a customer's window as the relay and the API name it.
type State string

// The window's states.
const (
	// Open: the customer wrote within the last 24 hours.
	Open State = "open"
	// Closed: the customer's last message is more than 24 hours old, or nothing was received
	// from them although the channel was receiving for the whole last 24 hours.
	Closed State = "closed"
	// Unknown: nothing was received from the customer, and the channel has not been receiving
	// for the whole last 24 hours (connected, reconnected or activated since, or the record of
	// incoming messages is younger than that).
	Unknown State = "unknown"
)

// Decide returns the window of a customer at now, and when it expires (or expired): the
// customer's newest incoming message's upstream timestamp lastInbound plus [Length]; zero when
// nothing was received from the customer (lastInbound zero).
//
// receivingSince is since when the channel has been receiving the customer's messages without
// interruption: zero when it is not (an inactive channel, one never connected). The window is
// open while now is before lastInbound + 24 h (open until that instant, closed from it on);
// without a lastInbound it is closed when the channel has been receiving since 24 h before now
// or earlier, else unknown.
func Decide(lastInbound, receivingSince, now time.Time) (State, time.Time) {
	if !lastInbound.IsZero() {
		expires := lastInbound.Add(Length)
		if now.Before(expires) {
			return Open, expires
		}
		return Closed, expires
	}
	if !receivingSince.IsZero() && !receivingSince.After(now.Add(-Length)) {
		return Closed, time.Time{}
	}
	return Unknown, time.Time{}
}

// MaxWAIDLen is the longest wa_id recorded or looked up, in digits: E.164 numbers have at most
// 15; the margin takes any longer upstream id made of digits.
const MaxWAIDLen = 32

// NormalizeWAID returns the customer id s names, digits only: '+', spaces and dashes are
// ignored (a number written as "+1 555-0100"). ok is false when anything else is not a digit,
// when no digit is left, or when more than MaxWAIDLen are.
func NormalizeWAID(s string) (waID string, ok bool) {
	if ValidWAID(s) {
		return s, true // the common case: already digits, no copy
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			b = append(b, c)
		case c == '+' || c == ' ' || c == '-':
		default:
			return "", false
		}
	}
	if len(b) == 0 || len(b) > MaxWAIDLen {
		return "", false
	}
	return string(b), true
}

// ValidWAID reports whether s is a recordable wa_id: 1 to MaxWAIDLen ASCII digits.
func ValidWAID(s string) bool {
	if len(s) == 0 || len(s) > MaxWAIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
