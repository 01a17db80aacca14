package testenv_test

import (
	"bytes"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/dispatcher"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestReceiverVerifies: the receiver records deliveries, answers by attempt number, and its
// verifier accepts the dispatcher's signatures and refuses a changed body or another secret.
func TestReceiverVerifies(t *testing.T) {
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{Respond: func(n int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(500 + n)
	}})
	secret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	body := []byte(`{"type":"messages"}`)
	svc, id, ts, sig := dispatcher.Sign(secret, uuid.New(), time.Now(), body)
	h := http.Header{"X-Svc-Signature": {svc}, "Webhook-Id": {id}, "Webhook-Timestamp": {ts}, "Webhook-Signature": {sig}}
	if err := testenv.VerifySignature(secret, h, body); err != nil {
		t.Fatal(err)
	}
	if testenv.VerifySignature(secret, h, append(body, ' ')) == nil || testenv.VerifySignature("whsec_AAAA", h, body) == nil {
		t.Fatal("a changed body or another secret verifies")
	}
	rc.Verify(secret)
	for want := 501; want <= 502; want++ {
		req, _ := http.NewRequest("POST", rc.URL+"/hook", bytes.NewReader(body))
		req.Header = h.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != want {
			t.Fatalf("answer %v %v, want %d", resp, err, want)
		}
		resp.Body.Close()
	}
	if d := rc.WaitN(t, 2); d[1].N != 2 || d[1].Path != "/hook" || !bytes.Equal(d[1].Body, body) {
		t.Fatalf("deliveries %+v", d)
	}
}

// TestFixtureFactories: the factories create rows with their defaults.
func TestFixtureFactories(t *testing.T) {
	f := testenv.NewStore(t)
	org := f.Org(t)
	_, key := f.APIKey(t, org.ID)
	if k, err := f.Store.AuthenticateAPIKey(t.Context(), key); err != nil || k.OrgID != org.ID {
		t.Fatalf("api key: %+v %v", k, err)
	}
	ch := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: f.Connection()})
	if rc, err := f.Store.RelayChannelByToken(t.Context(), ch.ChannelToken); err != nil || rc.UpstreamToken != "tok" {
		t.Fatalf("connected channel: %+v %v", rc, err)
	}
	w, secret := f.Webhook(t, org.ID, "https://r.example/h")
	if s, err := f.Store.WebhookSecret(t.Context(), w.ID); err != nil || s != secret {
		t.Fatalf("webhook secret: %v", err)
	}
	start := time.Now()
	testenv.Eventually(t, testenv.Patience, func() bool { return time.Since(start) > 20*time.Millisecond }, "time to pass")
}

// TestWaiting: Within reports whether a condition held in time; Parked counts the goroutines
// waiting in a select of the function it is told, and no others.
func TestWaiting(t *testing.T) {
	if testenv.Within(30*time.Millisecond, func() bool { return false }) || !testenv.Within(0, func() bool { return true }) {
		t.Fatal("Within misreports")
	}
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { parkHere(release) })
	}
	wg.Go(func() { <-release }) // blocked, but not in a select
	here := func(fn string) bool { return fn == "github.com/wabarelay/wabarelay/internal/testenv_test.parkHere" }
	testenv.Eventually(t, testenv.Patience, func() bool { return testenv.Parked(here) == 3 }, "3 parked goroutines")
	close(release)
	wg.Wait()
	if n := testenv.Parked(here); n != 0 {
		t.Fatalf("%d parked after their release", n)
	}
}

//go:noinline
func parkHere(release <-chan struct{}) {
	select {
	case <-release:
	case <-time.After(time.Hour):
	}
}

// TestRedisClient: the client reaches the server, with the options it was tuned with.
func TestRedisClient(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t), testenv.ShortTimeouts)
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if o := c.Options(); o.DialTimeout != 500*time.Millisecond || o.ReadTimeout != 500*time.Millisecond {
		t.Fatalf("options %+v", o)
	}
}

// TestFixtureQueries: Exec changes rows, Count and CountWhere count them, QueryValue reads one
// value of the type asked for.
func TestFixtureQueries(t *testing.T) {
	f := testenv.NewStore(t)
	a, b := f.Org(t, &testenv.OrgOpts{Name: "a"}), f.Org(t, &testenv.OrgOpts{Name: "b"})
	f.Channel(t, a.ID)
	f.Channel(t, a.ID)
	f.Channel(t, b.ID)
	if n, na := f.Count(t, "channels"), f.CountWhere(t, "channels", "org_id", a.ID); n != 3 || na != 2 {
		t.Fatalf("Count %d, CountWhere %d; want 3 and 2", n, na)
	}
	f.Exec(t, `UPDATE orgs SET name = $1 WHERE id = $2`, "renamed", b.ID)
	if name := testenv.QueryValue[string](t, f, `SELECT name FROM orgs WHERE id = $1`, b.ID); name != "renamed" {
		t.Fatalf("name %q", name)
	}
}

// TestTLSClient: the client trusts the certificate in the CA file it is given, and no other.
func TestTLSClient(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	resp, err := testenv.TLSClient(t, caFile).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := http.Get(srv.URL); err == nil {
		t.Fatal("the server's certificate is trusted without the CA file")
	}
}

// TestReceiverClose: a closed receiver refuses connections (a receiver gone down).
func TestReceiverClose(t *testing.T) {
	rc := testenv.NewReceiver(t)
	rc.Close()
	if resp, err := http.Post(rc.URL, "application/json", nil); err == nil {
		resp.Body.Close()
		t.Fatalf("a closed receiver answered %d", resp.StatusCode)
	}
}
