// Command media benchmarks media through the relay (issue 10, "Benchmark"): a medium downloaded
// and uploaded (a) directly at the fake upstream with the upstream token, as a client holding
// that token would, and (b) through wabarelay_proxy with a channel token, in alternating rounds
// of one run; one stream at a time and -concurrency streams at once.
//
//	go build -o bin/caddy ./cmd/caddy
//	go run ./bench/media                 # 16 MB, 20 concurrent streams, 3 rounds each
//
// It starts everything itself and removes it at the end: a database wabarelay_bench_<rand> on
// the Postgres named by -pg (dropped at the end), the fake upstream in this process, and one
// bin/caddy process. Caddy's relay runs with its defaults except the per-channel rate limit,
// raised so that the benchmark's hundreds of calls on one channel are not refused.
//
// It reports throughput of (b) against (a), the Caddy process's CPU time per MB relayed, and the
// growth of Caddy's resident set during the concurrent rounds (peak VmHWM, reset before each
// round through /proc/<pid>/clear_refs, minus VmRSS before it): streaming shows as a few MB
// whatever the medium's size; buffering would show as the medium's size times the streams.
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
	ops             []string
}

func main() {
	var c config
	flag.StringVar(&c.pgDSN, "pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "admin DSN of the Postgres to create the bench database on")
	flag.StringVar(&c.caddyBin, "caddy", "bin/caddy", "the Caddy binary with wabarelay (go build -o bin/caddy ./cmd/caddy)")
	flag.IntVar(&c.size, "size", 16<<20, "medium size in bytes")
	flag.IntVar(&c.concurrency, "concurrency", 20, "streams at once in the concurrent rounds")
	flag.IntVar(&c.rounds, "rounds", 3, "rounds per target and mode, alternating a/b")
	ops := flag.String("ops", "download,upload", "what to measure, comma-separated (bench/smoke: download)")
	flag.Parse()
	c.ops = strings.Split(*ops, ",")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		benchkit.Fatalf("bench/media: %v", err)
	}
}

// bench is one run's fixtures.
type bench struct {
	c            config
	data         []byte
	fakeURL      string // origin of the fake
	relay        string // {proxy_url}
	channelToken string
	client       *http.Client
}

func run(ctx context.Context, c config) (err error) {
	var cl benchkit.Cleanups
	defer cl.Run()
	caddyBin, err := benchkit.CaddyBinary(c.caddyBin)
	if err != nil {
		return err
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

	// ---- Caddy ----
	port := benchkit.FreePort()
	cfg := fmt.Sprintf(`{
	admin off
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
`, b.fakeURL, port, proxyPrefix)
	caddy, err := benchkit.StartCaddy(ctx, caddyBin, filepath.Join(tmp, "caddy"), cfg,
		[]string{"WBR_BENCH_DATABASE=" + dsn, "WBR_BENCH_KEY=" + base64.StdEncoding.EncodeToString(key)}, port)
	if err != nil {
		return err
	}
	cl.Add(caddy.Stop)
	b.relay = fmt.Sprintf("http://127.0.0.1:%d%s", port, proxyPrefix)

	// ---- rounds ----
	type result struct {
		name           string
		bytesA, bytesB int64
		timeA, timeB   time.Duration
		cpuB           time.Duration
		growth         int64 // peak RSS growth of Caddy during (b), concurrent rounds only
	}
	var results []result
	for _, op := range c.ops {
		if op != "download" && op != "upload" {
			return fmt.Errorf("-ops: download or upload, not %q", op)
		}
		for _, streams := range []int{1, c.concurrency} {
			r := result{name: fmt.Sprintf("%s, %d stream(s)", op, streams)}
			for round := 0; round < c.rounds; round++ {
				for _, viaRelay := range []bool{false, true} {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					before, _ := rss(caddy.PID())
					resetPeak(caddy.PID())
					cpu0, _ := benchkit.ProcCPU(caddy.PID())
					n, d, err := b.round(ctx, op, streams, viaRelay, fake)
					if err != nil {
						return fmt.Errorf("%s via relay=%v: %w", r.name, viaRelay, err)
					}
					cpu1, _ := benchkit.ProcCPU(caddy.PID())
					_, peak := rss(caddy.PID())
					if viaRelay {
						r.bytesB, r.timeB, r.cpuB = r.bytesB+n, r.timeB+d, r.cpuB+cpu1-cpu0
						if streams > 1 {
							r.growth = max(r.growth, peak-before)
						}
					} else {
						r.bytesA, r.timeA = r.bytesA+n, r.timeA+d
					}
					benchkit.Logf("  %s, round %d, %s: %.0f MB/s", r.name, round+1, map[bool]string{false: "direct", true: "relay"}[viaRelay],
						float64(n)/d.Seconds()/1e6)
				}
			}
			results = append(results, r)
		}
	}

	// ---- report ----
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	p("\n## Media benchmark\n\n```sh\ngo run ./bench/media %s\n```\n\n", strings.Join(os.Args[1:], " "))
	p("A %d MB medium; %d rounds per target and mode, alternating (a) direct at the fake upstream with the upstream token "+
		"and (b) through `wabarelay_proxy` with a channel token; load average %s at start; everything on this machine.\n\n",
		c.size>>20, c.rounds, loadAvg)
	p("| mode | (a) direct MB/s | (b) relay MB/s | b/a | Caddy CPU ms per MB | Caddy peak RSS growth |\n|---|--:|--:|--:|--:|--:|\n")
	for _, r := range results {
		ra, rb := float64(r.bytesA)/r.timeA.Seconds()/1e6, float64(r.bytesB)/r.timeB.Seconds()/1e6
		growth := "—"
		if r.growth > 0 || strings.Contains(r.name, strconv.Itoa(c.concurrency)+" ") {
			growth = fmt.Sprintf("%.1f MB", float64(r.growth)/(1<<20))
		}
		p("| %s | %.0f | %.0f | %.2f× | %.2f | %s |\n", r.name, ra, rb, rb/ra,
			float64(r.cpuB.Microseconds())/1e3/(float64(r.bytesB)/(1<<20)), growth)
	}
	p("\nTargets: throughput ≥ 0.9× direct; Caddy's peak RSS growth < 30 MB during %d concurrent %d MB transfers.\n", c.concurrency, c.size>>20)
	fmt.Print(sb.String())
	// One machine-readable line per mode (bench/smoke reads them): media-<op>-<streams> b/a.
	for _, r := range results {
		op, streams, _ := strings.Cut(strings.TrimSuffix(r.name, " stream(s)"), ", ")
		fmt.Printf("RATIO media-%s-%s %.3f\n", op, streams, (float64(r.bytesB)/r.timeB.Seconds())/(float64(r.bytesA)/r.timeA.Seconds()))
	}
	return nil
}

// round runs streams transfers at once and returns the bytes moved and the time taken.
func (b *bench) round(ctx context.Context, op string, streams int, viaRelay bool, fake *fakegraph.Server) (int64, time.Duration, error) {
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
				n, err = b.download(ctx, viaRelay)
			} else {
				n, err = b.upload(ctx, viaRelay)
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
// upstream token would (media object, then its url).
func (b *bench) download(ctx context.Context, viaRelay bool) (int64, error) {
	url, token := b.relay+"/"+mediaID+"/download", b.channelToken
	if !viaRelay {
		token = upstreamToken
		var obj struct{ URL string }
		if err := b.getJSON(ctx, b.fakeURL+"/v26.0/"+mediaID, token, &obj); err != nil {
			return 0, err
		}
		url = obj.URL
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
func (b *bench) upload(ctx context.Context, viaRelay bool) (int64, error) {
	url, token := b.relay+"/"+pnid+"/media", b.channelToken
	if !viaRelay {
		url, token = b.fakeURL+"/v26.0/"+pnid+"/media", upstreamToken
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
