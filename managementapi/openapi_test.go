package managementapi_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/wabarelay/wabarelay/docs"
)

// TestOpenAPIServed: GET /openapi.yaml serves, without an API key, the embedded document the
// tests validate against; HEAD has its headers, If-None-Match gets 304, other methods 405.
func TestOpenAPIServed(t *testing.T) {
	e := newEnv(t)
	r := e.do("GET", "/openapi.yaml", "", "")
	if r.status != 200 || !bytes.Equal(r.body, docs.OpenAPI) {
		t.Fatalf("GET /openapi.yaml: %d, %d bytes (want %d)", r.status, len(r.body), len(docs.OpenAPI))
	}
	if ct, etag := r.header.Get("Content-Type"), r.header.Get("ETag"); ct != "application/yaml" || len(etag) != 34 {
		t.Fatalf("Content-Type %q, ETag %q", ct, etag)
	}
	// (HEAD is not in the document, like /health's: served without the validator)
	head := httptest.NewRecorder()
	e.handler.ServeHTTP(head, e.newRequest("HEAD", "/openapi.yaml", "", ""))
	if head.Code != 200 || head.Body.Len() != 0 || head.Header().Get("ETag") != r.header.Get("ETag") {
		t.Fatalf("HEAD: %d, %d bytes, ETag %q", head.Code, head.Body.Len(), head.Header().Get("ETag"))
	}
	req := e.newRequest("GET", "/openapi.yaml", "", "")
	req.Header.Set("If-None-Match", r.header.Get("ETag"))
	if c := e.doRequest(req, ""); c.status != http.StatusNotModified || len(c.body) != 0 {
		t.Fatalf("If-None-Match: %d, %d bytes", c.status, len(c.body))
	}
	m := e.do("POST", "/openapi.yaml", "", "")
	expectError(t, m, 405, "Method not allowed")
	if a := m.header.Get("Allow"); a != "GET, HEAD" {
		t.Fatalf("Allow %q", a)
	}
}
