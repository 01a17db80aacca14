package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// runCLI runs `caddy wabarelay <args>` in process and returns its output lines.
func runCLI(t *testing.T, args ...string) ([]map[string]any, error) {
	t.Helper()
	return testenv.RunCLI(t, caddycmd.Commands()["wabarelay"].CobraFunc, args...)
}

type relayResp struct {
	status int
	header http.Header
	body   []byte
}

func (r relayResp) errorMsg(t *testing.T) string {
	t.Helper()
	var m map[string]any
	if json.Unmarshal(r.body, &m) != nil || len(m) != 1 {
		t.Fatalf("not a JSON error: %d %s", r.status, r.body)
	}
	s, _ := m["error"].(string)
	return s
}

func call(t *testing.T, method, url, token, body string) relayResp {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return do(t, req)
}

// do sends req and reads the whole answer strictly: a body shorter or longer than its
// Content-Length, or a dropped connection, fails the test.
func do(t *testing.T, req *http.Request) relayResp {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer (%d, Content-Length %q): %v", req.Method, req.URL.Path, resp.StatusCode, resp.Header.Get("Content-Length"), err)
	}
	if cl := resp.Header.Get("Content-Length"); cl != "" && cl != strconv.Itoa(len(b)) {
		t.Fatalf("%s %s: Content-Length %s, body %d bytes", req.Method, req.URL.Path, cl, len(b))
	}
	return relayResp{resp.StatusCode, resp.Header, b}
}

func expectRelayError(t *testing.T, r relayResp, status int, msg string) {
	t.Helper()
	if r.status != status || r.errorMsg(t) != msg {
		t.Fatalf("got %d %s, want %d {\"error\":%q}", r.status, r.body, status, msg)
	}
}

const textBody = `{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"hi there"}}`

// apiCall sends a management API request with key through Caddy.
func apiCall(t *testing.T, method, url, key, body string) relayResp {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Content-Type", "application/json")
	return do(t, req)
}

const (
	testAppSecret   = "meta-app-secret"
	testVerifyToken = "verify-me"
)

// signedRequest is an upstream webhook post of body to url, signed with secret (unsigned when
// secret is empty).
func signedRequest(url, secret, body string) *http.Request {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if secret != "" {
		req.Header.Set(inbound.SignatureHeader, inbound.Sign(secret, []byte(body)))
	}
	return req
}

// signedPost sends signedRequest and returns the answer's status and body.
func signedPost(t *testing.T, url, secret, body string) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(signedRequest(url, secret, body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// upstreamBatch is an upstream webhook post: for each number, its messages and statuses.
func upstreamBatch(changes map[string][2][]string) string {
	var parts []string
	for pn, c := range changes {
		var msgs, sts []string
		for _, id := range c[0] {
			msgs = append(msgs, fmt.Sprintf(`{"from":"15550001111","id":"wamid.%s","timestamp":"1700000000","type":"text","text":{"body":"hi %s"}}`, id, id))
		}
		for _, id := range c[1] {
			sts = append(sts, fmt.Sprintf(`{"id":"wamid.%s","status":"delivered","timestamp":"1700000001","recipient_id":"15550001111"}`, id))
		}
		parts = append(parts, fmt.Sprintf(`{"field":"messages","value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550100","phone_number_id":"%s"},`+
			`"contacts":[{"profile":{"name":"Ann"},"wa_id":"15550001111"}],"messages":[%s],"statuses":[%s]}}`, pn, strings.Join(msgs, ","), strings.Join(sts, ",")))
	}
	return `{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","changes":[` + strings.Join(parts, ",") + `]}]}`
}

// conversationBatch is an upstream post of messages (id "wamid.<id>") from one customer each:
// ids[i] from froms[i].
func conversationBatch(ids, froms []string) string {
	msgs := make([]string, len(ids))
	for i, id := range ids {
		msgs[i] = fmt.Sprintf(`{"from":%q,"id":"wamid.%s","timestamp":"1700000000","type":"text","text":{"body":"hi"}}`, froms[i], id)
	}
	return `{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","changes":[{"field":"messages","value":` +
		`{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550100","phone_number_id":"` + pnid + `"},` +
		`"messages":[` + strings.Join(msgs, ",") + `]}}]}]}`
}

// sendOnceAcross makes 50 keyed sends of ch's body at once, send i on instance
// bases[i % len(bases)], the upstream slow enough for them to overlap, and checks that the
// upstream got one send (the only one on pnid so far) and all 50 got its answer; it returns the answers in order.
func (e *relayEnv) sendOnceAcross(bases []string, ch store.Channel, body string) []relayResp {
	t := e.t
	t.Helper()
	e.fake.SetLatency(150 * time.Millisecond)
	var wg sync.WaitGroup
	results := make([]relayResp, 50)
	for i := range results {
		wg.Go(func() { results[i] = call(t, "POST", bases[i%len(bases)]+"/"+pnid+"/messages", ch.ChannelToken, body) })
	}
	wg.Wait()
	e.fake.SetLatency(0)
	if n := len(e.fake.RequestsTo("POST", "/"+pnid+"/messages")); n != 1 {
		t.Fatalf("upstream sends = %d, want 1", n)
	}
	for i, r := range results {
		if r.status != 200 || !bytes.Equal(r.body, results[0].body) {
			t.Fatalf("answer %d: %d %s (first: %s)", i, r.status, r.body, results[0].body)
		}
	}
	return results
}

// acceptedAcross makes n GET calls one after the other, call i on instance
// bases[i % len(bases)], and returns how many were answered 200 and the first 429; any other
// answer fails the test.
func acceptedAcross(t *testing.T, bases []string, n int, path, token string) (accepted int, first429 relayResp) {
	t.Helper()
	for i := range n {
		switch r := call(t, "GET", bases[i%len(bases)]+path, token, ""); r.status {
		case 200:
			accepted++
		case 429:
			if first429.status == 0 {
				first429 = r
			}
		default:
			t.Fatalf("call %d: %d %s", i, r.status, r.body)
		}
	}
	return accepted, first429
}

// slowReceiver is the kit's HTTPS receiver answering each delivery after delay (the receiver's
// work, which keeps attempts in flight; not synchronisation).
func slowReceiver(t *testing.T, delay *atomic.Int64) *testenv.Receiver {
	return testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(_ int, w http.ResponseWriter, _ *http.Request) {
		time.Sleep(time.Duration(delay.Load()))
		w.WriteHeader(http.StatusNoContent)
	}})
}

// rss reads the process's resident set and its peak since the last resetPeak.
func rss(t *testing.T, pid int) (cur, peak int64) {
	t.Helper()
	cur, peak, ok := testenv.ProcMemory(pid)
	if !ok {
		t.Skip("no /proc: memory cannot be measured")
	}
	return cur, peak
}

// resetPeak starts a new peak period for pid.
func resetPeak(t *testing.T, pid int) {
	t.Helper()
	if err := testenv.ResetPeakMemory(pid); err != nil {
		t.Skipf("cannot reset the peak RSS: %v", err)
	}
}

func randomToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
