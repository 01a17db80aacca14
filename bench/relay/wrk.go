package main

// wrk as the load generator: the same request mix as the Go generator, made by a Lua
// script this file writes into the run's temp dir, with a data file of the channels' paths and
// Authorization headers per target.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// wrkScript makes request n of a run on channel n mod channels (the data file's line n mod
// lines), numbered with a sequence number that is unique in the whole run: thread k of T issues
// first+k, first+k+T, … (interleaved, so the threads together go round-robin over the channels).
// A thread stops itself (wrk.thread:stop) once it has issued stopAt requests, so that a slice
// stays within its budget of sequence numbers; the margin left covers the requests its other
// connections issue before the loop stops. It counts non-2xx answers (keeping the first few
// bodies) and Idempotent-Replayed answers, and done() prints one "WRK …" line per fact and the
// latency percentiles 0.1 … 99.9 in steps of 0.1 (µs), which the bench turns back into a
// distribution.
//
// wrk calls request() once on thread 0 before the run to check the request's syntax (and never
// sends it): that call is answered with a request that takes no sequence number.
const wrkScript = `-- written by bench/relay: the relay benchmark's request mix
local paths, auths, n = {}, {}, 0
local prefix, suffix, keyed
local headers = {}
local started = false
first, stride, stopAt, issued, non2xx, replayed, nerrs, errs = 0, 1, 0, 0, 0, 0, 0, ""
local seq = 0

local threads, nthreads = {}, 0
function setup(thread)
  thread:set("tid", nthreads)
  nthreads = nthreads + 1
  table.insert(threads, thread)
end

function init(args)
  local target = args[2]
  keyed = args[3] == "1"
  stride = tonumber(args[6])
  first = tonumber(args[5]) + tid
  stopAt = tonumber(args[7])
  seq = first
  for line in io.lines(args[1]) do
    local p, a = line:match("^(%S+) (.+)$")
    n = n + 1
    paths[n], auths[n] = p, a
  end
  prefix = '{"messaging_product":"whatsapp","recipient_type":"individual","to":"15551234567","type":"text","text":{"body":"bench ' .. target .. ' '
  if keyed then
    suffix = '"},"idempotency_key":"' .. args[4] .. '-' .. target .. '-'
  else
    suffix = '"}}'
  end
  headers["Content-Type"] = "application/json"
end

function request()
  if not started then
    started = true
    if tid == 0 then
      return wrk.format("GET", "/wrk-syntax-check")
    end
  end
  local s = seq
  seq = seq + stride
  issued = issued + 1
  local i = s % n + 1
  headers["Authorization"] = auths[i]
  local body
  if keyed then
    body = prefix .. s .. suffix .. s .. '"}'
  else
    body = prefix .. s .. suffix
  end
  return wrk.format("POST", paths[i], headers, body)
end

function response(status, hdrs, body)
  if status < 200 or status > 299 then
    non2xx = non2xx + 1
    if nerrs < 5 then
      nerrs = nerrs + 1
      errs = errs .. status .. " " .. (string.gsub(string.sub(body or "", 1, 300), "%s", " ")) .. "\n"
    end
  end
  if hdrs["Idempotent-Replayed"] then
    replayed = replayed + 1
  end
  if issued >= stopAt then
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local out = {}
  local function p(...)
    local t = {...}
    for i = 1, #t do t[i] = tostring(t[i]) end
    out[#out + 1] = "WRK " .. table.concat(t, " ")
  end
  local e = summary.errors
  p("summary", summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout)
  for _, t in ipairs(threads) do
    p("thread", t:get("first"), t:get("stride"), t:get("issued"), t:get("non2xx"), t:get("replayed"))
    for line in string.gmatch(t:get("errs"), "[^\n]+") do
      p("err", line)
    end
  end
  p("lat", latency.min, latency.max, latency.mean)
  for k = 1, 999 do
    p("pct", k, latency:percentile(k / 10))
  end
  io.write(table.concat(out, "\n"), "\n")
end
`

// wrkTarget is what one target needs to be driven by wrk.
type wrkTarget struct {
	bin, script, data, url string
	threads                int
}

// writeWrkFiles writes the Lua script (once per run) and t's data file into dir: per channel,
// its request path and Authorization header.
func (t *target) writeWrkFiles(dir, bin string, threads int) error {
	script := filepath.Join(dir, "relay.lua")
	if err := os.WriteFile(script, []byte(wrkScript), 0o600); err != nil {
		return err
	}
	var b bytes.Buffer
	for i, u := range t.urls {
		path := u[strings.Index(u[len("http://"):], "/")+len("http://"):]
		fmt.Fprintf(&b, "%s %s\n", path, t.auths[i])
	}
	data := filepath.Join(dir, "channels-"+string(t.name)+".txt")
	if err := os.WriteFile(data, b.Bytes(), 0o600); err != nil {
		return err
	}
	base := t.urls[0][:strings.Index(t.urls[0][len("http://"):], "/")+len("http://")]
	t.wrk = &wrkTarget{bin: bin, script: script, data: data, url: base, threads: threads}
	return nil
}

// wrkRun is one wrk invocation's result.
type wrkRun struct {
	requests, non2xx, replayed, issued int64
	transport                          [4]int64 // connect, read, write, timeout errors
	duration                           time.Duration
	pct                                []float64 // µs at percentiles 0.1 … 99.9
	errs                               []string
	cpu                                time.Duration
	threads                            [][3]int64 // first, stride, issued
}

// wrkPhase runs wrk on t for d with t.c.concurrency connections, at most budget sequence
// numbers; when measured, it keeps the latency distribution and counts the slice. It returns the
// requests completed and wrk's measured duration.
func (t *target) wrkPhase(ctx context.Context, d time.Duration, budget int, measured bool) (int, time.Duration, error) {
	w := t.wrk
	start := int(t.seq.Load())
	budget = min(budget, len(t.status)-start)
	per := budget / w.threads
	margin := t.c.concurrency/w.threads + 2
	if per-margin < 1 {
		return 0, 0, fmt.Errorf("(%c) out of requests: %d left (-max-requests)", t.name, budget)
	}
	keyed := "0"
	if t.keyed() {
		keyed = "1"
	}
	secs := max(int((d+time.Second-1)/time.Second), 1)
	cmd := exec.CommandContext(ctx, w.bin, "-t", strconv.Itoa(w.threads), "-c", strconv.Itoa(t.c.concurrency),
		"-d", strconv.Itoa(secs)+"s", "--timeout", "30s", "-s", w.script, w.url, "--",
		w.data, string(t.name), keyed, t.runID, strconv.Itoa(start), strconv.Itoa(w.threads), strconv.Itoa(per-margin))
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	// Until known otherwise, the sequence numbers [start, start+threads×per) are this run's.
	t.seq.Store(int64(start + w.threads*per))
	if err != nil {
		return 0, 0, fmt.Errorf("wrk: %w\n%s%s", err, stderr.Bytes(), out.Bytes())
	}
	r, err := parseWrk(out.Bytes())
	if err != nil {
		return 0, 0, fmt.Errorf("wrk: %w\n%s", err, out.Bytes())
	}
	// The next run starts after the last sequence number a thread issued.
	var most int64
	for _, th := range r.threads {
		most = max(most, th[2])
	}
	t.seq.Store(int64(start) + int64(w.threads)*most)
	if cmd.ProcessState != nil {
		r.cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	for _, e := range r.errs {
		st, body, _ := strings.Cut(e, " ")
		code, _ := strconv.Atoi(st)
		t.fail(code, body)
	}
	// Non-2xx beyond the bodies kept.
	for i := int64(len(r.errs)); i < r.non2xx; i++ {
		t.fail(0, "non-2xx (body not kept)")
	}
	for i, name := range []string{"connect", "read", "write", "timeout"} {
		for j := int64(0); j < r.transport[i]; j++ {
			t.fail(0, name+" error")
		}
	}
	if measured {
		// wrk reports the whole -d as the duration even when its threads stopped earlier.
		for _, th := range r.threads {
			if th[2] >= int64(per-margin) {
				return 0, 0, fmt.Errorf("(%c) a slice used its whole budget of %d requests before its end, so its req/s would be wrong: "+
					"shorten -slice or -slices, or raise -max-requests (at most 60 × -channels)", t.name, budget)
			}
		}
	}
	t.replayed.Add(r.replayed)
	for _, th := range r.threads {
		for i := int64(0); i < th[2]; i++ {
			if seq := th[0] + i*th[1]; seq >= 0 && seq < int64(len(t.wrkSent)) {
				t.wrkSent[seq] = true
			}
		}
	}
	t.wrkIssued += r.issued
	t.wrkCompleted += r.requests
	t.wrkNon2xx += r.non2xx
	if measured {
		n := int(r.requests)
		for j := 0; j < n; j++ {
			k := min(max(int((float64(j)+0.5)/float64(n)*1000+0.5), 1), 999)
			t.measured = append(t.measured, time.Duration(r.pct[k-1]*float64(time.Microsecond)))
		}
		t.elapsed += r.duration
		t.slices = append(t.slices, float64(n)/r.duration.Seconds())
		if t.cpu == nil {
			t.cpu = map[string]time.Duration{}
		}
		t.cpu[wrkName] += r.cpu
	}
	return int(r.requests), r.duration, nil
}

const wrkName = "load generator (wrk)"

func parseWrk(out []byte) (*wrkRun, error) {
	r := &wrkRun{pct: make([]float64, 999)}
	var haveSummary bool
	npct := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "WRK ")
		if !ok {
			continue
		}
		kind, rest, _ := strings.Cut(line, " ")
		f := strings.Fields(rest)
		num := func(i int) int64 {
			if i >= len(f) {
				return 0
			}
			v, _ := strconv.ParseFloat(f[i], 64)
			return int64(v)
		}
		switch kind {
		case "summary":
			haveSummary = true
			r.requests, r.duration = num(0), time.Duration(num(1))*time.Microsecond
			r.transport = [4]int64{num(2), num(3), num(4), num(6)}
		case "thread":
			r.threads = append(r.threads, [3]int64{num(0), num(1), num(2)})
			r.issued += num(2)
			r.non2xx += num(3)
			r.replayed += num(4)
		case "err":
			r.errs = append(r.errs, rest)
		case "pct":
			k := int(num(0))
			if k >= 1 && k <= 999 && len(f) > 1 {
				r.pct[k-1], _ = strconv.ParseFloat(f[1], 64)
				npct++
			}
		}
	}
	if !haveSummary || npct != 999 {
		return nil, fmt.Errorf("no summary from the script's done()")
	}
	if r.duration <= 0 {
		return nil, fmt.Errorf("zero duration")
	}
	return r, nil
}
