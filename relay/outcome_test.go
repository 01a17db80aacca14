package relay

import (
	"os"
	"strings"
	"testing"
)

// TestOutcomesDocumented: every outcome is distinct and listed under docs/relay.md's Metrics.
func TestOutcomesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/relay.md")
	if err != nil {
		t.Fatal(err)
	}
	_, metrics, _ := strings.Cut(string(doc), "\n## Metrics\n")
	metrics, _, _ = strings.Cut(metrics, "\n## ")
	listed := strings.NewReplacer("\n", " ", "(", " ", ")", " ").Replace(metrics)
	seen := map[Outcome]bool{}
	for _, o := range Outcomes() {
		if seen[o] {
			t.Errorf("outcome %q listed twice", o)
		}
		seen[o] = true
		if !strings.Contains(listed, " "+string(o)+",") && !strings.Contains(listed, " "+string(o)+" ") {
			t.Errorf("outcome %q is not listed in docs/relay.md#metrics", o)
		}
	}
}
