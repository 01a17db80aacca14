package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
)

// The broadcasts' kit: a front of the fake upstream that records each send's arrival and answer
// (sendFront), a Caddy with the relay, the management API, the inbound endpoint and the
// broadcast sender (broadcastCaddy), and the broadcast API's reads.

// upSend is one send (POST …/messages) the front received.
type upSend struct {
	to     string // the send's "to", digits only
	at     time.Time
	body   []byte
	status int    // the fake's answer; 0 when the caller went away before it (cut)
	wamid  string // of a 2xx answer
	// instance is the Caddy that sent it: the name in its upstream's path (sendFront.upstream).
	instance string
}

// sendFront stands before the fake upstream: it records every send's arrival time, recipient
// and answer, and holds each send hold long first (the upstream's work, which keeps sends in
// flight); a send whose caller goes away meanwhile (a killed Caddy) is recorded unanswered and
// never reaches the fake. Every other request goes to the fake as is. A Caddy whose upstream is
// upstream(name) is told apart by the name its requests carry in their path.
type sendFront struct {
	fake     *fakegraph.Server
	url      string
	hold     atomic.Int64
	inFlight atomic.Int64
	mu       sync.Mutex
	sends    []upSend
}

func newSendFront(t *testing.T, fake *fakegraph.Server) *sendFront {
	f := &sendFront{fake: fake}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

var nonDigits = regexp.MustCompile(`\D`)

// upstream is the front's base URL for the Caddy named name.
func (f *sendFront) upstream(name string) string { return f.url + "/" + instancePrefix + name }

const instancePrefix = "instance-"

func (f *sendFront) serve(w http.ResponseWriter, r *http.Request) {
	var instance string
	if first, rest, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/"); ok && strings.HasPrefix(first, instancePrefix) {
		instance = strings.TrimPrefix(first, instancePrefix)
		r.URL.Path, r.URL.RawPath = "/"+rest, ""
	}
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/messages") {
		f.fake.ServeHTTP(w, r)
		return
	}
	at := time.Now()
	body, _ := io.ReadAll(r.Body)
	var b struct {
		To string `json:"to"`
	}
	_ = json.Unmarshal(body, &b)
	f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	f.mu.Lock()
	i := len(f.sends)
	f.sends = append(f.sends, upSend{to: nonDigits.ReplaceAllString(b.To, ""), at: at, body: body, instance: instance})
	f.mu.Unlock()
	if d := time.Duration(f.hold.Load()); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-r.Context().Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.Header.Del("Accept-Encoding") // a plain answer, to read its wamid
	rec := httptest.NewRecorder()
	f.fake.ServeHTTP(rec, r)
	var sent struct {
		Messages []struct{ ID string } `json:"messages"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &sent)
	f.mu.Lock()
	f.sends[i].status = rec.Code
	if rec.Code/100 == 2 && len(sent.Messages) == 1 {
		f.sends[i].wamid = sent.Messages[0].ID
	}
	f.mu.Unlock()
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// got returns a copy of the sends so far, in order of arrival.
func (f *sendFront) got() []upSend {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]upSend(nil), f.sends...)
}

// answered counts the sends the fake answered.
func (f *sendFront) answered() int {
	n := 0
	for _, s := range f.got() {
		if s.status != 0 {
			n++
		}
	}
	return n
}

// byRecipient groups the sends by recipient.
func (f *sendFront) byRecipient() map[string][]upSend {
	m := map[string][]upSend{}
	for _, s := range f.got() {
		m[s.to] = append(m[s.to], s)
	}
	return m
}

// broadcastCaddy starts a Caddy process on e's database with the upstream at upstream (a base
// URL), serving the relay (its per-channel limit rateLimit: "<requests> <window>"), the management API
// (/v1, its per-key limit raised for the tests' polling), the inbound endpoint
// (/webhooks/upstream) and /metrics, and running the broadcast sender with the lines
// broadcasts (the broadcasts block's body; "" for the defaults); redisURL shares the relay's
// limit with other instances (none when ""). It returns the origin.
func (e *relayEnv) broadcastCaddy(upstream, redisURL, rateLimit, broadcasts string) string {
	e.t.Helper()
	app := fmt.Sprintf("meta {\n\t\t\tapp_secret %s\n\t\t\tverify_token %s\n\t\t}\n\t\tmanagement_rate_limit 1000000 1m", testAppSecret, testVerifyToken)
	if broadcasts != "" {
		app += "\n\t\tbroadcasts {\n\t\t\t" + broadcasts + "\n\t\t}"
	}
	if redisURL != "" {
		app += "\n\t\tredis {env.WBR_TEST_REDIS}"
	}
	site := fmt.Sprintf(`handle_path %s/* {
		wabarelay_proxy {
			rate_limit %s
		}
	}
	handle_path /v1/* {
		wabarelay_api
	}
	handle /webhooks/upstream {
		wabarelay_inbound
	}
	handle /metrics {
		metrics
	}`, proxyPrefix, rateLimit)
	return e.caddySite("", app, upstream, site, "WBR_TEST_REDIS="+redisURL)
}

// broadcastJSON is a Broadcast as the API answers it.
type broadcastJSON struct {
	ID            string  `json:"id"`
	ChannelID     string  `json:"channel_id"`
	Name          string  `json:"name"`
	Status        string  `json:"status"`
	PausedReason  *string `json:"paused_reason"`
	RatePerMinute int     `json:"rate_per_minute"`
	Counts        struct {
		Total, Queued, Accepted, Sent, Delivered, Read, Failed, Unknown int
	} `json:"counts"`
}

// recipientJSON is an item of GET /broadcasts/{id}/recipients.
type recipientJSON struct {
	To     string  `json:"to"`
	Status string  `json:"status"`
	WAMID  *string `json:"wamid"`
	Error  *struct {
		Code  int    `json:"code"`
		Title string `json:"title"`
	} `json:"error"`
	Attempts int `json:"attempts"`
}

// broadcastBody is a POST /channels/{id}/broadcasts body: template tmpl (en_US) to tos, each
// with one body parameter (its name, "name-<to>") when withParams, at rate (0: the default), with
// the JSON members extra (",…") added.
func broadcastBody(name, tmpl string, tos []string, withParams bool, rate int, extra string) string {
	rs := make([]string, len(tos))
	for i, to := range tos {
		if withParams {
			rs[i] = fmt.Sprintf(`{"to":%q,"components":[{"type":"body","parameters":[{"type":"text","text":"name-%s"}]}]}`,
				to, nonDigits.ReplaceAllString(to, ""))
		} else {
			rs[i] = fmt.Sprintf(`{"to":%q}`, to)
		}
	}
	b := fmt.Sprintf(`{"name":%q,"template":{"name":%q,"language":{"code":"en_US"}},"recipients":[%s]`, name, tmpl, strings.Join(rs, ","))
	if rate > 0 {
		b += fmt.Sprintf(`,"rate_per_minute":%d`, rate)
	}
	return b + extra + "}"
}

// createBroadcast creates a broadcast on channel chID and returns it; anything but 201 fails.
func createBroadcast(t *testing.T, origin, key, chID, body string) broadcastJSON {
	t.Helper()
	r := apiCall(t, "POST", origin+"/v1/channels/"+chID+"/broadcasts", key, body)
	var b broadcastJSON
	if r.status != 201 || json.Unmarshal(r.body, &b) != nil || b.ID == "" {
		t.Fatalf("create broadcast: %d %.500s", r.status, r.body)
	}
	return b
}

// getBroadcast reads a broadcast; anything but 200 fails.
func getBroadcast(t *testing.T, origin, key, id string) broadcastJSON {
	t.Helper()
	r := apiCall(t, "GET", origin+"/v1/broadcasts/"+id, key, "")
	var b broadcastJSON
	if r.status != 200 || json.Unmarshal(r.body, &b) != nil {
		t.Fatalf("GET broadcast: %d %s", r.status, r.body)
	}
	return b
}

// broadcastAction posts pause, resume or cancel and returns the answer.
func broadcastAction(t *testing.T, origin, key, id, action string) relayResp {
	t.Helper()
	return apiCall(t, "POST", origin+"/v1/broadcasts/"+id+"/"+action, key, "")
}

var nextLink = regexp.MustCompile(`^<([^>]*)>;\s*rel="next"$`)

// allRecipients reads every recipient of a broadcast (of status, when set) page by page,
// limit a page, following the Link headers; it returns them and the number of pages read.
func allRecipients(t *testing.T, origin, key, id, status string, limit int) ([]recipientJSON, int) {
	t.Helper()
	q := url.Values{"limit": {fmt.Sprint(limit)}}
	if status != "" {
		q.Set("status", status)
	}
	base := origin + "/v1/broadcasts/" + id + "/recipients"
	next := base + "?" + q.Encode()
	var out []recipientJSON
	pages := 0
	for next != "" {
		r := apiCall(t, "GET", next, key, "")
		var page []recipientJSON
		if r.status != 200 || json.Unmarshal(r.body, &page) != nil {
			t.Fatalf("GET %s: %d %s", next, r.status, r.body)
		}
		pages++
		if pages > 1000 {
			t.Fatal("recipients: more than 1000 pages")
		}
		out = append(out, page...)
		next = ""
		if l := r.header.Get("Link"); l != "" {
			m := nextLink.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("Link %q", l)
			}
			u, err := url.Parse(base)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := url.Parse(m[1])
			if err != nil {
				t.Fatalf("Link %q: %v", l, err)
			}
			next = u.ResolveReference(ref).String()
			if !strings.Contains(next, "status=") && status != "" {
				t.Fatalf("Link %q drops the status filter", l)
			}
		}
	}
	return out, pages
}

// phones returns n distinct recipients' numbers, from 1555 01 first on.
func phones(first, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("1555%07d", first+i)
	}
	return out
}
