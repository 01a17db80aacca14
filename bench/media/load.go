package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

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

// cpu returns each process's CPU time so far, to the nanosecond (benchkit.ThreadCPU).
func (ps procs) cpu() []time.Duration {
	out := make([]time.Duration, len(ps.pids))
	for i, pid := range ps.pids {
		out[i] = benchkit.ThreadCPU(pid)
	}
	return out
}

// syscalls returns each process's read and write system calls so far: the count noise does not
// move.
func (ps procs) syscalls() []int64 {
	out := make([]int64, len(ps.pids))
	for i, pid := range ps.pids {
		out[i] = benchkit.Syscalls(pid)
	}
	return out
}

// newBench makes the medium (c.size random bytes) and the client.
func newBench(c config) *bench {
	b := &bench{c: c, data: make([]byte, c.size), client: benchkit.HTTPClient(0, 2*c.concurrency, 0)}
	rand.Read(b.data)
	return b
}

// measure runs c.rounds rounds of each mode (every op of modes, one stream and -concurrency
// streams), each round through every target in turn, and accounts the CPU time and system calls
// of the processes ps and the peak RSS growth of the relay's Caddy (relayPID).
func (b *bench) measure(ctx context.Context, modes []string, targets []target, ps procs, relayPID int) ([]*result, error) {
	c := b.c
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
						return nil, ctx.Err()
					}
					before, _ := rss(relayPID)
					resetPeak(relayPID)
					cpu0, sys0 := ps.cpu(), ps.syscalls()
					n, d, err := b.round(ctx, op, streams, t)
					if err != nil {
						return nil, fmt.Errorf("%s via %s: %w", r.name, t, err)
					}
					cpu1, sys1 := ps.cpu(), ps.syscalls()
					_, peak := rss(relayPID)
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
	return results, nil
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
	go func() { pw.CloseWithError(writeUpload(mw, b.data)) }()
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
		_, _ = io.Copy(io.Discard, resp.Body) // the clean-up's answer is not needed
		resp.Body.Close()
	}
	return int64(len(b.data)), nil
}

// writeUpload writes an upload's multipart form (messaging_product, the file data, its type)
// to mw; its error (the request gone) ends the form early.
func writeUpload(mw *multipart.Writer, data []byte) error {
	if err := mw.WriteField("messaging_product", "whatsapp"); err != nil {
		return err
	}
	part, err := mw.CreateFormFile("file", "clip.mp4")
	if err != nil {
		return err
	}
	if _, err := part.Write(data); err != nil {
		return err
	}
	if err := mw.WriteField("type", "video/mp4"); err != nil {
		return err
	}
	return mw.Close()
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
	st, pool, err := benchkit.SetupStore(ctx, dsn, key, 0)
	if err != nil {
		return "", err
	}
	defer pool.Close()
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
