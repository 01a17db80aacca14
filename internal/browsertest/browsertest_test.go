package browsertest_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/wabarelay/wabarelay/internal/browsertest"
)

// TestCapture checks that a page records what the browser tests fail on: a
// CSP violation, console.error, an uncaught exception and a failed load (with
// its status), including those of a document the tab has left; and that
// dialogs are answered as asked. The 404 is a script the CSP allows: a blocked
// image (missing.png) is never requested, so recent Chromium reports only its
// CSP violation.
func TestCapture(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /bad", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'self'")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, `<!doctype html><title>bad</title><script>console.log("inline ran")</script>
<script src="/app.js"></script><script src="/missing.js"></script><img src="/missing.png" alt="">`)
	})
	mux.HandleFunc("GET /app.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript")
		_, _ = io.WriteString(w, `console.error("boom from app.js"); throw new Error("uncaught here");`)
	})
	mux.HandleFunc("GET /good", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'self'")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, `<!doctype html><title>good</title><p id="ok">fine</p>`)
	})
	mux.HandleFunc("GET /gone", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusGone)
		_, _ = io.WriteString(w, `<!doctype html><title>gone</title><p>gone</p>`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	b := browsertest.Start(t)

	p := b.NewPage(t)
	p.Navigate(t, srv.URL+"/bad")
	// Leave the page: its reports must survive the navigation.
	resp := p.Navigate(t, srv.URL+"/gone")
	if resp.Status != http.StatusGone {
		t.Fatalf("/gone: %d", resp.Status)
	}
	p.Do(t, chromedp.WaitVisible(chromedp.CSS("p")))
	want := map[string]bool{"csp": false, "console.error": false, "exception": false, "404": false, "410": false}
	var all []string
	for _, e := range p.ConsoleErrors() {
		all = append(all, e.String())
		switch {
		case e.Source == "csp" && strings.Contains(e.Text, "script-src"):
			want["csp"] = true
		case e.Source == "console" && strings.Contains(e.Text, "boom from app.js"):
			want["console.error"] = true
		case e.Level == "exception" && strings.Contains(e.Text, "uncaught here"):
			want["exception"] = true
		case e.HTTPStatus() == 404:
			want["404"] = true
		case e.HTTPStatus() == 410:
			want["410"] = true
		}
	}
	for k, ok := range want {
		if !ok {
			t.Errorf("not recorded: %s; recorded:\n%s", k, strings.Join(all, "\n"))
		}
	}

	// A clean page in a fresh tab records nothing; a dialog is answered as asked.
	q := b.NewPage(t)
	q.Navigate(t, srv.URL+"/good")
	if got := browsertest.Eval[bool](t, q, `confirm("first?")`); got {
		t.Errorf("confirm answered OK by default, want Cancel")
	}
	q.AnswerDialogs(true)
	if got := browsertest.Eval[bool](t, q, `confirm("second?")`); !got {
		t.Errorf("confirm answered Cancel after AnswerDialogs(true)")
	}
	if d := q.Dialogs(); len(d) != 2 || d[0] != "first?" || d[1] != "second?" {
		t.Errorf("dialogs = %q", d)
	}
	if errs := q.ConsoleErrors(); len(errs) != 0 {
		t.Errorf("a clean page recorded %v", errs)
	}
	q.AssertNoConsoleErrors(t)
	q.Screenshot(t, "browsertest", "TestCapture-good-desktop.png")
}
