package testenv

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Receiver is a webhook receiver for tests: it records every delivery, answers each with
// ReceiverOpts.Respond (by attempt number), and, once it knows the webhook's secret (Verify),
// checks every delivery's signatures as docs/receiver-guide.md tells receivers to.
type Receiver struct {
	// URL is the receiver's base URL; deliveries to any path under it are recorded.
	URL string

	t       testing.TB
	srv     *httptest.Server
	respond func(n int, w http.ResponseWriter, r *http.Request)
	mu      sync.Mutex
	secret  string
	got     []Delivery
}

// Delivery is one request the receiver got.
type Delivery struct {
	N      int // 1 for the first request
	At     time.Time
	Path   string
	Header http.Header
	Body   []byte
}

// ReceiverOpts change a Receiver: by default it listens on plain HTTP and answers every
// delivery 200 "ok".
type ReceiverOpts struct {
	// TLS makes it listen on HTTPS with a certificate of its own (Roots trusts it).
	TLS bool
	// Respond, when set, answers the n-th request (counted from 1) instead of the default; the
	// request's body is there to read again.
	Respond func(n int, w http.ResponseWriter, r *http.Request)
	// Secret, when set, is the webhook secret every delivery must be signed with (see Verify).
	Secret string
}

// NewReceiver starts a receiver, closed at the end of the test.
func NewReceiver(t testing.TB, opts ...*ReceiverOpts) *Receiver {
	t.Helper()
	o := first(opts)
	rc := &Receiver{t: t, respond: o.Respond, secret: o.Secret}
	h := http.HandlerFunc(rc.serve)
	if o.TLS {
		rc.srv = httptest.NewTLSServer(h)
	} else {
		rc.srv = httptest.NewServer(h)
	}
	rc.URL = rc.srv.URL
	t.Cleanup(rc.srv.Close)
	return rc
}

// Close stops the receiver before the end of the test (a receiver gone down); it is closed
// at the end of the test anyway.
func (rc *Receiver) Close() { rc.srv.Close() }

func (rc *Receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	d := Delivery{N: len(rc.got) + 1, At: time.Now(), Path: r.URL.Path, Header: r.Header.Clone(), Body: body}
	rc.got = append(rc.got, d)
	secret := rc.secret
	rc.mu.Unlock()
	if secret != "" {
		if _, err := VerifySignature(secret, r.Header, body); err != nil {
			rc.t.Errorf("testenv: receiver: delivery %d: %v", d.N, err)
		}
	}
	if rc.respond != nil {
		r.Body = io.NopCloser(bytes.NewReader(body))
		rc.respond(d.N, w, r)
		return
	}
	io.WriteString(w, "ok")
}

// Verify makes the receiver check every later delivery's signatures against the webhook
// secret (failing the test on a mismatch), and checks the deliveries it already has.
func (rc *Receiver) Verify(secret string) {
	rc.t.Helper()
	rc.mu.Lock()
	rc.secret = secret
	got := append([]Delivery(nil), rc.got...)
	rc.mu.Unlock()
	for _, d := range got {
		if _, err := VerifySignature(secret, d.Header, d.Body); err != nil {
			rc.t.Errorf("testenv: receiver: delivery %d: %v", d.N, err)
		}
	}
}

// Deliveries returns the requests received so far, in order of arrival.
func (rc *Receiver) Deliveries() []Delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]Delivery(nil), rc.got...)
}

// Count returns how many requests the receiver got.
func (rc *Receiver) Count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.got)
}

// WaitN waits (up to Patience) until the receiver has at least n requests and returns them.
func (rc *Receiver) WaitN(t testing.TB, n int) []Delivery {
	t.Helper()
	Eventually(t, Patience, func() bool { return rc.Count() >= n }, "%d deliveries (have %d)", n, rc.Count())
	return rc.Deliveries()
}

// Roots returns a pool that trusts the receiver's TLS certificate.
func (rc *Receiver) Roots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(rc.srv.Certificate())
	return p
}

// Certificate returns the receiver's TLS certificate (nil without TLS).
func (rc *Receiver) Certificate() *x509.Certificate { return rc.srv.Certificate() }

// PerEvent returns how many deliveries the receiver got for each event: a count per
// webhook-id header (the event's id), so that len(PerEvent()) is the number of distinct events
// and a count above 1 a repeat.
func (rc *Receiver) PerEvent() map[string]int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := make(map[string]int, len(rc.got))
	for _, d := range rc.got {
		n[d.Header.Get("Webhook-Id")]++
	}
	return n
}

// CAFile writes certs, PEM-encoded one after the other, to a file in a temporary directory of the
// test and returns its path: a delivery root_ca that trusts test receivers (Receiver.Certificate).
func CAFile(t testing.TB, certs ...*x509.Certificate) string {
	t.Helper()
	var b []byte
	for _, c := range certs {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return path
}

// VerifySignature checks a delivery's signatures as docs/receiver-guide.md describes them,
// independently of the dispatcher's signing code, and returns the time they were made. The
// X-Svc-Signature must read exactly "t=<unix seconds>,v1=<hex>" with one or more ",v1=<hex>"
// (several during a secret rotation), one of which must be the lower-case hex HMAC-SHA256(secret,
// "<t>.<body>") (keyed with the whole secret); the Standard Webhooks webhook-signature, a
// space-separated list, must hold "v1,<base64 HMAC-SHA256(key,
// "<webhook-id>.<webhook-timestamp>.<body>")>", keyed with the 32 bytes the secret's part after
// "whsec_" encodes in base64; webhook-timestamp must be t.
func VerifySignature(secret string, h http.Header, body []byte) (time.Time, error) {
	header := h.Get("X-Svc-Signature")
	parts := strings.Split(header, ",")
	t, okT := strings.CutPrefix(parts[0], "t=")
	unix, err := strconv.ParseInt(t, 10, 64)
	if len(parts) < 2 || !okT || err != nil {
		return time.Time{}, fmt.Errorf("X-Svc-Signature %q is not t=<unix seconds>,v1=<hex>", header)
	}
	m := hmac.New(sha256.New, []byte(secret))
	_, _ = fmt.Fprintf(m, "%s.%s", t, body) // a hash never fails a write
	want := hex.EncodeToString(m.Sum(nil))
	found := false
	for _, p := range parts[1:] {
		v1, ok := strings.CutPrefix(p, "v1=")
		if !ok {
			return time.Time{}, fmt.Errorf("X-Svc-Signature %q is not t=<unix seconds>,v1=<hex>", header)
		}
		found = found || hmac.Equal([]byte(v1), []byte(want))
	}
	if !found {
		return time.Time{}, fmt.Errorf("X-Svc-Signature %q does not verify (want v1=%s)", header, want)
	}
	id, ts := h.Get("Webhook-Id"), h.Get("Webhook-Timestamp")
	if id == "" || ts != t {
		return time.Time{}, fmt.Errorf("webhook-id %q, webhook-timestamp %q (X-Svc-Signature t=%s)", id, ts, t)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || len(key) != 32 || !strings.HasPrefix(secret, "whsec_") {
		return time.Time{}, fmt.Errorf("secret %q is not whsec_<base64 of 32 bytes>", secret)
	}
	m = hmac.New(sha256.New, key)
	_, _ = fmt.Fprintf(m, "%s.%s.%s", id, ts, body) // a hash never fails a write
	wantSW := m.Sum(nil)
	for _, sig := range strings.Fields(h.Get("Webhook-Signature")) {
		if b64, ok := strings.CutPrefix(sig, "v1,"); ok {
			if got, err := base64.StdEncoding.DecodeString(b64); err == nil && hmac.Equal(got, wantSW) {
				return time.Unix(unix, 0), nil
			}
		}
	}
	return time.Time{}, fmt.Errorf("webhook-signature %q does not verify (want v1,%s)", h.Get("Webhook-Signature"),
		base64.StdEncoding.EncodeToString(wantSW))
}
