package testenv_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/dispatcher"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestReceiverVerifies: the receiver records deliveries, answers by attempt number, and its
// verifier accepts the dispatcher's signatures, returning their time, and refuses a changed
// body, another secret and headers out of their exact shape.
func TestReceiverVerifies(t *testing.T) {
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{Respond: func(n int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(500 + n)
	}})
	secret := store.NewWebhookSecret()
	body := []byte(`{"type":"messages"}`)
	svc, id, ts, sig := dispatcher.Sign(secret, uuid.New(), time.Unix(1700000000, 0), body)
	h := http.Header{"X-Svc-Signature": {svc}, "Webhook-Id": {id}, "Webhook-Timestamp": {ts}, "Webhook-Signature": {sig}}
	if at, err := testenv.VerifySignature(secret, h, body); err != nil || at.Unix() != 1700000000 {
		t.Fatalf("signed at %v: %v", at, err)
	}
	// refused: a changed body, another secret, a secret not of 32 bytes, a header out of shape
	// or another timestamp, and a webhook-signature list without the right one
	other := func(k, v string) http.Header { c := h.Clone(); c.Set(k, v); return c }
	tPart, v1Part, _ := strings.Cut(svc, ",")
	for name, c := range map[string]struct {
		secret string
		h      http.Header
		body   []byte
	}{
		"changed body":        {secret, h, append(body, ' ')},
		"another secret":      {store.NewWebhookSecret(), h, body},
		"short secret":        {"whsec_AAAA", h, body},
		"v1 first":            {secret, other("X-Svc-Signature", v1Part+","+tPart), body},
		"extra part":          {secret, other("X-Svc-Signature", svc+",v0=00"), body},
		"upper-case hex":      {secret, other("X-Svc-Signature", tPart+",v1="+strings.ToUpper(strings.TrimPrefix(v1Part, "v1="))), body},
		"other timestamp":     {secret, other("Webhook-Timestamp", "1700000001"), body},
		"wrong signature":     {secret, other("Webhook-Signature", "v1,"+strings.Repeat("A", 43)+"="), body},
		"no webhook-id":       {secret, other("Webhook-Id", ""), body},
		"signature elsewhere": {secret, other("Webhook-Signature", "v2,"+sig[3:]), body},
	} {
		if _, err := testenv.VerifySignature(c.secret, c.h, c.body); err == nil {
			t.Errorf("%s: verifies", name)
		}
	}
	// the list may hold other signatures beside the right one
	if _, err := testenv.VerifySignature(secret, other("Webhook-Signature", "v1,AAAA "+sig), body); err != nil {
		t.Errorf("a list holding the signature: %v", err)
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
	conn, err := f.Pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(t.Context(), `LISTEN "kit_test"`); err != nil {
		t.Fatal(err)
	}
	f.WaitListen(t, "kit_test")
	start := time.Now()
	testenv.Eventually(t, testenv.Patience, func() bool { return time.Since(start) > 20*time.Millisecond }, "time to pass")
}

// TestReceiverPerEventAndCAFile: PerEvent counts deliveries by webhook-id, and a client that
// trusts CAFile's certificates reaches the receiver over TLS.
func TestReceiverPerEventAndCAFile(t *testing.T) {
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	client := testenv.TLSClient(t, testenv.CAFile(t, rc.Certificate()))
	for _, id := range []string{"a", "b", "a"} {
		req, _ := http.NewRequest("POST", rc.URL, nil)
		req.Header.Set("Webhook-Id", id)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if got := rc.PerEvent(); len(got) != 2 || got["a"] != 2 || got["b"] != 1 {
		t.Fatalf("PerEvent %v", got)
	}
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
	resp, err := testenv.TLSClient(t, testenv.CAFile(t, srv.Certificate())).Get(srv.URL)
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
