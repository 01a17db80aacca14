package connect_test

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/authguard"
	"github.com/wabarelay/wabarelay/internal/httpx"
)

// TestConnectCookieSecureBehindProxy: the cookie is Secure whenever the client came over
// HTTPS as the host server reports it (its own TLS, or a trusted proxy's word), not only when
// this process terminated TLS.
func TestConnectCookieSecureBehindProxy(t *testing.T) {
	w := newWorld(t, "")
	h := w.handler(w.options())
	c := w.channel()
	for _, https := range []bool{true, false} {
		r := httptest.NewRequest("GET", "/connect/"+c.ChannelToken, nil)
		r = r.WithContext(httpx.WithClient(r.Context(), httpx.Client{Addr: "192.0.2.1", HTTPS: https}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		cookies := rec.Result().Cookies()
		if rec.Code != http.StatusSeeOther || len(cookies) != 1 || cookies[0].Secure != https {
			t.Fatalf("https=%v: %d %v", https, rec.Code, cookies)
		}
	}
}

// TestGuessedLinksCostNoQuery: malformed links are refused without a lookup; an address that
// presented too many unknown links gets 429 with Retry-After before any lookup, even with the
// database gone; other addresses are served.
func TestGuessedLinksCostNoQuery(t *testing.T) {
	w := newWorld(t, "")
	opt := w.options()
	opt.AuthGuard = authguard.New(3, time.Minute, 100)
	h := w.handler(opt)
	c := w.channel()
	get := func(addr, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/connect/"+token, nil)
		r.RemoteAddr = addr + ":5000"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	random := func() string {
		b := make([]byte, 32)
		rand.Read(b)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	for i := 0; i < 3; i++ {
		if rec := get("198.51.100.1", random()); rec.Code != http.StatusGone {
			t.Fatalf("unknown link: %d", rec.Code)
		}
	}
	if rec := get("198.51.100.2", c.ChannelToken); rec.Code != http.StatusSeeOther {
		t.Fatalf("valid link from another address: %d", rec.Code)
	}
	w.Pool.Close() // from here on a lookup could only fail (503)
	for _, token := range []string{random(), c.ChannelToken, "short"} {
		rec := get("198.51.100.1", token)
		ra, err := strconv.Atoi(rec.Header().Get("Retry-After"))
		if rec.Code != http.StatusTooManyRequests || err != nil || ra < 1 || ra > 60 {
			t.Fatalf("throttled address: %d Retry-After %q %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
		}
	}
	if rec := get("198.51.100.3", "not-a-token"); rec.Code != http.StatusGone {
		t.Fatalf("malformed link: %d (a lookup was tried)", rec.Code)
	}
}
