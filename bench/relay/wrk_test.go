package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func wrkOutput(threads ...string) string {
	var b strings.Builder
	b.WriteString("Running 5s test @ http://127.0.0.1:1\n") // wrk's own lines are ignored
	b.WriteString("WRK summary 300 5000000 0 1 0 2 3\n")
	for _, t := range threads {
		b.WriteString("WRK thread " + t + "\n")
	}
	b.WriteString("WRK err 429 {\"error\": \"limit\"}\n")
	b.WriteString("WRK lat 100 9000 250.5\n")
	for k := 1; k <= 999; k++ {
		fmt.Fprintf(&b, "WRK pct %d %d\n", k, 100+k)
	}
	return b.String()
}

func TestParseWrk(t *testing.T) {
	r, err := parseWrk([]byte(wrkOutput("10 2 160 1 0", "11 2 150 1 4")))
	if err != nil {
		t.Fatal(err)
	}
	if r.requests != 300 || r.duration != 5*time.Second || r.issued != 310 || r.non2xx != 2 || r.replayed != 4 {
		t.Errorf("requests %d duration %s issued %d non2xx %d replayed %d", r.requests, r.duration, r.issued, r.non2xx, r.replayed)
	}
	if r.transport != [4]int64{0, 1, 0, 3} {
		t.Errorf("transport errors %v, want connect 0 read 1 write 0 timeout 3", r.transport)
	}
	if len(r.threads) != 2 || r.threads[1] != [3]int64{11, 2, 150} {
		t.Errorf("threads %v", r.threads)
	}
	if len(r.errs) != 1 || r.errs[0] != `429 {"error": "limit"}` {
		t.Errorf("errs %q", r.errs)
	}
	if r.pct[0] != 101 || r.pct[998] != 1099 {
		t.Errorf("percentiles %v … %v", r.pct[0], r.pct[998])
	}
	// Without the script's done() output (e.g. wrk without -s) it is an error, not zeros.
	if _, err := parseWrk([]byte("Running 5s test\n")); err == nil {
		t.Error("no summary: no error")
	}
	if _, err := parseWrk([]byte(strings.ReplaceAll(wrkOutput(), "WRK pct 500 600\n", ""))); err == nil {
		t.Error("a missing percentile: no error")
	}
}

func TestVerifyWrk(t *testing.T) {
	mk := func() *target {
		tg := &target{name: 'b', wrk: &wrkTarget{}, wrkSent: make([]bool, 10)}
		for i := range 6 { // sent 0…5, 6…9 never
			tg.wrkSent[i] = true
		}
		tg.wrkIssued, tg.wrkCompleted = 6, 5 // one in flight when wrk stopped
		return tg
	}
	cases := []struct {
		name   string
		counts []byte
		ok     bool
	}{
		{"all arrived", []byte{1, 1, 1, 1, 1, 1, 0, 0, 0, 0}, true},
		{"the one in flight did not", []byte{1, 1, 1, 1, 0, 1, 0, 0, 0, 0}, true},
		{"two missing, one in flight", []byte{1, 1, 0, 1, 0, 1, 0, 0, 0, 0}, false},
		{"a duplicate", []byte{1, 2, 1, 1, 1, 1, 0, 0, 0, 0}, false},
		{"an unsent one arrived", []byte{1, 1, 1, 1, 1, 1, 0, 1, 0, 0}, false},
	}
	for _, c := range cases {
		res := checkResult{ok: true}
		verifyWrk(&res, mk(), c.counts)
		if res.ok != c.ok {
			t.Errorf("%s: ok %v, want %v: %v", c.name, res.ok, c.ok, res.lines)
		}
	}
	res := checkResult{ok: true}
	tg := mk()
	tg.fail(429, "limit")
	verifyWrk(&res, tg, []byte{1, 1, 1, 1, 1, 1, 0, 0, 0, 0})
	if res.ok {
		t.Errorf("a non-2xx answer passed: %v", res.lines)
	}
}
