package ratelimit

import (
	"net/http"
	"testing"
	"time"
)

func TestDecisionSeconds(t *testing.T) {
	for _, tc := range []struct {
		d            time.Duration
		retry, reset int
	}{
		{0, 1, 0},
		{-time.Second, 1, 0},
		{time.Nanosecond, 1, 1},
		{999 * time.Millisecond, 1, 1},
		{time.Second, 1, 1},
		{time.Second + time.Microsecond, 2, 2},
		{59*time.Second + 400*time.Millisecond, 60, 60},
		{60 * time.Second, 60, 60},
	} {
		d := Decision{RetryAfter: tc.d, Reset: tc.d}
		if got := d.RetryAfterSeconds(); got != tc.retry {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.retry)
		}
		if got := d.ResetSeconds(); got != tc.reset {
			t.Errorf("ResetSeconds(%v) = %d, want %d", tc.d, got, tc.reset)
		}
	}
}

func TestDecisionSetHeaders(t *testing.T) {
	h := http.Header{}
	Decision{Allowed: true, Limit: 100, Remaining: 42, Reset: 1500 * time.Millisecond}.SetHeaders(h)
	want := map[string]string{"RateLimit-Limit": "100", "RateLimit-Remaining": "42", "RateLimit-Reset": "2", "Retry-After": ""}
	checkHeaders(t, h, want)

	h = http.Header{}
	Decision{Allowed: false, Limit: 100, Remaining: 0, RetryAfter: 200 * time.Millisecond, Reset: 200 * time.Millisecond}.SetHeaders(h)
	want = map[string]string{"RateLimit-Limit": "100", "RateLimit-Remaining": "0", "RateLimit-Reset": "1", "Retry-After": "1"}
	checkHeaders(t, h, want)
}

func checkHeaders(t *testing.T, h http.Header, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
}
