// Command smoke is the benchmarks' regression guard (issue 21): short runs of bench/relay (wrk,
// no key), bench/events (one short rate) and bench/media (downloads), each printing its ratios
// as "RATIO <name> <value>" lines, compared with the baseline recorded in
// bench/smoke-baseline.json. It fails when a ratio of the baseline is missing or more than
// -tolerance (10%) below its recorded value.
//
//	go build -o bin/caddy ./cmd/caddy
//	go run ./bench/smoke            # or: make bench-smoke (builds bin/caddy first)
//	go run ./bench/smoke -record    # write this run's ratios into the baseline file
//
// A bench whose ratio fails is run once more (-retries) and its better run counts: on a shared
// machine one run's noise can move a ratio by more than 10%. Run it from the repository's root,
// before every hand-in that touches a hot path. The whole takes under 2 minutes when nothing has
// to be re-run.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

// benches are the short runs, in order: the package under bench/ and its arguments.
var benches = []struct {
	name string
	args []string
}{
	{"relay", []string{"-no-idempotency-key", "-channels", "2000", "-warmup", "2s", "-slices", "2", "-slice", "4s"}},
	{"events", []string{"-rate", "2000", "-duration", "5s", "-drain", "20s", "-history-days", "0"}},
	{"media", []string{"-ops", "download", "-rounds", "3"}},
}

// baseline is the file's content.
type baseline struct {
	Comment  string             `json:"comment"`
	Recorded string             `json:"recorded"` // when and where, load average
	Ratios   map[string]float64 `json:"ratios"`
}

func main() {
	file := flag.String("baseline", "bench/smoke-baseline.json", "the baseline file")
	caddy := flag.String("caddy", "bin/caddy", "the Caddy build the benches run")
	tolerance := flag.Float64("tolerance", 0.10, "largest drop below a baseline ratio, as a fraction of it")
	record := flag.Bool("record", false, "write this run's ratios into the baseline file (the names it lists; all when it does not exist)")
	retries := flag.Int("retries", 1, "re-runs of a bench whose ratio fails; its best run counts")
	verbose := flag.Bool("v", false, "print every bench's whole output")
	flag.Parse()

	var base baseline
	if b, err := os.ReadFile(*file); err == nil {
		if err := json.Unmarshal(b, &base); err != nil {
			benchkit.Fatalf("%s: %v", *file, err)
		}
	} else if !*record {
		benchkit.Fatalf("%s: %v (record one with -record)", *file, err)
	}
	if _, err := benchkit.CaddyBinary(*caddy); err != nil {
		benchkit.Fatalf("%v", err)
	}
	tmp, err := os.MkdirTemp("", "wabarelay-smoke-")
	if err != nil {
		benchkit.Fatalf("%v", err)
	}
	defer os.RemoveAll(tmp)

	start := time.Now()
	load := benchkit.LoadAvg()
	got := map[string]float64{}
	failed := false
	for _, b := range benches {
		bin := filepath.Join(tmp, b.name)
		if out, err := exec.Command("go", "build", "-o", bin, "./bench/"+b.name).CombinedOutput(); err != nil {
			benchkit.Fatalf("go build ./bench/%s: %v\n%s", b.name, err, out)
		}
		args := append([]string{"-caddy", *caddy}, b.args...)
		var best map[string]float64
		for try := 0; try <= *retries; try++ {
			benchkit.Logf("%s %s", b.name, strings.Join(args, " "))
			ratios, out, err := runBench(bin, args)
			if *verbose || err != nil {
				os.Stdout.Write(out)
			}
			if err != nil {
				benchkit.Logf("%s failed: %v", b.name, err)
			}
			best = better(best, ratios)
			if *record || pass(b.name, best, base.Ratios, *tolerance) {
				break
			}
			if try < *retries {
				benchkit.Logf("%s: a ratio is below its baseline; running it once more", b.name)
			}
		}
		for k, v := range best {
			got[k] = v
		}
	}

	// ---- report ----
	fmt.Printf("\n## bench smoke (%s, load average %s at start)\n\n", time.Since(start).Round(time.Second), load)
	fmt.Printf("| ratio | baseline | now | floor (−%.0f%%) | |\n|---|--:|--:|--:|:-:|\n", *tolerance*100)
	names := make([]string, 0, len(got)+len(base.Ratios))
	for k := range got {
		names = append(names, k)
	}
	for k := range base.Ratios {
		if _, ok := got[k]; !ok {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		v, ok := got[k]
		bv, inBase := base.Ratios[k]
		switch {
		case !inBase:
			fmt.Printf("| %s | — | %.3f | — | (not guarded) |\n", k, v)
		case !ok:
			fmt.Printf("| %s | %.3f | missing | %.3f | **FAIL** |\n", k, bv, bv*(1-*tolerance))
			failed = true
		case v < bv*(1-*tolerance):
			fmt.Printf("| %s | %.3f | %.3f | %.3f | **FAIL** |\n", k, bv, v, bv*(1-*tolerance))
			failed = true
		default:
			fmt.Printf("| %s | %.3f | %.3f | %.3f | ok |\n", k, bv, v, bv*(1-*tolerance))
		}
	}

	if *record {
		nb := baseline{Comment: base.Comment, Ratios: map[string]float64{},
			Recorded: fmt.Sprintf("%s, load average %s at start", time.Now().Format("2006-01-02"), load)}
		if nb.Comment == "" {
			nb.Comment = "bench/smoke's baseline: go run ./bench/smoke -record (see bench/README.md, Smoke)"
		}
		for k, v := range got {
			if _, listed := base.Ratios[k]; listed || base.Ratios == nil {
				nb.Ratios[k] = v
			}
		}
		b, _ := json.MarshalIndent(nb, "", "  ")
		if err := os.WriteFile(*file, append(b, '\n'), 0o644); err != nil {
			benchkit.Fatalf("%v", err)
		}
		fmt.Printf("\nrecorded in %s\n", *file)
		return
	}
	if failed {
		fmt.Println("\nFAIL: a ratio dropped more than the tolerance below its baseline (or is missing)")
		os.Exit(1)
	}
	fmt.Println("\nok")
}

// runBench runs one bench and returns its RATIO lines and its output.
func runBench(bin string, args []string) (map[string]float64, []byte, error) {
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout = &out
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err != nil {
		out.Write(stderr.Bytes())
	}
	ratios := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "RATIO" {
			if v, perr := strconv.ParseFloat(f[2], 64); perr == nil {
				ratios[f[1]] = v
			}
		}
	}
	return ratios, out.Bytes(), err
}

// better keeps, per name, the higher of two runs' ratios.
func better(a, b map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for _, m := range []map[string]float64{a, b} {
		for k, v := range m {
			if old, ok := out[k]; !ok || v > old {
				out[k] = v
			}
		}
	}
	return out
}

// pass reports whether every ratio of base that belongs to bench (named "<bench>-…") is in got
// and within tol of its baseline.
func pass(bench string, got, base map[string]float64, tol float64) bool {
	for k, bv := range base {
		if !strings.HasPrefix(k, bench+"-") {
			continue
		}
		if v, ok := got[k]; !ok || v < bv*(1-tol) {
			return false
		}
	}
	return true
}
