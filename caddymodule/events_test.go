package caddymodule

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/store"
)

// receiver is a local HTTPS webhook receiver that verifies both signatures independently and
// keeps a ledger of event ids.
type receiver struct {
	srv    *httptest.Server
	secret string
	delay  time.Duration
	mu     sync.Mutex
	hits   map[string]int // webhook-id → deliveries
	bad    int
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{hits: map[string]int{}}
	rc.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		delay := rc.delay
		ok := rc.verify(r.Header, body)
		if ok {
			rc.hits[r.Header.Get("webhook-id")]++
		} else {
			rc.bad++
		}
		rc.mu.Unlock()
		time.Sleep(delay) // the receiver's work (keeps attempts in flight), not synchronisation
		if !ok {
			w.WriteHeader(401)
			return
		}
		w.WriteHeader(204)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) verify(h http.Header, body []byte) bool {
	var ts, v1 string
	for _, p := range strings.Split(h.Get("X-Svc-Signature"), ",") {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			v1 = v
		}
	}
	mac := hmac.New(sha256.New, []byte(rc.secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	if !hmac.Equal([]byte(hex.EncodeToString(mac.Sum(nil))), []byte(v1)) || h.Get("webhook-timestamp") != ts {
		return false
	}
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(rc.secret, "whsec_"))
	mac = hmac.New(sha256.New, key)
	mac.Write([]byte(h.Get("webhook-id") + "." + ts + "."))
	mac.Write(body)
	return h.Get("webhook-signature") == "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

func (rc *receiver) ledger() (distinct, total, bad int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, n := range rc.hits {
		distinct++
		total += n
	}
	return distinct, total, rc.bad
}

// TestEventsEndToEnd: upstream batch → inbound handler → dispatcher → HTTPS receiver, signed; then the
// Caddy process is killed with SIGKILL mid-load and another started: every event is delivered
// at least once (the ledger shows none lost).
func TestEventsEndToEnd(t *testing.T) {
	e := newRelayEnv(t, "")
	rc := newReceiver(t)
	caPath := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(caPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: rc.srv.Certificate().Raw}), 0o600)
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n retry_delays 200ms 200ms 200ms\n timeout 2s\n lease 3s\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, caPath)
	site := "handle /webhooks/upstream {\n wabarelay_inbound\n}"
	origin := e.caddyWith("", appExtra, site)

	e.channelOn(true, pnid)
	w, secret, err := e.store.CreateWebhook(context.Background(), e.org, store.NewWebhook{Name: "r", URL: rc.srv.URL + "/hook", Events: []string{"messages", "message_status"}})
	if err != nil {
		t.Fatal(err)
	}
	rc.secret = secret
	_ = w

	post := func(origin string, msgs, sts []string) {
		t.Helper()
		if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, upstreamBatch(map[string][2][]string{pnid: {msgs, sts}})); status != 200 {
			t.Fatalf("inbound: %d %s", status, body)
		}
	}
	post(origin, []string{"a1", "a2", "a3"}, []string{"a1", "a2"})
	waitFor(t, 30*time.Second, func() bool { d, _, _ := rc.ledger(); return d == 5 })

	// crash mid-load: a slow receiver keeps attempts in flight, then SIGKILL
	rc.mu.Lock()
	rc.delay = 300 * time.Millisecond
	rc.mu.Unlock()
	const batches = 20
	for i := 0; i < batches; i++ {
		post(origin, []string{fmt.Sprint("c", i)}, nil)
	}
	// kill once attempts of the new batches are in flight (the receiver holds each 300 ms)
	waitFor(t, 30*time.Second, func() bool { d, _, _ := rc.ledger(); return d > 5 })
	if err := e.procs[origin].Process.Kill(); err != nil {
		t.Fatal(err)
	}
	delivered, _, _ := rc.ledger()
	t.Logf("killed with %d of %d events delivered", delivered, 5+batches)
	rc.mu.Lock()
	rc.delay = 0
	rc.mu.Unlock()
	origin2 := e.caddyWith("", appExtra, site)
	took := waitFor(t, time.Minute, func() bool { d, _, _ := rc.ledger(); return d == 5+batches })
	distinct, total, bad := rc.ledger()
	t.Logf("after restart: %d distinct events delivered (%d deliveries, %d duplicates) in %v; lost 0", distinct, total, total-distinct, took)
	if bad != 0 {
		t.Fatalf("%d deliveries failed signature verification", bad)
	}
	var pending int
	e.pool.QueryRow(context.Background(), `SELECT count(*) FROM deliveries WHERE status <> 'delivered'`).Scan(&pending)
	waitFor(t, 30*time.Second, func() bool {
		e.pool.QueryRow(context.Background(), `SELECT count(*) FROM deliveries WHERE status <> 'delivered'`).Scan(&pending)
		return pending == 0
	})
	// metrics of the second instance: attempts by outcome, and the queue drained
	m := call(t, "GET", origin2+"/metrics", "", "")
	for _, want := range []string{`caddy_wabarelay_delivery_attempts_total{outcome="delivered"}`, "caddy_wabarelay_delivery_queue_depth 0",
		"caddy_wabarelay_delivery_oldest_due_seconds 0"} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestOverloadInboundAnswersEveryPost: a burst of posts far beyond what one inbound slot and a slow
// receiver can take at once (pool_max_conns 2: one inbound transaction at a time; per_webhook 2,
// the receiver holding each attempt 20 ms) is answered 200 post by post — waiting posts queue for
// the inbound handler, none is refused — and every event is then delivered exactly once, the backlog
// draining from the queue.
func TestOverloadInboundAnswersEveryPost(t *testing.T) {
	e := newRelayEnv(t, "")
	rc := newReceiver(t)
	rc.delay = 20 * time.Millisecond
	caPath := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(caPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: rc.srv.Certificate().Raw}), 0o600)
	sep := "?"
	if strings.Contains(e.dsn, "?") {
		sep = "&"
	}
	e.dsn += sep + "pool_max_conns=2"
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n per_webhook 2\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, caPath)
	origin := e.caddyWith("", appExtra, "handle /webhooks/upstream {\n wabarelay_inbound\n}")
	e.channelOn(true, pnid)
	_, secret, err := e.store.CreateWebhook(context.Background(), e.org, store.NewWebhook{Name: "r", URL: rc.srv.URL + "/hook", Events: []string{"messages"}})
	if err != nil {
		t.Fatal(err)
	}
	rc.secret = secret

	const posts, perPost = 40, 10
	statuses := make([]int, posts)
	var wg sync.WaitGroup
	for p := range posts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ids []string
			for i := range perPost {
				ids = append(ids, fmt.Sprintf("o%d-%d", p, i))
			}
			body := upstreamBatch(map[string][2][]string{pnid: {ids, nil}})
			req, _ := http.NewRequest("POST", origin+"/webhooks/upstream", strings.NewReader(body))
			req.Header.Set(inbound.SignatureHeader, inbound.Sign(testAppSecret, []byte(body)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return // status 0: reported below
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[p] = resp.StatusCode
		}()
	}
	wg.Wait()
	for p, st := range statuses {
		if st != http.StatusOK {
			t.Fatalf("post %d answered %d, want 200 (statuses %v)", p, st, statuses)
		}
	}
	waitFor(t, 2*time.Minute, func() bool { d, _, _ := rc.ledger(); return d == posts*perPost })
	waitFor(t, 30*time.Second, func() bool { return e.count("delivery_queue") == 0 })
	distinct, total, bad := rc.ledger()
	if distinct != posts*perPost || total != distinct || bad != 0 {
		t.Fatalf("%d distinct events delivered in %d deliveries (%d bad signatures), want %d once each", distinct, total, bad, posts*perPost)
	}
}
