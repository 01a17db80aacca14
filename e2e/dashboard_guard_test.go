package e2e

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestDashboardSharesGuardAndLimit: through Caddy (the repo's Caddyfile, its management rate
// limit lowered to 5 a minute), the dashboard charges the sign-in and page reads to the key's
// management rate limit — the API's own limiter, so the key's API calls are refused too — and
// counts guessed session cookies in the app's one auth guard, so after 20 the address is
// refused by the API as well, before any lookup (for a key it has not seen authenticate).
func TestDashboardSharesGuardAndLimit(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	origin := e.repoCaddy(testenv.FreePort(t), func(cfg string) string {
		return strings.Replace(cfg, "management_rate_limit 600 1m", "management_rate_limit 5 1m", 1)
	}, e.metaAppEnv()...)
	_, key := e.fix.APIKey(t, e.org, &testenv.APIKeyOpts{Name: "pages"})
	_, key2 := e.fix.APIKey(t, e.org, &testenv.APIKeyOpts{Name: "other"})
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	send := func(method, path string, body url.Values, hdr ...string) *http.Response {
		t.Helper()
		var req *http.Request
		if body != nil {
			req, _ = http.NewRequest(method, origin+path, strings.NewReader(body.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		} else {
			req, _ = http.NewRequest(method, origin+path, nil)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}

	// Sign in (1 of 5), then load pages: 4 more, then 429 with Retry-After; the API too.
	resp := send("POST", "/dashboard/login", url.Values{"api_key": {key}})
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "wabarelay_dashboard" && c.Value != "" {
			cookie = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || cookie == nil {
		t.Fatalf("sign-in: %d %v", resp.StatusCode, resp.Header)
	}
	for i := 1; i <= 5; i++ {
		resp = send("GET", "/dashboard/webhooks", nil, "Cookie", cookie.Name+"="+cookie.Value)
		if i <= 4 && resp.StatusCode != http.StatusOK {
			t.Fatalf("page %d: %d", i, resp.StatusCode)
		}
	}
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("page 5: %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if r := call(t, "GET", origin+"/v1/channels", "", ""); r.status != http.StatusUnauthorized {
		t.Fatalf("API without a key: %d", r.status) // sanity: no credential, no failure counted
	}
	req, _ := http.NewRequest("GET", origin+"/v1/channels", nil)
	req.Header.Set("x-api-key", key)
	if r := do(t, req); r.status != http.StatusTooManyRequests {
		t.Fatalf("API call of the key whose pages spent the budget: %d %s", r.status, r.body)
	}

	// 20 guessed session cookies, then the address is refused, by the dashboard and the API.
	for i := 1; i <= 21; i++ {
		resp = send("GET", "/dashboard/channels", nil, "Cookie", "wabarelay_dashboard="+store.NewChannelToken())
		if i <= 20 && resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("guessed cookie %d: %d", i, resp.StatusCode)
		}
	}
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("guessed cookie 21: %d; want 429 with Retry-After", resp.StatusCode)
	}
	req, _ = http.NewRequest("GET", origin+"/v1/channels", nil)
	req.Header.Set("x-api-key", key2)
	if r := do(t, req); r.status != http.StatusTooManyRequests || !strings.Contains(string(r.body), "Rate limit exceeded") {
		t.Fatalf("API call from the refused address: %d %s", r.status, r.body)
	}
}
