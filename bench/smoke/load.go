package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

// runAll builds each bench into dir and runs it (again, up to -retries times, while a ratio of
// it fails), and returns the best ratios of every bench.
func runAll(c config, base baseline, dir string) map[string]float64 {
	got := map[string]float64{}
	for _, b := range benches {
		bin := filepath.Join(dir, b.name)
		if out, err := exec.Command("go", "build", "-o", bin, "./bench/"+b.name).CombinedOutput(); err != nil {
			benchkit.Fatalf("go build ./bench/%s: %v\n%s", b.name, err, out)
		}
		args := append([]string{"-caddy", c.caddy}, b.args...)
		var best map[string]float64
		for try := 0; try <= c.retries; try++ {
			benchkit.Logf("%s %s", b.name, strings.Join(args, " "))
			ratios, out, err := runBench(bin, args)
			if c.verbose || err != nil {
				_, _ = os.Stdout.Write(out) // the bench's own output, passed on
			}
			if err != nil {
				benchkit.Logf("%s failed: %v", b.name, err)
			}
			best = better(best, ratios)
			if c.record || pass(b.ratios, best, base.Ratios, c.tolerance) {
				break
			}
			if try < c.retries {
				benchkit.Logf("%s: a ratio is below its baseline; running it once more", b.name)
			}
		}
		for k, v := range best {
			got[k] = v
		}
	}
	return got
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

// pass reports whether every ratio of names that base has is in got and within tol of its
// baseline.
func pass(names []string, got, base map[string]float64, tol float64) bool {
	for _, k := range names {
		bv, ok := base[k]
		if !ok {
			continue
		}
		if v, ok := got[k]; !ok || v < bv*(1-tol) {
			return false
		}
	}
	return true
}
