package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

func TestRelayAuthAndScope(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	base := e.caddy("")
	active := e.channel(true)
	pending := e.channel(false)
	send := base + "/" + pnid + "/messages"

	expectRelayError(t, call(t, "POST", send, "", textBody), 401, "Authorization header required")
	expectRelayError(t, call(t, "POST", send, "not-a-token", textBody), 401, "Invalid channel token")
	req, _ := http.NewRequest("POST", send, strings.NewReader(textBody))
	req.Header.Set("Authorization", "Basic "+active.ChannelToken)
	resp, _ := http.DefaultClient.Do(req)
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("Basic scheme: %d", resp.StatusCode)
	}
	expectRelayError(t, call(t, "POST", send, pending.ChannelToken, textBody), 403, "Channel is not active")
	// the API key is not a relay credential
	expectRelayError(t, call(t, "POST", send, "crt_pk_0123456789012345678901234567890123456789abcd", textBody), 401, "Invalid channel token")
	// scope: another number, an unknown object, the bare root
	for _, p := range []string{"/" + otherPnid + "/messages", "/123456/", "/", "/me", "/v26.0/" + otherPnid + "/messages"} {
		expectRelayError(t, call(t, "GET", base+p, active.ChannelToken, ""), 403, "Path not allowed for this channel")
	}
	if n := len(e.fake.Requests()); n != 0 {
		t.Fatalf("refused calls reached the upstream: %d", n)
	}
	// an operator-deactivated channel is refused
	if _, err := e.store.DeactivateChannel(context.Background(), active.ID); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Second, func() bool {
		return call(t, "POST", send, active.ChannelToken, textBody).status == 403
	}, "the deactivated channel refused")
}

func TestRelayForwarding(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	base := e.caddy("")
	ch := e.channel(true)

	// text send with an idempotency key: forwarded with the real token, without the key
	body := `{"messaging_product":"whatsapp",  "idempotency_key":"k-1", "to":"15551234567","type":"text","text":{"body":"hi there"}}`
	r := call(t, "POST", base+"/"+pnid+"/messages?x=1", ch.ChannelToken, body)
	if r.status != 200 || !bytes.Contains(r.body, []byte(`"wamid.`)) {
		t.Fatalf("text send: %d %s", r.status, r.body)
	}
	got := e.fake.RequestsTo("POST", "/"+pnid+"/messages")
	if len(got) != 1 {
		t.Fatalf("upstream got %d sends", len(got))
	}
	up := got[0]
	if up.Path != "/v26.0/"+pnid+"/messages" || up.RawQuery != "x=1" {
		t.Fatalf("upstream path %q query %q", up.Path, up.RawQuery)
	}
	if up.Header.Get("Authorization") != "Bearer "+realToken {
		t.Fatalf("upstream Authorization = %q", up.Header.Get("Authorization"))
	}
	if want := `{"messaging_product":"whatsapp",  "to":"15551234567","type":"text","text":{"body":"hi there"}}`; string(up.Body) != want {
		t.Fatalf("upstream body\n got %s\nwant %s", up.Body, want)
	}
	for _, b := range [][]byte{r.body, []byte(fmt.Sprint(r.header))} {
		if bytes.Contains(b, []byte(realToken)) {
			t.Fatal("upstream token in the response")
		}
	}

	// the caller's API key header, cookies and access_token query parameter never reach the upstream
	req, _ := http.NewRequest("POST", base+"/"+pnid+"/messages?access_token=callers&x=2", strings.NewReader(textBody))
	req.Header.Set("Authorization", "Bearer "+ch.ChannelToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", "crt_pk_shouldnotleak")
	req.Header.Set("Cookie", "session=abc")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("send with extra credentials: %v %v", err, resp)
	} else {
		resp.Body.Close()
	}
	sends := e.fake.RequestsTo("POST", "/"+pnid+"/messages")
	if up := sends[len(sends)-1]; up.Header.Get("X-Api-Key") != "" || up.Header.Get("Cookie") != "" ||
		up.RawQuery != "x=2" || up.Header.Get("Authorization") != "Bearer "+realToken {
		t.Fatalf("forwarded credentials: query %q headers %v", up.RawQuery, up.Header)
	}

	// template send, caller's own version segment dropped
	tmpl := `{"messaging_product":"whatsapp","to":"15551234567","type":"template","template":{"name":"hello_world","language":{"code":"en_US"}}}`
	if r := call(t, "POST", base+"/v26.0/"+pnid+"/messages", ch.ChannelToken, tmpl); r.status != 200 {
		t.Fatalf("template send: %d %s", r.status, r.body)
	}
	last := e.fake.RequestsTo("POST", "/"+pnid+"/messages")
	if up := last[len(last)-1]; up.Path != "/v26.0/"+pnid+"/messages" || string(up.Body) != tmpl {
		t.Fatalf("template upstream: %s %s", up.Path, up.Body)
	}

	// upstream errors pass through untouched
	bad := `{"messaging_product":"whatsapp","to":"15551234567","type":"template","template":{"name":"nope","language":{"code":"en_US"}}}`
	r = call(t, "POST", base+"/"+pnid+"/messages", ch.ChannelToken, bad)
	if r.status < 400 || r.status >= 500 || !bytes.Contains(r.body, []byte(`"fbtrace_id"`)) {
		t.Fatalf("upstream error: %d %s", r.status, r.body)
	}

	// templates with paging: links point at the relay, never carry a token, and work
	next := base + "/" + wabaID + "/message_templates?fields=name,status&limit=2"
	var names []string
	for pages := 0; next != ""; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		r := call(t, "GET", next, ch.ChannelToken, "")
		if r.status != 200 || bytes.Contains(r.body, []byte("access_token")) || bytes.Contains(r.body, []byte(realToken)) {
			t.Fatalf("templates page: %d %s", r.status, r.body)
		}
		var page struct {
			Data   []struct{ ID, Name string }
			Paging struct{ Next string }
		}
		if err := json.Unmarshal(r.body, &page); err != nil {
			t.Fatalf("templates page: %v: %s", err, r.body)
		}
		for _, d := range page.Data {
			names = append(names, d.Name)
		}
		if page.Paging.Next != "" && !strings.HasPrefix(page.Paging.Next, base+"/"+wabaID+"/message_templates?") {
			t.Fatalf("next link %q does not point at the relay", page.Paging.Next)
		}
		next = page.Paging.Next
	}
	if len(names) != 3 {
		t.Fatalf("templates through paging: %v", names)
	}
	// template ids handed to the channel are now in scope
	if r := call(t, "GET", base+"/t1?fields=name", ch.ChannelToken, ""); r.status == 403 {
		t.Fatalf("a template id handed to the channel is out of scope: %s", r.body)
	}
	// metrics: outcomes counted, upstream latency observed, no token or channel in any label
	m := call(t, "GET", strings.TrimSuffix(base, proxyPrefix)+"/metrics", "", "")
	for _, want := range []string{`caddy_wabarelay_relay_requests_total{outcome="ok"}`, `caddy_wabarelay_relay_requests_total{outcome="upstream_4xx"} 1`,
		`caddy_wabarelay_relay_upstream_duration_seconds_count`, `caddy_wabarelay_relay_rate_limited_total 0`} {
		if !bytes.Contains(m.body, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if bytes.Contains(m.body, []byte(ch.ChannelToken)) || bytes.Contains(m.body, []byte(ch.ID.String())) || bytes.Contains(m.body, []byte(realToken)) {
		t.Error("metrics carry a token or channel id")
	}
	for _, req := range e.fake.Requests() {
		if req.Header.Get("X-Api-Key") != "" || strings.Contains(req.RawQuery, "access_token") && !strings.Contains(req.RawQuery, realToken) {
			t.Fatalf("caller credentials forwarded: %+v", req)
		}
	}
}

// TestRelayDisconnected: code 190 marks the channel; that call and later ones answer 503
// CHANNEL_DISCONNECTED and the upstream is not called again.
func TestRelayDisconnected(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	base := e.caddy("")
	ch := e.channel(true)
	send := base + "/" + pnid + "/messages"
	if r := call(t, "POST", send, ch.ChannelToken, textBody); r.status != 200 {
		t.Fatalf("before: %d %s", r.status, r.body)
	}
	e.fake.RevokeToken(realToken)
	// The upstream's 190 answer carries its own Content-Length and WWW-Authenticate: none of it
	// may survive into the relay's 503 (a strict client reads the whole body).
	first := call(t, "POST", send, ch.ChannelToken, textBody)
	expectRelayError(t, first, 503, "CHANNEL_DISCONNECTED")
	substituted(t, first)
	n := len(e.fake.Requests())
	for i := 0; i < 3; i++ {
		r := call(t, "GET", base+"/"+wabaID+"/message_templates", ch.ChannelToken, "")
		expectRelayError(t, r, 503, "CHANNEL_DISCONNECTED")
		substituted(t, r)
	}
	if m := len(e.fake.Requests()); m != n {
		t.Fatalf("upstream called %d more times after the token died", m-n)
	}
	c, err := e.store.GetChannel(context.Background(), e.org, ch.ID)
	if err != nil || c.UpstreamDisconnectedAt == nil || c.Status != "active" {
		t.Fatalf("channel after 190: %+v %v", c, err)
	}
	// reconnecting (a new token) restores traffic with the same channel token
	e.fake.AddToken("EAAGnewToken", []string{pnid}, []string{wabaID})
	if err := e.store.ConnectChannel(context.Background(), ch.ID, store.Connection{PhoneNumberID: pnid, WabaID: wabaID, UpstreamToken: "EAAGnewToken"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Second, func() bool { return call(t, "POST", send, ch.ChannelToken, textBody).status == 200 },
		"the reconnected channel served")

	// the same on a keyed send after the reconnect: a 190 releases the key, and the 503 is whole
	e.fake.RevokeToken("EAAGnewToken")
	keyed := `{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"k"},"idempotency_key":"after-reconnect"}`
	r := call(t, "POST", send, ch.ChannelToken, keyed)
	expectRelayError(t, r, 503, "CHANNEL_DISCONNECTED")
	substituted(t, r)
}

// substituted checks that an answer the relay made in place of the upstream's carries only
// the relay's headers (docs/relay.md#substituted-answers).
func substituted(t *testing.T, r relayResp) {
	t.Helper()
	for _, name := range []string{"Www-Authenticate", "Content-Encoding", "X-Fb-Trace-Id", "X-Fb-Request-Id"} {
		if v := r.header.Get(name); v != "" {
			t.Errorf("substituted %d answer carries the upstream's %s: %q", r.status, name, v)
		}
	}
	if r.header.Get("Content-Length") != strconv.Itoa(len(r.body)) {
		t.Errorf("substituted answer: Content-Length %q for %d bytes", r.header.Get("Content-Length"), len(r.body))
	}
}

// TestRelayTwoInstances: two Caddy processes sharing Redis and Postgres: one rate limit, one
// upstream send per idempotency key, and a deleted channel refused within a second everywhere.
func TestRelayTwoInstances(t *testing.T) {
	t.Parallel()
	redisURL := testenv.Redis(t)
	e := newRelayEnv(t)
	a, b := e.caddy(redisURL), e.caddy(redisURL)

	// 50 concurrent sends with one key, across both instances: one upstream send, 50 identical answers
	ch := e.channel(true)
	body := `{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"once"},"idempotency_key":"order-42"}`
	replayed := 0
	for _, r := range e.sendOnceAcross([]string{a, b}, ch, body) {
		if r.header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	if replayed != 49 {
		t.Fatalf("replayed = %d, want 49", replayed)
	}
	// same key, other body → 422
	other := strings.Replace(body, "once", "twice", 1)
	expectRelayError(t, call(t, "POST", b+"/"+pnid+"/messages", ch.ChannelToken, other), 422, "idempotency_key was already used with a different request")

	// rate limit: 100 accepted across both instances, then 429 with Retry-After
	rl := e.channelOn(true, pnid2)
	start := time.Now()
	accepted, first429 := acceptedAcross(t, []string{a, b}, 110, "/"+wabaID+"/message_templates?limit=1", rl.ChannelToken)
	// The first call entered the window after start and the 429 came before now: it leaves the
	// window at most 60 s and at least 60 s less the calls' time from now (a second more for
	// the rounding up), however long the machine took over the 110 calls.
	secs := int(time.Since(start)/time.Second) + 1
	if accepted != 100 {
		t.Fatalf("accepted %d of 110 across two instances, want 100", accepted)
	}
	expectRelayError(t, first429, 429, "Rate limit exceeded")
	ra, err := strconv.Atoi(first429.header.Get("Retry-After"))
	if err != nil || ra < max(60-secs-1, 1) || ra > 60 {
		t.Fatalf("Retry-After = %q after %d s of calls, want the seconds until the first call leaves the window", first429.header.Get("Retry-After"), secs)
	}
	if first429.header.Get("RateLimit-Limit") != "100" || first429.header.Get("RateLimit-Remaining") != "0" {
		t.Fatalf("RateLimit headers: %v", first429.header)
	}

	// a channel deleted through one path is refused by the other instance within a second
	del := e.channelOn(true, pnid3)
	if r := call(t, "POST", b+"/"+pnid3+"/messages", del.ChannelToken, textBody); r.status != 200 {
		t.Fatalf("before delete: %d %s", r.status, r.body)
	}
	if _, err := e.store.DeleteChannel(context.Background(), e.org, del.ID, true); err != nil {
		t.Fatal(err)
	}
	took := testenv.Eventually(t, time.Second, func() bool {
		return call(t, "POST", b+"/"+pnid3+"/messages", del.ChannelToken, textBody).status == 401
	}, "the deleted channel refused by the other instance")
	t.Logf("deleted channel refused after %v", took)
}

// TestRelayRedisDown: with Redis killed, sends carrying a key get 503 (never a risked double
// send), sends without one are served and limited in memory; after Redis returns, keys work
// again without a restart.
func TestRelayRedisDown(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	e := newRelayEnv(t)
	base := e.caddy(rs.URL())
	ch := e.channel(true)
	send := base + "/" + pnid + "/messages"
	withKey := func(k string) string {
		return `{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"x"},"idempotency_key":"` + k + `"}`
	}
	if r := call(t, "POST", send, ch.ChannelToken, withKey("a")); r.status != 200 {
		t.Fatalf("before: %d %s", r.status, r.body)
	}
	rs.Kill(t)
	n := len(e.fake.Requests())
	r := call(t, "POST", send, ch.ChannelToken, withKey("b"))
	expectRelayError(t, r, 503, "Idempotency store unavailable")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if m := len(e.fake.Requests()); m != n {
		t.Fatal("a keyed send reached the upstream while Redis was down")
	}
	if r := call(t, "POST", send, ch.ChannelToken, textBody); r.status != 200 || r.header.Get("RateLimit-Limit") != "100" {
		t.Fatalf("send without key while Redis is down: %d %s", r.status, r.body)
	}
	rs.Restart(t)
	testenv.Eventually(t, 10*time.Second, func() bool { return call(t, "POST", send, ch.ChannelToken, withKey("c")).status == 200 },
		"keyed sends served after Redis returned")
	if r := call(t, "POST", send, ch.ChannelToken, withKey("c")); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after recovery the key is not remembered: %d %v", r.status, r.header)
	}
}
