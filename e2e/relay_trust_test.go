package e2e

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/admission"
	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestRelayScopeNotWidened: ids in an answer other than the channel's own template and media
// answers never enter its scope. GET /<waba_id>/phone_numbers lists a sibling number of the
// same business account — here another org's channel — and the channel must still not reach it;
// the subscribed_apps edge, which other channels of the account depend on, is refused.
func TestRelayScopeNotWidened(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	base := e.caddy("")
	ch := e.channelOn(true, pnid)
	// the sibling number pnid2 belongs to a channel of another org
	other := e.fix.Org(t, &testenv.OrgOpts{Name: "other"})
	sib := e.fix.Channel(t, other.ID, &testenv.ChannelOpts{Name: "sibling", Connection: connection(pnid2)})

	r := call(t, "GET", base+"/"+wabaID+"/phone_numbers", ch.ChannelToken, "")
	if r.status != 200 || !bytes.Contains(r.body, []byte(`"`+pnid2+`"`)) {
		t.Fatalf("phone_numbers listing: %d %s", r.status, r.body)
	}
	for _, p := range []string{"/" + pnid2 + "/messages", "/" + pnid3 + "/messages"} {
		expectRelayError(t, call(t, "POST", base+p, ch.ChannelToken, textBody), 403, "Path not allowed for this channel")
	}
	for _, m := range []string{"GET", "POST", "DELETE"} {
		expectRelayError(t, call(t, m, base+"/"+wabaID+"/subscribed_apps", ch.ChannelToken, ""), 403, "Path not allowed for this channel")
	}
	if n := len(e.fake.RequestsTo("POST", "/messages")) + len(e.fake.RequestsTo("", "/subscribed_apps")); n != 0 {
		t.Fatalf("refused calls reached the upstream: %d", n)
	}

	// a template listing does hand its ids over, an uploaded medium too
	if r := call(t, "GET", base+"/"+wabaID+"/message_templates", ch.ChannelToken, ""); r.status != 200 {
		t.Fatalf("templates: %d %s", r.status, r.body)
	}
	if r := call(t, "GET", base+"/t1", ch.ChannelToken, ""); r.status == 403 {
		t.Fatalf("a listed template is out of scope: %s", r.body)
	}
	// even a template listing cannot hand over another channel's number
	e.fake.AddTemplates(wabaID, fakegraph.Template{ID: pnid2, Name: "evil", Status: "APPROVED", Category: "UTILITY", Language: "en_US"})
	if r := call(t, "GET", base+"/"+wabaID+"/message_templates?limit=100", ch.ChannelToken, ""); r.status != 200 {
		t.Fatalf("templates: %d %s", r.status, r.body)
	}
	expectRelayError(t, call(t, "POST", base+"/"+pnid2+"/messages", ch.ChannelToken, textBody), 403, "Path not allowed for this channel")
	// and the sibling's own token reaches its number (the other org's channel is unaffected)
	testenv.Eventually(t, 5*time.Second, func() bool {
		return call(t, "POST", base+"/"+pnid2+"/messages", sib.ChannelToken, textBody).status == 200
	}, "the sibling's own token served")
}

// TestRelayPathShapesRefused: dot segments, empty segments and encoded slashes are refused by
// the relay's own handlers before any upstream call — also where no handle_path cleaned the path
// (a catch-all `handle { wabarelay_proxy }` passes it as sent).
func TestRelayPathShapesRefused(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	origin := e.caddyWith("", "", "handle {\n\t\twabarelay_proxy\n\t}")
	ch := e.channel(true)
	shapes := []string{
		"/" + pnid + "/../" + otherPnid + "/messages",
		"/" + pnid + "/./messages",
		"/" + pnid + "//messages",
		"/" + pnid + "/messages/",
		"/" + pnid + "/%2e%2e/" + otherPnid + "/messages",
		"/" + pnid + "%2F..%2F" + otherPnid + "/messages",
		"/" + pnid + "%2fmessages",
	}
	send := func(u string) relayResp {
		req, _ := http.NewRequest("POST", u, strings.NewReader(textBody)) // sent as written: Go's client does not clean paths
		req.Header.Set("Authorization", "Bearer "+ch.ChannelToken)
		req.Header.Set("Content-Type", "application/json")
		return do(t, req)
	}
	for _, p := range shapes {
		if r := send(origin + p); r.status < 400 || r.status >= 500 {
			t.Errorf("POST %s: %d %s, want a 4xx", p, r.status, r.body)
		}
	}
	if n := len(e.fake.Requests()); n != 0 {
		t.Fatalf("refused paths reached the upstream %d times", n)
	}
	// Under handle_path, Caddy cleans "." and "//" away (the same path, harmless); nothing
	// reaches another number either way.
	for _, p := range shapes {
		send(origin + proxyPrefix + p)
	}
	for _, r := range e.fake.Requests() {
		if r.Path != "/v26.0/"+pnid+"/messages" {
			t.Errorf("upstream got %s %s", r.Method, r.Path)
		}
	}
	// the catch-all route does serve well-formed paths
	if r := call(t, "POST", origin+"/"+pnid+"/messages", ch.ChannelToken, textBody); r.status != 200 {
		t.Fatalf("catch-all route: %d %s", r.status, r.body)
	}
}

// TestRelayHangUpKeepsTheSend: a caller that hangs up while its keyed send is in flight does
// not cancel it; the send completes once, and the caller's retry gets its stored answer.
func TestRelayHangUpKeepsTheSend(t *testing.T) {
	t.Parallel()
	redisURL := testenv.Redis(t)
	e := newRelayEnv(t)
	base := e.caddy(redisURL)
	ch := e.channel(true)
	body := `{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"once"},"idempotency_key":"hangup-1"}`
	e.fake.SetLatency(time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/"+pnid+"/messages", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+ch.ChannelToken)
	req.Header.Set("Content-Type", "application/json")
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	// hang up once the upstream has the send
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.fake.RequestsTo("POST", "/"+pnid+"/messages")) == 1 },
		"the send to reach the upstream")
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the first call was not cut off")
	}
	e.fake.SetLatency(0)
	// the retry waits for the first send and gets its answer
	r := call(t, "POST", base+"/"+pnid+"/messages", ch.ChannelToken, body)
	if r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" || !bytes.Contains(r.body, []byte(`"wamid.`)) {
		t.Fatalf("retry after a hang-up: %d %v %s", r.status, r.header, r.body)
	}
	if n := len(e.fake.RequestsTo("POST", "/"+pnid+"/messages")); n != 1 {
		t.Fatalf("upstream sends = %d, want 1", n)
	}
	// and the next retry too
	if r2 := call(t, "POST", base+"/"+pnid+"/messages", ch.ChannelToken, body); r2.status != 200 || !bytes.Equal(r2.body, r.body) {
		t.Fatalf("second retry: %d %s", r2.status, r2.body)
	}
}

// TestRelayNeverReplaysStatusZero: a stored record with a status below 100 (written by a
// release before this was checked) is answered as the relay's 502, never WriteHeader(0).
func TestRelayNeverReplaysStatusZero(t *testing.T) {
	t.Parallel()
	redisURL := testenv.Redis(t)
	e := newRelayEnv(t)
	base := e.caddy(redisURL)
	ch := e.channel(true)
	idem := idempotency.NewRedis(testenv.RedisClient(t, redisURL), idempotency.Options{}, zap.NewNop())
	defer func() {
		if err := idem.Close(); err != nil {
			t.Error(err)
		}
	}()
	body := `{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"zero"},"idempotency_key":"zero-1"}`
	stripped := `{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"zero"}}`
	k := admission.ClaimKey(ch.ID, "zero-1")
	res, err := idem.Begin(context.Background(), k, idempotency.Fingerprint("POST", "/"+pnid+"/messages", "", []byte(stripped)))
	if err != nil || res.Outcome != idempotency.Acquired {
		t.Fatalf("begin: %+v %v", res, err)
	}
	if err := idem.Complete(context.Background(), k, res.Token, idempotency.Response{Status: 0}); err != nil {
		t.Fatal(err)
	}
	r := call(t, "POST", base+"/"+pnid+"/messages", ch.ChannelToken, body)
	expectRelayError(t, r, 502, "Upstream unavailable")
	if n := len(e.fake.Requests()); n != 0 {
		t.Fatalf("a replay reached the upstream %d times", n)
	}
}

// TestRelayDecidesRefusalsFromMemory: with the channels and channel_objects tables locked (any
// query on them would block), refusals are still answered at once: scope misses of a cached
// channel, and — after an address has presented too many bad tokens — any further token from
// it (429 with Retry-After, before any lookup). Malformed tokens never cost a lookup.
func TestRelayDecidesRefusalsFromMemory(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	// The channel exists before Caddy starts: had Caddy's listener been listening when it was
	// created, the change's notification could arrive after the warm-up below and drop the
	// cached entry, and the refusals would then wait on the locked tables (seen on a CI run).
	ch := e.channel(true)
	base := e.caddy("")
	// the channel listener flushes the cache when it connects: warm the cache after that
	e.waitCacheFlushed()
	if r := call(t, "POST", base+"/"+pnid+"/messages", ch.ChannelToken, textBody); r.status != 200 {
		t.Fatalf("warm-up: %d %s", r.status, r.body)
	}
	// bad well-formed tokens are looked up, and counted
	for i := 0; i < authFailures; i++ {
		expectRelayError(t, call(t, "POST", base+"/"+pnid+"/messages", randomToken(), textBody), 401, "Invalid channel token")
	}

	tx, err := e.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(context.Background(), `LOCK TABLE channels, channel_objects IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 20 * time.Second} // a blocked query would run into this
	callWith := func(c *http.Client, method, url, token, body string) relayResp {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v (blocked on the database?)", method, url, err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		if _, err := b.ReadFrom(resp.Body); err != nil {
			t.Fatalf("%s %s: reading the answer: %v", method, url, err)
		}
		return relayResp{resp.StatusCode, resp.Header, b.Bytes()}
	}
	r := callWith(client, "POST", base+"/"+pnid+"/messages", randomToken(), textBody)
	expectRelayError(t, r, 429, "Rate limit exceeded")
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
		t.Fatalf("Retry-After = %q", r.header.Get("Retry-After"))
	}

	// another client address: its malformed token is refused without a lookup, and the cached
	// channel's scope misses are refused from memory
	other := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
	expectRelayError(t, callWith(other, "POST", base+"/"+pnid+"/messages", "not-a-token", textBody), 401, "Invalid channel token")
	for _, p := range []string{"/424242/messages", "/" + otherPnid, "/t9?fields=name"} {
		expectRelayError(t, callWith(other, "GET", base+p, ch.ChannelToken, ""), 403, "Path not allowed for this channel")
	}
	if n := len(e.fake.RequestsTo("GET", "")); n != 0 {
		t.Fatalf("refused calls reached the upstream: %d", n)
	}
}
