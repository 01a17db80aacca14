package e2e

import (
	"bytes"
	"context"
	"fmt"
	mathrand "math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// signInClient posts sign-ins and loads dashboard pages on a Caddy at origin, without
// following redirects.
type signInClient struct {
	t      *testing.T
	origin string
	http   *http.Client
}

func newSignInClient(t *testing.T, origin string) *signInClient {
	return &signInClient{t: t, origin: origin, http: &http.Client{Timeout: testenv.Patience,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// signIn posts the sign-in form with key and returns the answer and the session cookie's value
// ("" when none was set).
func (c *signInClient) signIn(key string) (*http.Response, string) {
	req, _ := http.NewRequest("POST", c.origin+"/dashboard/login", strings.NewReader(url.Values{"api_key": {key}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Errorf("sign-in: %v", err)
		return &http.Response{}, ""
	}
	resp.Body.Close()
	for _, ck := range resp.Cookies() {
		if ck.Name == "wabarelay_dashboard" && ck.Value != "" {
			return resp, ck.Value
		}
	}
	return resp, ""
}

// page loads path with the session cookie value.
func (c *signInClient) page(path, cookie string) *http.Response {
	c.t.Helper()
	req, _ := http.NewRequest("GET", c.origin+path, nil)
	req.Header.Set("Cookie", "wabarelay_dashboard="+cookie)
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("GET %s: %v (blocked on the database?)", path, err)
	}
	resp.Body.Close()
	return resp
}

// sessionHashes returns the token hashes of the key's dashboard sessions.
func sessionHashes(t *testing.T, e *relayEnv, key store.APIKey) [][]byte {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT token_hash FROM dashboard_sessions WHERE api_key_id = $1`, key.ID)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for rows.Next() {
		var h []byte
		if err := rows.Scan(&h); err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// expectSessions checks that the key's sessions are exactly those of the cookies.
func expectSessions(t *testing.T, e *relayEnv, key store.APIKey, cookies []string, what string) {
	t.Helper()
	got := sessionHashes(t, e, key)
	want := make([][]byte, len(cookies))
	for i, c := range cookies {
		want[i] = store.TokenHash(c)
	}
	slices.SortFunc(got, bytes.Compare)
	slices.SortFunc(want, bytes.Compare)
	if !slices.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("%s: the key has %d sessions, want exactly the %d of %s", what, len(got), len(want), what)
	}
}

// TestDashboardSignInLimitedAndSessionsBounded: through Caddy (the repo's Caddyfile, its
// management rate limit set to 30 an hour), every sign-in costs a request of the key's
// management rate limit — the API's own — and a key holds at most store.MaxDashboardSessions
// sessions: signing in once more ends the oldest, whose cookie then names no session. A burst
// of concurrent sign-ins past the limit gets 429 with Retry-After and makes no session; the
// key's sessions never exceed the bound, and its API calls are refused too (one budget).
func TestDashboardSignInLimitedAndSessionsBounded(t *testing.T) {
	t.Parallel()
	const limit = 30
	e := newRelayEnv(t)
	origin := e.repoCaddy(testenv.FreePort(t), func(cfg string) string {
		return strings.Replace(cfg, "management_rate_limit 600 1m", fmt.Sprintf("management_rate_limit %d 1h", limit), 1)
	}, e.metaAppEnv()...)
	keyRec, key := e.fix.APIKey(t, e.org, &testenv.APIKeyOpts{Name: "sessions"})
	c := newSignInClient(t, origin)
	bound := store.MaxDashboardSessions

	// One by one: bound+1 sign-ins, each a session; the key never holds more than the bound.
	var cookies []string
	for i := 1; i <= bound+1; i++ {
		resp, cookie := c.signIn(key)
		if resp.StatusCode != http.StatusSeeOther || cookie == "" {
			t.Fatalf("sign-in %d: %d", i, resp.StatusCode)
		}
		cookies = append(cookies, cookie)
		if n := len(sessionHashes(t, e, keyRec)); n > bound {
			t.Fatalf("after sign-in %d the key has %d sessions, bound %d", i, n, bound)
		}
	}
	// The oldest was ended: the key's sessions are exactly the newest bound, and the first
	// cookie names no session (sent back to sign in, the cookie deleted).
	expectSessions(t, e, keyRec, cookies[1:], "the newest sign-ins")
	resp := c.page("/dashboard/channels", cookies[0])
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/dashboard/login" {
		t.Fatalf("the oldest session's cookie: %d %s; want a redirect to sign in", resp.StatusCode, resp.Header.Get("Location"))
	}

	// A burst of concurrent sign-ins: the limit's remaining budget gets sessions, the rest 429
	// with Retry-After and no session.
	const burst = 20
	remaining := limit - (bound + 1)
	var mu sync.Mutex
	var burstCookies []string
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for range burst {
		wg.Go(func() {
			resp, cookie := c.signIn(key)
			mu.Lock()
			defer mu.Unlock()
			statuses[resp.StatusCode]++
			switch {
			case resp.StatusCode == http.StatusSeeOther && cookie != "":
				burstCookies = append(burstCookies, cookie)
			case resp.StatusCode == http.StatusTooManyRequests && cookie == "" && resp.Header.Get("Retry-After") != "":
			default:
				t.Errorf("burst sign-in: %d, Retry-After %q, cookie set %v", resp.StatusCode, resp.Header.Get("Retry-After"), cookie != "")
			}
		})
	}
	wg.Wait()
	if statuses[http.StatusSeeOther] != remaining || statuses[http.StatusTooManyRequests] != burst-remaining {
		t.Fatalf("burst of %d sign-ins with %d left in the key's budget: %v", burst, remaining, statuses)
	}
	// The key's sessions: the burst's and the newest of the one-by-one ones, bound in all.
	expectSessions(t, e, keyRec, append(slices.Clone(cookies[len(cookies)-(bound-remaining):]), burstCookies...),
		"the burst and the newest one-by-one sign-ins")

	// One budget: the key's API calls are refused too, and another key signs in.
	req, _ := http.NewRequest("GET", origin+"/v1/channels", nil)
	req.Header.Set("x-api-key", key)
	if r := do(t, req); r.status != http.StatusTooManyRequests {
		t.Fatalf("API call of the key whose sign-ins spent the budget: %d %s", r.status, r.body)
	}
	_, key2 := e.fix.APIKey(t, e.org, &testenv.APIKeyOpts{Name: "other"})
	if resp, cookie := c.signIn(key2); resp.StatusCode != http.StatusSeeOther || cookie == "" {
		t.Fatalf("another key's sign-in: %d", resp.StatusCode)
	}
}

// TestGuardAdmitsKnownCredentials: through Caddy (the repo's Caddyfile), after 20 garbage
// session cookies from one address have it refused, an API key and a channel token that
// authenticated before (known valid, from memory) still work from that address, and so does a
// live session cookie; garbage from it — cookies, API keys, channel tokens — and a valid key
// this instance has not seen yet are still refused with 429, and the garbage costs no query:
// with the credential tables locked (a lookup would block), it is answered.
func TestGuardAdmitsKnownCredentials(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	ch := e.channel(true) // before Caddy starts, so that no notification drops it from the cache
	origin := e.repoCaddy(testenv.FreePort(t), nil, e.metaAppEnv()...)
	e.waitCacheFlushed() // the cache is flushed when the listener connects
	send := origin + proxyPrefix + "/" + pnid + "/messages"
	_, key := e.fix.APIKey(t, e.org, &testenv.APIKeyOpts{Name: "known"})
	_, unseen := e.fix.APIKey(t, e.org, &testenv.APIKeyOpts{Name: "unseen"})
	api := func(key string) relayResp {
		t.Helper()
		req, _ := http.NewRequest("GET", origin+"/v1/channels", nil)
		req.Header.Set("x-api-key", key)
		return do(t, req)
	}
	c := newSignInClient(t, origin)

	// The valid credentials are used once: the API key, a session, the channel token (last:
	// the longest after the listener's flush of the cache).
	if r := api(key); r.status != http.StatusOK {
		t.Fatalf("API call: %d %s", r.status, r.body)
	}
	resp, session := c.signIn(key)
	if resp.StatusCode != http.StatusSeeOther || session == "" {
		t.Fatalf("sign-in: %d", resp.StatusCode)
	}
	testenv.Eventually(t, testenv.Patience, func() bool {
		return call(t, "POST", send, ch.ChannelToken, textBody).status == http.StatusOK
	}, "a send with the channel token")

	// 20 garbage cookies, then the address is refused.
	for i := 1; i <= authFailures+1; i++ {
		resp := c.page("/dashboard/channels", store.NewChannelToken())
		if i <= authFailures && resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("garbage cookie %d: %d", i, resp.StatusCode)
		}
		if i > authFailures && (resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "") {
			t.Fatalf("garbage cookie %d: %d; want 429 with Retry-After", i, resp.StatusCode)
		}
	}

	// The known valid credentials still work from the address.
	if r := api(key); r.status != http.StatusOK {
		t.Fatalf("API call with a known valid key from the refused address: %d %s", r.status, r.body)
	}
	if r := call(t, "POST", send, ch.ChannelToken, textBody); r.status != http.StatusOK {
		t.Fatalf("send with a known valid channel token from the refused address: %d %s", r.status, r.body)
	}
	if resp := c.page("/dashboard/channels", session); resp.StatusCode != http.StatusOK {
		t.Fatalf("page with a live session from the refused address: %d", resp.StatusCode)
	}

	// Unknown credentials are still refused: a valid key not seen yet, and garbage — without a
	// query: the tables a lookup reads are locked, and every answer arrives.
	expectRelayError(t, api(unseen), http.StatusTooManyRequests, "Rate limit exceeded")
	tx, err := e.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(context.Background(), `LOCK TABLE api_keys, dashboard_sessions, channels IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if resp := c.page("/dashboard/channels", store.NewChannelToken()); resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("garbage cookie %d, tables locked: %d", i, resp.StatusCode)
		}
		expectRelayError(t, callWithin(t, "GET", origin+"/v1/channels", "x-api-key", garbageKey()),
			http.StatusTooManyRequests, "Rate limit exceeded")
		expectRelayError(t, callWithin(t, "POST", send, "Authorization", "Bearer "+randomToken()),
			http.StatusTooManyRequests, "Rate limit exceeded")
	}
}

// callWithin sends a request with one header and no body, failing the test if no answer
// arrives within testenv.Patience (a request blocked on a locked table would never answer).
func callWithin(t *testing.T, method, url, header, value string) relayResp {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(textBody))
	req.Header.Set(header, value)
	req.Header.Set("Content-Type", "application/json")
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience)
	defer cancel()
	return do(t, req.WithContext(ctx))
}

// garbageKey returns a well-formed API key that is nobody's (its shape passes, so only the
// guard keeps it from a lookup).
func garbageKey() string {
	const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 44)
	for i := range b {
		b[i] = base62[mathrand.IntN(len(base62))]
	}
	return store.APIKeyPrefix + string(b)
}
