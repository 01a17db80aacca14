// Command media benchmarks media through the relay: a medium downloaded and uploaded (a)
// directly at the fake upstream with the upstream token, as a client holding that token would,
// (p) through a plain Caddy reverse_proxy to the fake, with the upstream token (the same two calls
// as (a): media object, then its url, both through the proxy), and (b) through wabarelay_proxy
// with a channel token, in alternating rounds of one run; one stream at a time and -concurrency
// streams at once.
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
//
// The files: config.go (flags, the Caddyfiles), load.go (the transfers and the rounds),
// report.go (the results).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
)

func main() {
	c := parseFlags()
	ctx := benchkit.SignalContext()
	if err := run(ctx, c); err != nil {
		benchkit.Fatalf("bench/media: %v", err)
	}
}

func run(ctx context.Context, c config) (err error) {
	var cl benchkit.Cleanups
	defer cl.Run()
	modes, err := c.modes()
	if err != nil {
		return err
	}
	r, err := benchkit.NewRun(&cl, c.caddyBin, "wabarelay-bench-media-")
	if err != nil {
		return err
	}
	caddyBin, tmp := r.CaddyBin, r.Dir
	b := newBench(c)

	// ---- database ----
	dsn, err := benchkit.NewDatabase(ctx, c.pgDSN, "wabarelay_bench_"+r.ID, &cl)
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
	key := benchkit.NewKey()
	if b.channelToken, err = createChannel(ctx, dsn, key); err != nil {
		return err
	}

	// ---- Caddy (p): plain reverse_proxy; Caddy (b): the relay ----
	portP, portB := benchkit.FreePort(), benchkit.FreePort()
	adminP, adminPortP := adminLine(c.proxyProfile)
	adminB, adminPortB := adminLine(c.cpuProfile)
	env := benchkit.CaddyEnv(dsn, key)
	caddyP, err := benchkit.StartCaddy(ctx, caddyBin, filepath.Join(tmp, "caddy-p"), caddyfileProxy(adminP, portP, b.fakeURL), nil, portP)
	if err != nil {
		return err
	}
	cl.Add(caddyP.Stop)
	caddy, err := benchkit.StartCaddy(ctx, caddyBin, filepath.Join(tmp, "caddy-b"), caddyfileRelay(adminB, portB, b.fakeURL), env, portB)
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
		caddyO, err := benchkit.StartCaddy(ctx, binO, filepath.Join(tmp, "caddy-o"), caddyfileRelay("admin off", portO, b.fakeURL), env, portO)
		if err != nil {
			return err
		}
		cl.Add(caddyO.Stop)
		b.relayBefore = fmt.Sprintf("http://127.0.0.1:%d%s", portO, proxyPrefix)
		ps.names, ps.pids = append(ps.names, "Caddy (o)"), append(ps.pids, caddyO.PID())
		targets = []target{direct, proxy, before, relay}
	}

	// ---- rounds ----
	results, err := b.measure(ctx, modes, targets, ps, caddy.PID())
	if err != nil {
		return err
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

	report(c, results, targets, ps, r.LoadAvg)
	return nil
}
