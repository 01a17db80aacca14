package main

// The fake upstream in a process of its own, so that its CPU time is accounted apart
// from the load generator's and Caddy's: the bench re-runs its own binary with fakeEnv set.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
)

// fakeEnv names the environment variable that makes this binary the fake upstream; its value is
// the JSON of a fakeConfig.
const fakeEnv = "WBR_BENCH_FAKE_UPSTREAM"

// fakeConfig is what the bench tells its fake upstream process.
type fakeConfig struct {
	Channels    int // phone numbers pnid(0) … pnid(Channels-1), all allowed for upstreamToken
	MaxRequests int // sequence numbers counted per target: 0 … MaxRequests-1
	PortA       int // listener for Caddy (a)
	PortB       int // listener for Caddy (b)
	PortCtl     int // GET /report: the fakeReport
}

// fakeReport is what the fake upstream saw, read by the bench after the load.
type fakeReport struct {
	CountsA, CountsB []byte   // sends per sequence number, saturated at 255
	Other            int64    // sends (POSTs) without a bench sequence number
	Conns            [2]int64 // connections opened by Caddy (a), (b)
	ForwardedB       int      // (b)'s sends among the last recorded requests
	ForwardedBadB    int      // … of which not with the upstream token, the right path, without idempotency_key
}

func pnid(i int) string { return fmt.Sprintf("1065%011d", i) }

// runFake serves the fake upstream until SIGTERM or SIGINT (or the parent's death: Pdeathsig).
func runFake(spec string) error {
	var fc fakeConfig
	if err := json.Unmarshal([]byte(spec), &fc); err != nil {
		return fmt.Errorf("fake upstream: config: %w", err)
	}
	fake := fakegraph.New(fakegraph.WithMaxRecorded(200))
	pnids := make([]string, fc.Channels)
	for i := range pnids {
		pnids[i] = pnid(i)
		fake.AddNumber(pnids[i], wabaID, fmt.Sprintf("+1 555-%07d", i), "Bench "+strconv.Itoa(i))
	}
	fake.AddToken(upstreamToken, pnids, []string{wabaID})
	counts := map[byte][]atomic.Uint32{'a': make([]atomic.Uint32, fc.MaxRequests), 'b': make([]atomic.Uint32, fc.MaxRequests)}
	var other atomic.Int64
	var conns [2]atomic.Int64
	for i, port := range []int{fc.PortA, fc.PortB} {
		if err := serveFake(port, fake, counts, &other, &conns[i]); err != nil {
			return err
		}
	}
	ctl := http.NewServeMux()
	ctl.HandleFunc("GET /report", func(w http.ResponseWriter, r *http.Request) {
		rep := fakeReport{CountsA: saturate(counts['a']), CountsB: saturate(counts['b']), Other: other.Load(),
			Conns: [2]int64{conns[0].Load(), conns[1].Load()}}
		for _, rec := range fake.Requests() {
			if !bytes.Contains(rec.Body, []byte(`"body":"bench b `)) {
				continue
			}
			rep.ForwardedB++
			if rec.Header.Get("Authorization") != "Bearer "+upstreamToken || bytes.Contains(rec.Body, []byte("idempotency_key")) ||
				!strings.HasPrefix(rec.Path, "/v26.0/1065") || !strings.HasSuffix(rec.Path, "/messages") {
				rep.ForwardedBadB++
			}
		}
		_ = json.NewEncoder(w).Encode(rep) // an error is the bench gone: no one to tell
	})
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(fc.PortCtl))
	if err != nil {
		return err
	}
	go func() {
		if err := (&http.Server{Handler: ctl, ReadHeaderTimeout: 10 * time.Second}).Serve(ln); err != nil {
			benchkit.Logf("fake upstream: control server: %v", err)
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	return nil
}

func saturate(a []atomic.Uint32) []byte {
	out := make([]byte, len(a))
	for i := range a {
		out[i] = byte(min(a[i].Load(), 255))
	}
	return out
}

// serveFake serves the fake upstream on 127.0.0.1:port behind a wrapper that counts, per target
// and sequence number, the sends that arrive (the sequence number is in the text body:
// "bench <target> <seq>"), and the connections opened.
func serveFake(port int, fake *fakegraph.Server, counts map[byte][]atomic.Uint32, other, conns *atomic.Int64) error {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return err
	}
	marker := []byte(`"body":"bench `)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		counted := false
		if i := bytes.Index(body, marker); i >= 0 && len(body) > i+len(marker)+2 {
			rest := body[i+len(marker):]
			if arr := counts[rest[0]]; arr != nil && rest[1] == ' ' {
				if j := bytes.IndexByte(rest[2:], '"'); j > 0 {
					if seq, err := strconv.Atoi(string(rest[2 : 2+j])); err == nil && seq >= 0 && seq < len(arr) {
						arr[seq].Add(1)
						counted = true
					}
				}
			}
		}
		// (the number health reads each channel's connect makes — GET /<pnid>?fields=… — are
		// the service's own, not sends)
		if !counted && r.Method == http.MethodPost {
			other.Add(1)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		fake.ServeHTTP(w, r)
	})
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				conns.Add(1)
			}
		}}
	go func() {
		if err := hs.Serve(ln); err != nil {
			benchkit.Logf("fake upstream on port %d: %v", port, err)
		}
	}()
	return nil
}

// fakeProc is the fake upstream process as the bench sees it.
type fakeProc struct {
	child      *benchkit.Child
	urlA, urlB string
	ctl        string
}

// startFake runs this binary as the fake upstream process (logs in dir/fake.log).
func startFake(ctx context.Context, logPath string, fc fakeConfig) (*fakeProc, error) {
	fc.PortA, fc.PortB, fc.PortCtl = benchkit.FreePort(), benchkit.FreePort(), benchkit.FreePort()
	spec, _ := json.Marshal(fc)
	ch, err := benchkit.StartSelf("fake upstream", logPath, []string{fakeEnv + "=" + string(spec)})
	if err != nil {
		return nil, err
	}
	for _, p := range []int{fc.PortA, fc.PortB, fc.PortCtl} {
		if err := benchkit.WaitPort(ctx, fmt.Sprintf("127.0.0.1:%d", p), 30*time.Second, ch); err != nil {
			ch.Stop()
			return nil, fmt.Errorf("fake upstream: %w\n%s", err, ch.Logs())
		}
	}
	benchkit.Logf("fake upstream (pid %d) on 127.0.0.1:%d (a), :%d (b)", ch.PID(), fc.PortA, fc.PortB)
	return &fakeProc{child: ch, urlA: fmt.Sprintf("http://127.0.0.1:%d", fc.PortA),
		urlB: fmt.Sprintf("http://127.0.0.1:%d", fc.PortB), ctl: fmt.Sprintf("http://127.0.0.1:%d/report", fc.PortCtl)}, nil
}

// report fetches what the fake upstream saw.
func (f *fakeProc) report(ctx context.Context) (*fakeReport, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.ctl, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fake upstream report: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, errors.New("fake upstream report: " + resp.Status)
	}
	var rep fakeReport
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		return nil, fmt.Errorf("fake upstream report: %w", err)
	}
	return &rep, nil
}
