// Command media benchmarks media through the relay (issue 10, "Benchmark"; issue 21): a medium
// downloaded and uploaded (a) directly at the fake upstream with the upstream token, as a client
// holding that token would, (p) through a plain Caddy reverse_proxy to the fake, with the upstream
// token (the same two calls as (a): media object, then its url, both through the proxy), and (b)
// through wabarelay_proxy with a channel token, in alternating rounds of one run; one stream at
// a time and -concurrency streams at once.
//
//	go build -o bin/caddy ./cmd/caddy
//	go run ./bench/media                 # 16 MB, 20 concurrent streams, 3 rounds each
//	go run ./bench/media -short          # a quick look: 16 MB, 4 streams, 7 rounds, downloads only
//	go run ./bench/media -cpuprofile b.pprof -proxy-cpuprofile p.pprof   # also CPU profiles
//	go run ./bench/media -before bin/caddy-main   # another build's relay, (o), in the same rounds
//
// It starts everything itself and removes it at the end: a database wabarelay_bench_<rand> on
// the Postgres named by -pg (dropped at the end), the fake upstream in this process, and two
// bin/caddy processes: (p) plain reverse_proxy and (b) the relay, which runs with its defaults
// except the per-channel rate limit, raised so that the benchmark's hundreds of calls on one
// channel are not refused.
//
// It reports the throughput of each target, (b) against (p) and against (a), the CPU time per MB
// of every process over each target's own rounds (this bench process, which holds the client and
// the fake; Caddy (p); Caddy (b)), and the growth of Caddy (b)'s resident set during the
// concurrent rounds (peak VmHWM, reset before each round through /proc/<pid>/clear_refs, minus
// VmRSS before it): streaming shows as a few MB whatever the medium's size; buffering would show
// as the medium's size times the streams. Its last lines are machine-readable (bench/smoke):
//
//	RATIO media-<op>-<streams> <relay ÷ direct>   one per mode
//	RATIO media <relay ÷ proxy>
//
// the last the lower of the two download modes' (b)/(p) throughput ratios, each the median over
// the rounds of the ratio within a round (a round's targets run one right after the other: the
// machine's swings between rounds cancel out).
//
// -cpuprofile and -proxy-cpuprofile add a phase after the rounds: -profile-seconds of concurrent
// downloads (or uploads: -profile-mode upload) through (b), then through (p), each profiled by
// its Caddy's admin API (/debug/pprof/profile): go tool pprof -top bin/caddy b.pprof.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

const (
	upstreamToken = "EAAGbenchMediaUpstreamToken0123456789"
	pnid          = "106500000000001"
	wabaID        = "102290129340398"
	mediaID       = "1040000000000077"
	proxyPrefix   = "/upstream-proxy"
)

type config struct {
	pgDSN, caddyBin string
	size            int
	concurrency     int
	rounds          int
	ops             string // comma-separated: download, upload
	cpuProfile      string // Caddy (b)
	proxyProfile    string // Caddy (p)
	profileSecs     int
	profileMode     string
	beforeBin       string // another build's relay, (o), side by side
}

func main() {
	var c config
	var short bool
	flag.StringVar(&c.pgDSN, "pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "admin DSN of the Postgres to create the bench database on")
	flag.StringVar(&c.caddyBin, "caddy", "bin/caddy", "the Caddy binary with wabarelay (go build -o bin/caddy ./cmd/caddy)")
	flag.IntVar(&c.size, "size", 16<<20, "medium size in bytes")
	flag.IntVar(&c.concurrency, "concurrency", 20, "streams at once in the concurrent rounds")
	flag.IntVar(&c.rounds, "rounds", 3, "rounds per target and mode, alternating a/p/b")
	flag.StringVar(&c.ops, "ops", "download,upload", "what to measure, comma-separated: download, upload (bench/smoke: download)")
	flag.BoolVar(&short, "short", false, "a quick run: -size 16 MB -concurrency 4 -rounds 7 -ops download, unless given")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of Caddy (b) over a phase of concurrent downloads through it to this file")
	flag.StringVar(&c.proxyProfile, "proxy-cpuprofile", "", "write a CPU profile of Caddy (p) over a phase of concurrent downloads through it to this file")
	flag.IntVar(&c.profileSecs, "profile-seconds", 10, "length of each profiled phase")
	flag.StringVar(&c.profileMode, "profile-mode", "download", "what the profiled phases do: download or upload")
	flag.StringVar(&c.beforeBin, "before", "", "another Caddy build (e.g. of main) whose relay runs as a fourth target, (o), in the same rounds")
	flag.Parse()
	if short {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["size"] {
			c.size = 16 << 20
		}
		if !set["concurrency"] {
			c.concurrency = 4
		}
		if !set["rounds"] {
			c.rounds = 7
		}
		if !set["ops"] {
			c.ops = "download"
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		benchkit.Fatalf("bench/media: %v", err)
	}
}

// target is where a transfer goes: (a) direct, (p) reverse_proxy, (b) relay.
type target byte

const (
	direct target = 'a'
	proxy  target = 'p'
	relay  target = 'b'
	before target = 'o' // the relay of another build (-before)
)

func (t target) String() string {
	return map[target]string{direct: "direct", proxy: "reverse_proxy", relay: "relay", before: "relay (-before)"}[t]
}

// bench is one run's fixtures.
type bench struct {
	c            config
	data         []byte
	fakeURL      string // origin of the fake
	proxyURL     string // origin of Caddy (p)
	relay        string // {proxy_url} of (b)
	relayBefore  string // {proxy_url} of (o)
	channelToken string
	client       *http.Client
}

// procs are the processes whose CPU time is counted, in the report's order.
type procs struct {
	names []string
	pids  []int
}

func (ps procs) cpu() []time.Duration {
	out := make([]time.Duration, len(ps.pids))
	for i, pid := range ps.pids {
		out[i] = procCPU(pid)
	}
	return out
}

// syscalls returns each process's read and write system calls so far (/proc/<pid>/io: syscr +
// syscw; 0 when not readable): the count noise does not move.
func (ps procs) syscalls() []int64 {
	out := make([]int64, len(ps.pids))
	for i, pid := range ps.pids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ": "); ok && (k == "syscr" || k == "syscw") {
				n, _ := strconv.ParseInt(v, 10, 64)
				out[i] += n
			}
		}
	}
	return out
}

// procCPU returns the CPU time of a process to the nanosecond: the sum of its threads' run
// times in /proc/<pid>/task/*/schedstat (the clock-tick counts of /proc/<pid>/stat are too
// coarse for rounds of a few ms); benchkit.ProcCPU when that is not readable. Threads that
// ended are not counted: Go keeps its threads.
func procCPU(pid int) time.Duration {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var sum time.Duration
	for _, t := range tasks {
		b, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		f := strings.Fields(string(b))
		if rerr != nil || len(f) == 0 {
			continue
		}
		ns, perr := strconv.ParseInt(f[0], 10, 64)
		if perr != nil {
			err = perr
			break
		}
		sum += time.Duration(ns)
	}
	if err != nil || len(tasks) == 0 {
		d, _ := benchkit.ProcCPU(pid)
		return d
	}
	return sum
}

func run(ctx context.Context, c config) (err error) {
	var cl benchkit.Cleanups
	defer cl.Run()
	caddyBin, err := benchkit.CaddyBinary(c.caddyBin)
	if err != nil {
		return err
	}
	var modes []string
	for _, m := range strings.Split(c.ops, ",") {
		switch m = strings.TrimSpace(m); m {
		case "download", "upload":
			modes = append(modes, m)
		case "":
		default:
			return fmt.Errorf("-ops: download or upload, not %q", m)
		}
	}
	loadAvg := benchkit.LoadAvg()
	tmp, err := os.MkdirTemp("", "wabarelay-bench-media-")
	if err != nil {
		return err
	}
	cl.Add(func() { os.RemoveAll(tmp) })
	b := &bench{c: c, data: make([]byte, c.size),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * c.concurrency, DisableCompression: true}}}
	rand.Read(b.data)

	// ---- database ----
	dsn, err := benchkit.NewDatabase(ctx, c.pgDSN, "wabarelay_bench_"+benchkit.RandHex(4), &cl)
	if err != nil {
		return err
	}

	// ---- fake upstream, one channel, the medium in its scope ----
	fake := fakegraph.New(fakegraph.WithMaxRecorded(10))
	if b.fakeURL, err = fake.Listen("127.0.0.1:0"); err != nil {
		return err
	}
	cl.Add(fake.Close)
	fake.AddNumber(pnid, wabaID, "+1 555 0100", "Bench")
	fake.AddToken(upstreamToken, []string{pnid}, []string{wabaID})
	fake.AddMedia(mediaID, pnid, "video/mp4", b.data)
	key := make([]byte, 32)
	rand.Read(key)
	if b.channelToken, err = createChannel(ctx, dsn, key); err != nil {
		return err
	}

	// ---- Caddy (p): plain reverse_proxy; Caddy (b): the relay ----
	adminLine := func(profile string) (string, int) {
		if profile == "" {
			return "admin off", 0
		}
		port := benchkit.FreePort()
		return fmt.Sprintf("admin 127.0.0.1:%d", port), port
	}
	portP, portB := benchkit.FreePort(), benchkit.FreePort()
	adminP, adminPortP := adminLine(c.proxyProfile)
	adminB, adminPortB := adminLine(c.cpuProfile)
	cfgP := fmt.Sprintf(`{
	%s
	persist_config off
	default_bind 127.0.0.1
}
http://127.0.0.1:%d {
	reverse_proxy %s
}
`, adminP, portP, strings.TrimPrefix(b.fakeURL, "http://"))
	cfgB := fmt.Sprintf(`{
	%s
	persist_config off
	default_bind 127.0.0.1
	wabarelay {
		database       {env.WBR_BENCH_DATABASE}
		encryption_key {env.WBR_BENCH_KEY}
		upstream       %s/v26.0
	}
}
http://127.0.0.1:%d {
	handle_path %s/* {
		wabarelay_proxy {
			rate_limit 1000000 1m
		}
	}
}
`, adminB, b.fakeURL, portB, proxyPrefix)
	caddyP, err := benchkit.StartCaddy(ctx, caddyBin, filepath.Join(tmp, "caddy-p"), cfgP, nil, portP)
	if err != nil {
		return err
	}
	cl.Add(caddyP.Stop)
	caddy, err := benchkit.StartCaddy(ctx, caddyBin, filepath.Join(tmp, "caddy-b"), cfgB,
		[]string{"WBR_BENCH_DATABASE=" + dsn, "WBR_BENCH_KEY=" + base64.StdEncoding.EncodeToString(key)}, portB)
	if err != nil {
		return err
	}
	cl.Add(caddy.Stop)
	b.proxyURL = fmt.Sprintf("http://127.0.0.1:%d", portP)
	b.relay = fmt.Sprintf("http://127.0.0.1:%d%s", portB, proxyPrefix)
	ps := procs{names: []string{"bench (client, fake)", "Caddy (p)", "Caddy (b)"},
		pids: []int{os.Getpid(), caddyP.PID(), caddy.PID()}}
	targets := []target{direct, proxy, relay}
	if c.beforeBin != "" {
		binO, err := benchkit.CaddyBinary(c.beforeBin)
		if err != nil {
			return err
		}
		portO := benchkit.FreePort()
		cfgO := strings.Replace(strings.Replace(cfgB, adminB, "admin off", 1), fmt.Sprintf("http://127.0.0.1:%d {", portB), fmt.Sprintf("http://127.0.0.1:%d {", portO), 1)
		caddyO, err := benchkit.StartCaddy(ctx, binO, filepath.Join(tmp, "caddy-o"), cfgO,
			[]string{"WBR_BENCH_DATABASE=" + dsn, "WBR_BENCH_KEY=" + base64.StdEncoding.EncodeToString(key)}, portO)
		if err != nil {
			return err
		}
		cl.Add(caddyO.Stop)
		b.relayBefore = fmt.Sprintf("http://127.0.0.1:%d%s", portO, proxyPrefix)
		ps.names, ps.pids = append(ps.names, "Caddy (o)"), append(ps.pids, caddyO.PID())
		targets = []target{direct, proxy, before, relay}
	}

	// ---- rounds ----
	type result struct {
		name   string
		bytes  map[target]int64
		time   map[target]time.Duration
		cpu    map[target][]time.Duration // per process of ps
		sys    map[target][]int64         // read and write system calls, per process of ps
		growth int64                      // peak RSS growth of Caddy (b) during (b), concurrent rounds only
		ratios []float64                  // (b)/(p) throughput of each round
	}
	var results []*result
	for _, op := range modes {
		for _, streams := range []int{1, c.concurrency} {
			r := &result{name: fmt.Sprintf("%s, %d stream(s)", op, streams), bytes: map[target]int64{},
				time: map[target]time.Duration{}, cpu: map[target][]time.Duration{}, sys: map[target][]int64{}}
			for _, t := range targets {
				r.cpu[t] = make([]time.Duration, len(ps.pids))
				r.sys[t] = make([]int64, len(ps.pids))
			}
			for round := 0; round < c.rounds; round++ {
				rate := map[target]float64{}
				for _, t := range targets {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					before, _ := rss(caddy.PID())
					resetPeak(caddy.PID())
					cpu0, sys0 := ps.cpu(), ps.syscalls()
					n, d, err := b.round(ctx, op, streams, t)
					if err != nil {
						return fmt.Errorf("%s via %s: %w", r.name, t, err)
					}
					cpu1, sys1 := ps.cpu(), ps.syscalls()
					_, peak := rss(caddy.PID())
					r.bytes[t] += n
					r.time[t] += d
					for i := range cpu1 {
						r.cpu[t][i] += cpu1[i] - cpu0[i]
						r.sys[t][i] += sys1[i] - sys0[i]
					}
					if t == relay && streams > 1 {
						r.growth = max(r.growth, peak-before)
					}
					rate[t] = float64(n) / d.Seconds() / 1e6
					benchkit.Logf("  %s, round %d, %s: %.0f MB/s", r.name, round+1, t, rate[t])
				}
				r.ratios = append(r.ratios, rate[relay]/rate[proxy])
			}
			results = append(results, r)
		}
	}

	// ---- profiles ----
	for _, pr := range []struct {
		t         target
		file      string
		adminPort int
	}{{relay, c.cpuProfile, adminPortB}, {proxy, c.proxyProfile, adminPortP}} {
		if pr.file == "" {
			continue
		}
		if err := b.profile(ctx, pr.t, pr.file, pr.adminPort); err != nil {
			return fmt.Errorf("profile of %s: %w", pr.t, err)
		}
		benchkit.Logf("cpu profile of caddy (%c) written to %s (go tool pprof -top %s %s)", pr.t, pr.file, caddyBin, pr.file)
	}

	// ---- report ----
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	mbs := func(r *result, t target) float64 { return float64(r.bytes[t]) / r.time[t].Seconds() / 1e6 }
	p("\n## Media benchmark\n\n```sh\ngo run ./bench/media %s\n```\n\n", strings.Join(os.Args[1:], " "))
	p("A %.1f MB medium; %d rounds per target and mode, alternating (a) direct at the fake upstream with the upstream token, "+
		"(p) through plain `reverse_proxy` with the upstream token and (b) through `wabarelay_proxy` with a channel token; "+
		"load average %s at start, %s at the end; everything on this machine.\n\n",
		float64(c.size)/(1<<20), c.rounds, loadAvg, benchkit.LoadAvg())
	colO, sepO := "", ""
	if c.beforeBin != "" {
		colO, sepO = " (o) relay (-before) MB/s | o/p |", "--:|--:|"
	}
	p("| mode | (a) direct MB/s | (p) reverse_proxy MB/s |%s (b) relay MB/s | b/p | b/p, median of rounds | b/a | Caddy (b) peak RSS growth |\n|---|--:|--:|%s--:|--:|--:|--:|--:|\n", colO, sepO)
	ratio := 0.0
	for _, r := range results {
		growth := "—"
		if strings.HasSuffix(r.name, fmt.Sprintf(" %d stream(s)", c.concurrency)) && c.concurrency > 1 {
			growth = fmt.Sprintf("%.1f MB", float64(r.growth)/(1<<20))
		}
		bp := mbs(r, relay) / mbs(r, proxy)
		slices.Sort(r.ratios)
		med := r.ratios[len(r.ratios)/2]
		if len(r.ratios)%2 == 0 {
			med = (r.ratios[len(r.ratios)/2-1] + med) / 2
		}
		if strings.HasPrefix(r.name, "download") && (ratio == 0 || med < ratio) {
			ratio = med
		}
		cellO := ""
		if c.beforeBin != "" {
			cellO = fmt.Sprintf(" %.0f | %.2f× |", mbs(r, before), mbs(r, before)/mbs(r, proxy))
		}
		p("| %s | %.0f | %.0f |%s %.0f | %.2f× | %.2f× | %.2f× | %s |\n", r.name, mbs(r, direct), mbs(r, proxy), cellO, mbs(r, relay),
			bp, med, mbs(r, relay)/mbs(r, direct), growth)
	}
	p("\nCPU µs per MB, per process, over each target's own rounds (and the read and write system calls per MB of the "+
		"target's Caddy):\n\n| mode | target | %s | total | Caddy syscalls/MB |\n|---|---|%s--:|--:|\n",
		strings.Join(ps.names, " | "), strings.Repeat("--:|", len(ps.names)))
	for _, r := range results {
		for _, t := range targets {
			mb := float64(r.bytes[t]) / (1 << 20)
			var cells []string
			var total time.Duration
			for _, d := range r.cpu[t] {
				cells = append(cells, fmt.Sprintf("%.0f", float64(d.Microseconds())/mb))
				total += d
			}
			sys := "—"
			if i := map[target]int{proxy: 1, relay: 2, before: 3}[t]; i > 0 {
				sys = fmt.Sprintf("%.0f", float64(r.sys[t][i])/mb)
			}
			p("| %s | (%c) %s | %s | %.0f | %s |\n", r.name, t, t, strings.Join(cells, " | "), float64(total.Microseconds())/mb, sys)
		}
	}
	p("\nTargets: (b) ≥ 0.9× (p); Caddy (b)'s peak RSS growth < 30 MB during %d concurrent %.1f MB transfers.\n",
		c.concurrency, float64(c.size)/(1<<20))
	fmt.Print(sb.String())
	// Machine-readable lines (bench/smoke reads them): per mode, media-<op>-<streams> b/a (as
	// before the (p) target); then media, the lower download mode's b/p median of rounds.
	for _, r := range results {
		op, streams, _ := strings.Cut(strings.TrimSuffix(r.name, " stream(s)"), ", ")
		fmt.Printf("RATIO media-%s-%s %.3f\n", op, streams, mbs(r, relay)/mbs(r, direct))
	}
	if ratio > 0 {
		fmt.Printf("RATIO media %.3f\n", ratio)
	}
	return nil
}

// profile runs concurrent transfers (-profile-mode) through t for -profile-seconds while Caddy's admin API at
// adminPort takes a CPU profile, written to file.
func (b *bench) profile(ctx context.Context, t target, file string, adminPort int) error {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range b.c.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for pctx.Err() == nil {
				transfer := b.download
				if b.c.profileMode == "upload" {
					transfer = b.upload
				}
				if _, err := transfer(pctx, t); err != nil && pctx.Err() == nil {
					benchkit.Logf("profile phase: %v", err)
					return
				}
			}
		}()
	}
	err := benchkit.FetchProfile(ctx, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", adminPort, b.c.profileSecs), file)
	cancel()
	wg.Wait()
	return err
}

// round runs streams transfers at once through t and returns the bytes moved and the time taken.
func (b *bench) round(ctx context.Context, op string, streams int, t target) (int64, time.Duration, error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total int64
	var firstErr error
	start := time.Now()
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n int64
			var err error
			if op == "download" {
				n, err = b.download(ctx, t)
			} else {
				n, err = b.upload(ctx, t)
			}
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil && firstErr == nil {
				firstErr = err
			}
		}()
	}
	wg.Wait()
	return total, time.Since(start), firstErr
}

// download fetches the medium: through the relay's download URL, or as a holder of the
// upstream token would (media object, then its url), directly at the fake or through (p).
func (b *bench) download(ctx context.Context, t target) (int64, error) {
	url, token := b.relay+"/"+mediaID+"/download", b.channelToken
	if t == before {
		url = b.relayBefore + "/" + mediaID + "/download"
	}
	if t != relay && t != before {
		origin := b.fakeURL
		if t == proxy {
			origin = b.proxyURL
		}
		token = upstreamToken
		var obj struct{ URL string }
		if err := b.getJSON(ctx, origin+"/v26.0/"+mediaID, token, &obj); err != nil {
			return 0, err
		}
		// The fake names itself in the url: through (p), the same path at the proxy.
		url = origin + strings.TrimPrefix(obj.URL, b.fakeURL)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil && (resp.StatusCode != 200 || n != int64(len(b.data))) {
		err = fmt.Errorf("download: %d, %d bytes", resp.StatusCode, n)
	}
	return n, err
}

// upload posts the medium as multipart, streamed from a pipe, and deletes the new medium at the
// fake afterwards (it keeps media in memory).
func (b *bench) upload(ctx context.Context, t target) (int64, error) {
	url, token := b.relay+"/"+pnid+"/media", b.channelToken
	switch t {
	case before:
		url = b.relayBefore + "/" + pnid + "/media"
	case direct:
		url, token = b.fakeURL+"/v26.0/"+pnid+"/media", upstreamToken
	case proxy:
		url, token = b.proxyURL+"/v26.0/"+pnid+"/media", upstreamToken
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		mw.WriteField("messaging_product", "whatsapp")
		part, _ := mw.CreateFormFile("file", "clip.mp4")
		part.Write(b.data)
		mw.WriteField("type", "video/mp4")
		pw.CloseWithError(mw.Close())
	}()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, pr)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var created struct{ ID string }
	if resp.StatusCode != 200 || json.Unmarshal(body, &created) != nil || created.ID == "" {
		return 0, fmt.Errorf("upload: %d %s", resp.StatusCode, body)
	}
	del, _ := http.NewRequestWithContext(ctx, http.MethodDelete, b.fakeURL+"/v26.0/"+created.ID, nil)
	del.Header.Set("Authorization", "Bearer "+upstreamToken)
	if resp, err := b.client.Do(del); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return int64(len(b.data)), nil
}

func (b *bench) getJSON(ctx context.Context, url, token string, v any) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := b.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	return json.Unmarshal(body, v)
}

// createChannel creates one org and one channel connected to the bench number, with the medium
// handed to it, and returns the channel token.
func createChannel(ctx context.Context, dsn string, key []byte) (string, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	box, err := secretbox.New(key)
	if err != nil {
		return "", err
	}
	st := store.New(pool, box)
	org, err := st.CreateOrg(ctx, "bench")
	if err != nil {
		return "", err
	}
	ch, err := st.CreateChannel(ctx, org.ID, "bench", time.Hour)
	if err != nil {
		return "", err
	}
	if err := st.ConnectChannel(ctx, ch.ID, store.Connection{PhoneNumberID: pnid, WabaID: wabaID,
		DisplayPhoneNumber: "+1 555 0100", UpstreamToken: upstreamToken}); err != nil {
		return "", err
	}
	if _, err := st.AdmitChannelObjects(ctx, ch.ID, store.ObjectMedia, []string{mediaID}); err != nil {
		return "", err
	}
	return ch.ChannelToken, nil
}

// rss returns a process's VmRSS and VmHWM in bytes (0 without /proc).
func rss(pid int) (cur, peak int64) {
	cur, peak, _ = testenv.ProcMemory(pid)
	return cur, peak
}

// resetPeak starts a new VmHWM period for pid.
func resetPeak(pid int) {
	if err := testenv.ResetPeakMemory(pid); err != nil {
		benchkit.Logf("cannot reset the peak RSS of %d: %v", pid, err)
	}
}
