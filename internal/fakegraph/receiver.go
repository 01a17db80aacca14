package fakegraph

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// Receiver is a minimal webhook receiver for the demo: it records each delivery it gets (any
// path), logs one line per delivery to Log (the event's type and id, the path, the body) when
// Log is set, and answers 204. A GET lists the recent deliveries as JSON ([]Delivery), oldest
// first, so that whoever holds the webhook's secret (the dashboard's demo page) can verify them.
// It does not verify signatures itself: it does not know the secrets.
type Receiver struct {
	// Log receives one line per delivery. Nil means no log.
	Log io.Writer

	mu     sync.Mutex
	recent []Delivery
}

// Delivery is one POST the receiver got.
type Delivery struct {
	ReceivedAt time.Time         `json:"received_at"`
	Path       string            `json:"path"`
	Headers    map[string]string `json:"headers"`
	// Body is the body as JSON (the body itself when it is JSON, else a JSON string of it);
	// Raw is its exact bytes, which the signatures cover.
	Body json.RawMessage `json:"body"`
	Raw  []byte          `json:"raw"`
}

const keepDeliveries = 50

// ServeHTTP records a POST, lists on GET.
func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
		body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
		if err != nil {
			http.Error(w, "read error", http.StatusBadRequest)
			return
		}
		d := Delivery{ReceivedAt: time.Now().UTC(), Path: r.URL.Path, Headers: map[string]string{}, Raw: body}
		for _, h := range []string{"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature", "X-Svc-Signature", "User-Agent", "Content-Type"} {
			if v := r.Header.Get(h); v != "" {
				d.Headers[h] = v
			}
		}
		var ev struct {
			ID   string `json:"id"`
			Type string `json:"type"`
		}
		var compact bytes.Buffer
		if json.Valid(body) {
			d.Body = body
			_ = json.Unmarshal(body, &ev)
			_ = json.Compact(&compact, body)
		} else {
			d.Body, _ = json.Marshal(string(body))
			compact.Write(d.Body)
		}
		rc.mu.Lock()
		rc.recent = append(rc.recent, d)
		if len(rc.recent) > keepDeliveries {
			rc.recent = append([]Delivery(nil), rc.recent[len(rc.recent)-keepDeliveries:]...)
		}
		rc.mu.Unlock()
		logf(rc.Log, "receiver: delivery %s (%s) %s %s\n", ev.Type, ev.ID, r.URL.Path, compact.String())
		w.WriteHeader(http.StatusNoContent)
	case http.MethodGet, http.MethodHead:
		rc.mu.Lock()
		out := append([]Delivery{}, rc.recent...)
		rc.mu.Unlock()
		b, _ := json.MarshalIndent(out, "", "  ")
		w.Header().Set("Content-Type", "application/json")
		w.Write(append(b, '\n'))
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

// ListenTLS serves h over HTTPS on addr with a certificate for localhost, 127.0.0.1 and ::1
// issued by a CA made up for this run, whose PEM it writes to caFile (when not ""), so that a
// client told to trust that file (Caddy's `delivery { root_ca }`) accepts the receiver. It
// returns the server's base URL.
func ListenTLS(addr, caFile string, h http.Handler) (string, *http.Server, error) {
	caPEM, cert, err := demoCertificate()
	if err != nil {
		return "", nil, err
	}
	if caFile != "" {
		if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
			return "", nil, err
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	return "https://" + ln.Addr().String(), srv, nil
}

// demoCertificate makes up a CA (returned as PEM) and a server certificate it issued for
// localhost, 127.0.0.1 and ::1, valid for 30 days.
func demoCertificate() ([]byte, tls.Certificate, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "wabarelay demo receiver CA (fakegraph)"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano() + 1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(30 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return caPEM, tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}, nil
}
