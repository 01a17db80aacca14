package connect_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/connect"
)

// TestRoutes: the handler's answers that need no lookup — the JSON 404 and 405 (with the Allow
// of the path) for paths and methods it does not serve, the assets, and the templates never
// served as assets.
func TestRoutes(t *testing.T) {
	h, err := connect.New(connect.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const tok = "/connect/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	for _, c := range []struct {
		method, path string
		status       int
		allow        string // for a 405
	}{
		{"PUT", tok, 405, "GET, HEAD, POST"},
		{"DELETE", "/connect/assets", 405, "GET, HEAD, POST"},
		{"DELETE", "/connect/", 405, "GET, HEAD"},
		{"POST", "/connect", 405, "GET, HEAD"},
		{"POST", "/connect/assets/connect.js", 405, "GET, HEAD"},
		{"PUT", "/connect/assets/", 405, "GET, HEAD"},
		{"GET", "/connect/complete", 405, "POST"},
		{"HEAD", "/connect/complete", 405, "POST"},
		{"PUT", "/connect/complete", 405, "POST"},
		{"GET", "/", 404, ""},
		{"GET", "/connectx", 404, ""},
		{"POST", "/connectx/complete", 404, ""},
		{"GET", "/connect/a/b", 404, ""},
		{"POST", "/connect/a/b", 404, ""},
		{"GET", "/connect/a%2Fb", 404, ""},
		{"GET", "/connect/x/../y", 404, ""},
		{"GET", "/other/connect/", 404, ""},
	} {
		r := httptest.NewRequest(c.method, "http://relay.example.com"+c.path, nil)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		hdr := rec.Header()
		if rec.Code != c.status || hdr.Get("Allow") != c.allow || hdr.Get("Content-Type") != "application/json" ||
			hdr.Get("Referrer-Policy") != "no-referrer" || hdr.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s %s: %d Allow %q %v, want %d Allow %q", c.method, c.path, rec.Code, hdr.Get("Allow"), hdr, c.status, c.allow)
		}
		want := `{"error":"Not found"}`
		if c.status == 405 {
			want = `{"error":"Method not allowed"}`
		}
		if c.method != "HEAD" && strings.TrimSpace(rec.Body.String()) != want {
			t.Errorf("%s %s: body %q, want %s", c.method, c.path, rec.Body, want)
		}
	}

	// The assets are served, cacheable; the page's templates are not among them.
	for path, status := range map[string]int{
		"/connect/assets/connect.js": 200, "/connect/assets/connect.css": 200, "/connect/assets/favicon.svg": 200,
		"/connect/assets/page.html": 404, "/connect/assets/expired.html": 404, "/connect/assets/done.html": 404,
	} {
		for _, method := range []string{"GET", "HEAD"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
			if rec.Code != status || (status == 200 && rec.Header().Get("Cache-Control") != "public, max-age=300") {
				t.Errorf("%s %s: %d %v, want %d", method, path, rec.Code, rec.Header(), status)
			}
		}
	}
}
