package testenv

import (
	"fmt"
	"testing"
	"time"
)

// pollEvery is how often Eventually checks its condition.
const pollEvery = 10 * time.Millisecond

// Eventually polls cond until it holds and returns how long that took; if it does not hold
// within timeout, the test fails with msgf (a format string and its arguments) or a generic
// message. Timeouts are deadlines for a failing test on a loaded machine, not timings to assert:
// make them generous.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msgf ...any) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			what := "condition"
			if len(msgf) > 0 {
				if f, ok := msgf[0].(string); ok {
					what = fmt.Sprintf(f, msgf[1:]...)
				}
			}
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(pollEvery)
	}
	return time.Since(start)
}
