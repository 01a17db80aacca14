package testenv

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// pollEvery is how often Eventually and Within check their condition.
const pollEvery = 10 * time.Millisecond

// Eventually polls cond until it holds and returns how long that took; if it does not hold
// within timeout, the test fails with msgf (a format string and its arguments) or a generic
// message. Timeouts are deadlines for a failing test on a loaded machine, not timings to assert:
// make them generous.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msgf ...any) time.Duration {
	t.Helper()
	start := time.Now()
	if !Within(timeout, cond) {
		what := "condition"
		if len(msgf) > 0 {
			if f, ok := msgf[0].(string); ok {
				what = fmt.Sprintf(f, msgf[1:]...)
			}
		}
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
	return time.Since(start)
}

// Within polls cond until it holds and reports whether it did within timeout: Eventually for a
// goroutine other than the test's, which must not call t.Fatal.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollEvery)
	}
	return true
}

// Parked returns how many goroutines are blocked in a select whose innermost function outside
// the runtime is one that match accepts; match gets the function's name as a stack trace prints
// it, without its arguments (for example "github.com/wabarelay/wabarelay/idempotency.(*Redis).begin").
// A test polls it (with Eventually or Within) to know that its calls are waiting, for a key's
// owner say, before it lets them go, instead of sleeping "long enough".
func Parked(match func(fn string) bool) int {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	for ; n == len(buf); n = runtime.Stack(buf, true) {
		buf = make([]byte, 2*len(buf))
	}
	parked := 0
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		lines := strings.Split(g, "\n")
		if !strings.Contains(lines[0], "[select") {
			continue
		}
		for _, line := range lines[1:] { // a function line, then its file line (indented)
			if strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "runtime.") {
				continue
			}
			if i := strings.LastIndexByte(line, '('); i > 0 {
				line = line[:i]
			}
			if match(line) {
				parked++
			}
			break
		}
	}
	return parked
}
