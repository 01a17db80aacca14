package dashboard

import (
	"strings"
	"testing"
)

// TestExplainError: each common upstream error code has its one-line explanation, naming what
// it means; other codes have none.
func TestExplainError(t *testing.T) {
	for code, want := range map[int]string{
		131047: "24-hour window",
		131026: "Undeliverable",
		130429: "Throughput",
		131056: "Pair rate",
		190:    "token dead",
		132001: "Template missing",
	} {
		got := explainError(code)
		if !strings.Contains(got, want) {
			t.Errorf("explainError(%d) = %q, want it to mention %q", code, got, want)
		}
		if strings.Contains(got, "\n") {
			t.Errorf("explainError(%d) spans lines: %q", code, got)
		}
	}
	if n := len(upstreamErrors); n != 6 {
		t.Errorf("%d codes explained, want the 6 common ones", n)
	}
	for _, code := range []int{0, 100, 131000, -1} {
		if got := explainError(code); got != "" {
			t.Errorf("explainError(%d) = %q, want none", code, got)
		}
	}
}
