package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
)

// recipient returns recipient i's number.
func recipient(i int) string { return fmt.Sprintf("%s%09d", recipientPrefix, i) }

// fake is the fake upstream (internal/fakegraph, in this process) behind a wrapper that keeps
// the record the checks and the pace are read from: per recipient of the broadcast, how many
// sends reached it and when; the callers' sends counted.
type fake struct {
	graph *fakegraph.Server
	url   string
	srv   *http.Server

	mu     sync.Mutex
	counts []uint8      // sends per recipient index, saturated at 255
	at     []time.Time  // arrival of each broadcast send, in order
	stray  atomic.Int64 // template sends to a number not of the broadcast
	calls  atomic.Int64 // the callers' sends
	other  atomic.Int64 // anything else
}

// startFake serves the fake upstream on a free loopback port: one number on wabaID, allowed for
// upstreamToken, with the broadcast's approved template (no parameters).
func startFake(recipients int, cl *benchkit.Cleanups) (*fake, error) {
	g := fakegraph.New(fakegraph.WithMaxRecorded(100))
	g.AddNumber(pnid, wabaID, "+1 555-0100001", "Bench")
	g.AddToken(upstreamToken, []string{pnid}, []string{wabaID})
	g.AddTemplates(wabaID, fakegraph.Template{Name: templateName, Language: templateLang, Status: "APPROVED",
		Category: "MARKETING", Components: []any{map[string]any{"type": "BODY", "text": "A notice from the bench"}}})
	f := &fake{graph: g, counts: make([]uint8, recipients), at: make([]time.Time, 0, recipients)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f.url = "http://" + ln.Addr().String()
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = f.srv.Serve(ln) }() // ends with Close at clean-up
	cl.Add(func() { _ = f.srv.Close() })
	benchkit.Logf("fake upstream (in process) on %s", f.url)
	return f, nil
}

var (
	templateMarker = []byte(`"type":"template"`)
	toMarker       = []byte(`"to":"`)
	callerMarker   = []byte(`"body":"bench caller `)
)

// serve records the send and hands it to the fake.
func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	switch {
	case bytes.Contains(body, templateMarker):
		f.record(body)
	case bytes.Contains(body, callerMarker):
		f.calls.Add(1)
	default:
		f.other.Add(1)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	f.graph.ServeHTTP(w, r)
}

// record counts a broadcast send by its recipient's index.
func (f *fake) record(body []byte) {
	now := time.Now()
	idx := -1
	if i := bytes.Index(body, toMarker); i >= 0 {
		rest := body[i+len(toMarker):]
		if j := bytes.IndexByte(rest, '"'); j > len(recipientPrefix) && bytes.HasPrefix(rest, []byte(recipientPrefix)) {
			if n, err := strconv.Atoi(string(rest[len(recipientPrefix):j])); err == nil {
				idx = n
			}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if idx < 0 || idx >= len(f.counts) {
		f.stray.Add(1)
		return
	}
	if f.counts[idx] < 255 {
		f.counts[idx]++
	}
	f.at = append(f.at, now)
}

// sends returns a copy of the broadcast sends' arrival times, in order.
func (f *fake) sends() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.at)
}

// tally returns how many recipients got no send, exactly one, and more than one.
func (f *fake) tally() (none, once, more int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range f.counts {
		switch n {
		case 0:
			none++
		case 1:
			once++
		default:
			more++
		}
	}
	return none, once, more
}

// call is one caller send: when it was sent, its answer's status (0: a transport error) and
// how long the answer took.
type call struct {
	at      time.Time
	status  int
	latency time.Duration
}

// callers sends text messages through the relay with the channel's token, paced: send i at
// start + i × 60 s / rate (a late one is not made up by a burst), at most conc in flight.
type callers struct {
	client *http.Client
	url    string
	auth   string
	rate   int
	conc   int
	max    int

	start time.Time
	next  atomic.Int64
	calls []call // by index; written once each by the worker that sent it
	errs  benchkit.Errors
	wg    sync.WaitGroup
	stop  chan struct{}
}

func newCallers(base, token string, c config) *callers {
	return &callers{client: benchkit.HTTPClient(4*c.callerConc, 2*c.callerConc, 30*time.Second),
		url: base + proxyPrefix + "/" + pnid + "/messages", auth: "Bearer " + token, rate: c.callerRate,
		conc: c.callerConc, max: c.maxCalls(), calls: make([]call, c.maxCalls()), stop: make(chan struct{})}
}

// run starts the callers; end stops them and waits for those in flight.
func (cs *callers) run(ctx context.Context) {
	if cs.rate == 0 {
		return
	}
	cs.start = time.Now()
	iv := time.Minute / time.Duration(cs.rate)
	for range cs.conc {
		cs.wg.Go(func() {
			var buf []byte
			for {
				i := int(cs.next.Add(1) - 1)
				if i >= cs.max {
					return
				}
				t := time.NewTimer(time.Until(cs.start.Add(time.Duration(i) * iv)))
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-cs.stop:
					t.Stop()
					return
				case <-t.C:
				}
				buf = append(buf[:0], `{"messaging_product":"whatsapp","recipient_type":"individual","to":"`+callerTo+`","type":"text","text":{"body":"bench caller `...)
				buf = strconv.AppendInt(buf, int64(i), 10)
				buf = append(buf, `"}}`...)
				cs.calls[i] = cs.send(ctx, buf)
			}
		})
	}
}

func (cs *callers) send(ctx context.Context, body []byte) call {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, cs.url, bytes.NewReader(body))
	req.Header.Set("Authorization", cs.auth)
	req.Header.Set("Content-Type", "application/json")
	at := time.Now()
	resp, err := cs.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			cs.errs.Add(benchkit.Cut(err.Error(), 120))
		}
		return call{at: at, latency: time.Since(at)}
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close() // read to its end: the connection is reused
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusTooManyRequests {
		cs.errs.Add(fmt.Sprintf("%d %s", resp.StatusCode, benchkit.Cut(string(b), 120)))
	}
	return call{at: at, status: resp.StatusCode, latency: time.Since(at)}
}

// end stops the callers and returns the calls made.
func (cs *callers) end() []call {
	close(cs.stop)
	cs.wg.Wait()
	var out []call
	for _, c := range cs.calls {
		if !c.at.IsZero() {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b call) int { return a.at.Compare(b.at) })
	return out
}

// api is a client of the management API with the org's key.
type api struct {
	client *http.Client
	base   string
	key    string
}

// do sends a request with body v (JSON, nil: none) and decodes a 2xx answer into out.
func (a *api) do(ctx context.Context, method, path string, v, out any) error {
	var rd io.Reader
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(ctx, method, a.base+"/v1"+path, rd)
	req.Header.Set("X-Api-Key", a.key)
	if v != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, benchkit.Cut(string(b), 300))
	}
	return json.Unmarshal(b, out)
}

// broadcastView is the API's broadcast, the fields the bench reads.
type broadcastView struct {
	ID            string  `json:"id"`
	Status        string  `json:"status"`
	PausedReason  *string `json:"paused_reason"`
	RatePerMinute int     `json:"rate_per_minute"`
	Counts        struct {
		Total, Queued, Accepted, Sent, Delivered, Read, Failed, Unknown int
	} `json:"counts"`
}

// createBroadcast creates the broadcast of c.recipients recipients at c.rate, starting now.
func (a *api) createBroadcast(ctx context.Context, channelID string, c config) (broadcastView, error) {
	type to struct {
		To string `json:"to"`
	}
	rs := make([]to, c.recipients)
	for i := range rs {
		rs[i] = to{recipient(i)}
	}
	in := map[string]any{
		"name":            "bench " + strconv.Itoa(c.recipients),
		"template":        map[string]any{"name": templateName, "language": map[string]string{"code": templateLang}},
		"recipients":      rs,
		"rate_per_minute": c.rate,
	}
	var b broadcastView
	err := a.do(ctx, http.MethodPost, "/channels/"+channelID+"/broadcasts", in, &b)
	return b, err
}

// rss is a process's resident set sampled while the bench runs: its peak, and the load
// average's highest 1-minute figure seen.
type rss struct {
	pid     int
	mu      sync.Mutex
	peakKB  int64
	maxLoad float64
	stop    chan struct{}
	done    chan struct{}
}

// procKB returns a field of /proc/<pid>/status in kB (VmRSS, VmHWM); -1 when not readable.
func procKB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return -1
}

// sampleRSS samples pid's VmRSS (and the load average) every 250 ms until end.
func sampleRSS(pid int) *rss {
	s := &rss{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			kb := procKB(pid, "VmRSS")
			load, _ := strconv.ParseFloat(strings.Fields(benchkit.LoadAvg() + " ")[0], 64)
			s.mu.Lock()
			s.peakKB = max(s.peakKB, kb)
			s.maxLoad = max(s.maxLoad, load)
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// end stops the sampling and returns the peak RSS (kB) and the highest 1-minute load average.
func (s *rss) end() (int64, float64) {
	close(s.stop)
	<-s.done
	return s.peakKB, s.maxLoad
}
