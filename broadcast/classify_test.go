package broadcast

import (
	"errors"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/relay"
	"github.com/wabarelay/wabarelay/store"
)

// TestBroadcastClassify: each result of a send maps to the outcome the plan names.
func TestBroadcastClassify(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	answered := func(status, code int, title string) relay.SendResult {
		return relay.SendResult{Status: status, Answered: true, ErrorCode: code, ErrorTitle: title}
	}
	for _, c := range []struct {
		name    string
		attempt int
		res     relay.SendResult
		err     error
		want    store.BroadcastOutcome
	}{
		{"accepted", 1, relay.SendResult{Status: 200, Answered: true, WAMID: "wamid.A"}, nil,
			store.BroadcastOutcome{Kind: store.OutcomeAccepted, WAMID: "wamid.A"}},
		{"2xx without id", 1, relay.SendResult{Status: 200, Answered: true}, nil,
			store.BroadcastOutcome{Kind: store.OutcomeUnknown}},
		{"throughput", 1, answered(400, 130429, "Rate limit hit"), nil,
			store.BroadcastOutcome{Kind: store.OutcomeRetry, RetryAt: now.Add(4 * time.Second), ErrorCode: 130429, ErrorTitle: "Rate limit hit"}},
		{"pair rate, third attempt", 3, answered(400, 131056, "Pair rate limit hit"), nil,
			store.BroadcastOutcome{Kind: store.OutcomeRetry, RetryAt: now.Add(64 * time.Second), ErrorCode: 131056, ErrorTitle: "Pair rate limit hit"}},
		{"5xx", 2, answered(503, 131016, ""), nil,
			store.BroadcastOutcome{Kind: store.OutcomeRetry, RetryAt: now.Add(16 * time.Second), ErrorCode: 131016, ErrorTitle: "Service Unavailable"}},
		{"other upstream error", 1, answered(400, 131047, "Re-engagement message"), nil,
			store.BroadcastOutcome{Kind: store.OutcomeFailed, ErrorCode: 131047, ErrorTitle: "Re-engagement message"}},
		{"4xx without JSON", 1, answered(404, 0, ""), nil,
			store.BroadcastOutcome{Kind: store.OutcomeFailed, ErrorTitle: "Not Found"}},
		{"refused connection", 2, relay.SendResult{Status: 502, Outcome: relay.OutcomeUpstreamError, NotSent: true}, nil,
			store.BroadcastOutcome{Kind: store.OutcomeRetry, RetryAt: now.Add(16 * time.Second), ErrorTitle: relay.MsgUpstreamDown}},
		{"timeout", 1, relay.SendResult{Status: 504, Outcome: relay.OutcomeUpstreamError, TimedOut: true}, nil,
			store.BroadcastOutcome{Kind: store.OutcomeUnknown}},
		{"cut answer", 1, relay.SendResult{Status: 200, Outcome: relay.OutcomeUpstreamError, Aborted: true}, nil,
			store.BroadcastOutcome{Kind: store.OutcomeUnknown}},
		{"unreadable answer", 1, relay.SendResult{Status: 502, Outcome: relay.OutcomeUpstreamError}, nil,
			store.BroadcastOutcome{Kind: store.OutcomeUnknown}},
		{"local limit", 1, relay.SendResult{Status: 429, Outcome: relay.OutcomeRateLimited, RateLimited: true, NotSent: true, RetryAfter: 7 * time.Second}, nil,
			store.BroadcastOutcome{Kind: store.OutcomeRequeue, RetryAt: now.Add(7 * time.Second)}},
		{"dead token", 1, relay.SendResult{Status: 503, Outcome: relay.OutcomeDisconnected, NotSent: true, ErrorCode: 190}, nil,
			store.BroadcastOutcome{Kind: store.OutcomeDisconnected, ErrorCode: 190}},
		{"channel disconnected before", 1, relay.SendResult{Status: 503, Outcome: relay.OutcomeDisconnected, NotSent: true}, nil,
			store.BroadcastOutcome{Kind: store.OutcomeDisconnected}},
		{"channel inactive", 1, relay.SendResult{Status: 403, Outcome: relay.OutcomeInactive, NotSent: true}, nil,
			store.BroadcastOutcome{Kind: store.OutcomeCancel}},
		{"channel deleted", 1, relay.SendResult{}, store.ErrChannelNotFound,
			store.BroadcastOutcome{Kind: store.OutcomeCancel}},
		{"lookup failed", 1, relay.SendResult{}, errors.New("pg down"),
			store.BroadcastOutcome{Kind: store.OutcomeRequeue, RetryAt: now.Add(lookupRetry)}},
		{"no number", 1, relay.SendResult{Status: 403, Outcome: relay.OutcomeForbidden, NotSent: true}, nil,
			store.BroadcastOutcome{Kind: store.OutcomeFailed, ErrorTitle: relay.MsgPathNotAllowed}},
	} {
		if got := Classify(c.attempt, c.res, c.err, now); got != c.want {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
	for attempt, want := range map[int]time.Duration{0: 4 * time.Second, 1: 4 * time.Second, 5: 1024 * time.Second, 6: 4096 * time.Second} {
		if got := Backoff(attempt); got != want {
			t.Errorf("Backoff(%d) = %v, want %v", attempt, got, want)
		}
	}
}
