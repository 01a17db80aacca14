package benchkit

import (
	"math"
	"os"
	"strings"
	"time"
)

// MS returns d in milliseconds.
func MS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Quantile returns the p-quantile (0 < p ≤ 1, nearest rank) of sorted, in ms; 0 when empty.
func Quantile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return MS(sorted[max(i, 0)])
}

// CommandLine returns how this program was run, as `go run ./bench/<name> <args>` with each
// argument quoted for a shell where it needs to be.
func CommandLine(name string) string {
	args := []string{"go", "run", "./bench/" + name}
	for _, a := range os.Args[1:] {
		if strings.ContainsAny(a, " \t'\"$&;|<>()*?") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		args = append(args, a)
	}
	return strings.Join(args, " ")
}
