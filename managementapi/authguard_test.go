package managementapi_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/authguard"
	"github.com/wabarelay/wabarelay/managementapi"
)

// TestBadKeysCostNoQuery: an address that presented too many bad API keys is refused with 429
// and Retry-After before any lookup — even with the database gone — for every key the guard
// does not know valid, while other addresses are served. A key that authenticated before is
// not refused by the guard.
func TestBadKeysCostNoQuery(t *testing.T) {
	guard := authguard.New(3, time.Minute, 100)
	e := newEnv(t, func(o *managementapi.Options) { o.AuthGuard = guard })
	from := func(addr, key string) response {
		r := e.newRequest("GET", "/channels", key, "")
		r.RemoteAddr = addr + ":4242"
		return e.doRequest(r, "")
	}
	bad := "crt_pk_" + strings.Repeat("A", 44)
	for i := 0; i < 3; i++ {
		expectError(t, from("198.51.100.1", bad), 401, "Invalid or revoked API key")
	}
	if r := from("198.51.100.2", e.keyA); r.status != 200 {
		t.Fatalf("another address: %d %s", r.status, r.body)
	}
	// keyA authenticated (from .2): the guard knows it valid and lets it through from .1 too
	if r := from("198.51.100.1", e.keyA); r.status != 200 {
		t.Fatalf("a key known valid, from the refused address: %d %s", r.status, r.body)
	}
	e.Pool.Close() // from here on a lookup could only fail
	for _, key := range []string{bad, e.keyB, "garbage"} {
		r := from("198.51.100.1", key)
		expectError(t, r, 429, "Rate limit exceeded")
		if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
			t.Fatalf("Retry-After = %q", r.header.Get("Retry-After"))
		}
	}
	// a malformed key is refused without a lookup too (401, not 503)
	expectError(t, from("198.51.100.3", "crt_pk_short"), 401, "Invalid or revoked API key")
}
