package testenv

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"testing"
)

// TLSClient returns an HTTP client that trusts only the certificates in the PEM file caFile
// (the CA a test HTTPS server wrote, such as the demo receiver's), with Patience as its timeout.
func TLSClient(t testing.TB, caFile string) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("testenv: no certificate in %s", caFile)
	}
	return &http.Client{Timeout: Patience, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
}
