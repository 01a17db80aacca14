package relay

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/admission"
	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/store"
)

// These tests drive relay.Relay as plain net/http code: a real channel in Postgres behind the
// real cache, real admission stores (memory, or Redis), and the fake upstream called in
// process as the Upstream. No Caddy.

const (
	tPNID     = "1001"
	tWABA     = "2001"
	tUpstream = "EAAGrelayTestUpstreamToken0123456789"
)

type relayFixture struct {
	t       testing.TB
	fake    *fakegraph.Server
	store   *store.Store
	idem    idempotency.Store // the admission's
	relay   *Relay
	token   string // the channel token
	channel uuid.UUID
	sends   atomic.Int64 // sends that reached the fake
	pending Pending
	fx      *testenv.Fixture // the database's
}

// newRelayFixture builds a relay over one connected channel; newAdmission (the admission and
// its idempotency store) defaults to memory stores with a limit of limit calls per minute.
func newRelayFixture(t testing.TB, limit int, newAdmission func() (Admission, idempotency.Store)) *relayFixture {
	t.Helper()
	fx := testenv.NewStore(t)
	st := fx.Store
	ch := fx.Channel(t, fx.Org(t).ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: tPNID,
		WabaID: tWABA, DisplayPhoneNumber: "+1 555 0100", UpstreamToken: tUpstream}})
	fake := fakegraph.New(fakegraph.WithPlainJSON())
	fake.Start() // media URLs point at its listener
	t.Cleanup(fake.Close)
	fake.AddNumber(tPNID, tWABA, "+1 555 0100", "Acme")
	fake.AddToken(tUpstream, []string{tPNID}, []string{tWABA})
	fake.AddTemplates(tWABA,
		fakegraph.Template{ID: "t1", Name: "hello_world", Status: "APPROVED", Category: "UTILITY", Language: "en_US"},
		fakegraph.Template{ID: "t2", Name: "order_update", Status: "APPROVED", Category: "UTILITY", Language: "en_US"},
		fakegraph.Template{ID: "t3", Name: "promo", Status: "APPROVED", Category: "MARKETING", Language: "en_US"})

	var (
		adm  Admission
		idem idempotency.Store
	)
	if newAdmission != nil {
		adm, idem = newAdmission()
	} else {
		lim := ratelimit.NewMemory(limit, time.Minute)
		t.Cleanup(func() { lim.Close() })
		mem := idempotency.NewMemory(idempotency.Options{})
		t.Cleanup(func() { _ = mem.Close() })
		adm, idem = admission.NewMemory(lim, mem), mem
	}
	f := &relayFixture{t: t, fake: fake, store: st, idem: idem, token: ch.ChannelToken, channel: ch.ID, fx: fx}
	f.relay = &Relay{
		Channels:     NewCache(st, DefaultTTL),
		Objects:      st,
		Admission:    adm,
		UpstreamBase: "/" + fake.Version(),
		ProxyBase:    func(*http.Request, string) string { return "https://relay.example.com/upstream-proxy" },
		Pending:      &f.pending,
	}
	return f
}

// wait returns once every background store of the calls served is done.
func (f *relayFixture) wait() {
	f.t.Helper()
	if err := f.pending.Wait(context.Background()); err != nil {
		f.t.Fatal(err)
	}
}

// upstream is the fake, called in process.
func (f *relayFixture) upstream(w http.ResponseWriter, r *http.Request) error {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/messages") {
		f.sends.Add(1)
	}
	f.fake.ServeHTTP(w, r)
	return nil
}

// serve runs one call through the relay with up (the fake when nil) and returns the answer
// once every background store of it is done.
func (f *relayFixture) serve(method, path, body string, up Upstream) *httptest.ResponseRecorder {
	f.t.Helper()
	if up == nil {
		up = f.upstream
	}
	r := httptest.NewRequest(method, "http://relay.example.com"+path, strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+f.token)
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	f.relay.Serve(w, r, up)
	f.wait()
	return w
}

func sendBody(text, key string) string {
	b := `{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"` + text + `"}`
	if key != "" {
		b += `,"idempotency_key":"` + key + `"`
	}
	return b + "}"
}

func expectError(t *testing.T, w *httptest.ResponseRecorder, status int, msg string) {
	t.Helper()
	var e struct{ Error string }
	if w.Code != status || json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Error != msg {
		t.Fatalf("got %d %q, want %d {\"error\":%q}", w.Code, w.Body.String(), status, msg)
	}
	if n, _ := strconv.Atoi(w.Header().Get("Content-Length")); w.Header().Get("Content-Length") != "" && n != w.Body.Len() {
		t.Fatalf("Content-Length %s for a %d-byte body", w.Header().Get("Content-Length"), w.Body.Len())
	}
}

// TestRelaySendOncePerKey: a keyed send goes upstream once with the real token and without the
// key; its answer is replayed to a repeat; the key with another body is refused.
func TestRelaySendOncePerKey(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	first := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "k1"), nil)
	if first.Code != 200 || !strings.Contains(first.Body.String(), `"messages"`) {
		t.Fatalf("send: %d %s", first.Code, first.Body)
	}
	reqs := f.fake.RequestsTo("POST", "/messages")
	if len(reqs) != 1 || reqs[0].Header.Get("Authorization") != "Bearer "+tUpstream || strings.Contains(string(reqs[0].Body), "idempotency_key") {
		t.Fatalf("upstream saw %+v", reqs)
	}
	again := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "k1"), nil)
	if again.Code != 200 || again.Body.String() != first.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("repeat: %d %s %v", again.Code, again.Body, again.Header())
	}
	expectError(t, f.serve("POST", "/"+tPNID+"/messages", sendBody("other", "k1"), nil), 422, MsgIdemMismatch)
	if n := f.sends.Load(); n != 1 {
		t.Fatalf("%d upstream sends, want 1", n)
	}
}

// goneWriter is a caller that hung up: every write fails.
type goneWriter struct{ h http.Header }

func (g *goneWriter) Header() http.Header       { return g.h }
func (g *goneWriter) WriteHeader(int)           {}
func (g *goneWriter) Write([]byte) (int, error) { return 0, errors.New("write: broken pipe") }

// TestRelayHangUpStoresTheRealAnswer: the caller is gone before the answer arrives (its
// context cancelled, its connection refusing writes); the send still completes, its real
// answer is stored, and the caller's retry gets it without a second send.
func TestRelayHangUpStoresTheRealAnswer(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	ctx, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequest("POST", "http://relay.example.com/"+tPNID+"/messages", strings.NewReader(sendBody("hi", "hang")))
	r = r.WithContext(ctx)
	r.Header.Set("Authorization", "Bearer "+f.token)
	var sendCtxErr error
	f.relay.Serve(&goneWriter{h: http.Header{}}, r, func(w http.ResponseWriter, r *http.Request) error {
		cancel() // the caller hangs up while the upstream works
		sendCtxErr = r.Context().Err()
		// Like reverse_proxy: the upstream's answer is copied down, and a failed write aborts.
		up := httptest.NewRecorder()
		if err := f.upstream(up, r); err != nil {
			return err
		}
		for k, v := range up.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(up.Code)
		if _, err := w.Write(up.Body.Bytes()); err != nil {
			panic(http.ErrAbortHandler)
		}
		return nil
	})
	f.wait()
	if sendCtxErr != nil {
		t.Fatalf("the send's context ended with the caller's: %v", sendCtxErr)
	}
	retry := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "hang"), nil)
	if retry.Code != 200 || !strings.Contains(retry.Body.String(), "wamid.") || retry.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s", retry.Code, retry.Body)
	}
	if n := f.sends.Load(); n != 1 {
		t.Fatalf("%d upstream sends, want 1", n)
	}
}

// TestRelayAbortedAnswerIsNotResent: the upstream's answer breaks off mid-stream
// (reverse_proxy panics with http.ErrAbortHandler); the caller's connection is aborted, and
// since the upstream may have sent, the retry gets the relay's 502, not a second send.
func TestRelayAbortedAnswerIsNotResent(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Fatalf("recovered %v, want http.ErrAbortHandler passed on", v)
			}
		}()
		f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "abort"), func(w http.ResponseWriter, r *http.Request) error {
			f.sends.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
			w.Write([]byte(`{"messaging_product":`))
			panic(http.ErrAbortHandler)
		})
	}()
	f.wait()
	expectError(t, f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "abort"), nil), 502, MsgUpstreamDown)
	if n := f.sends.Load(); n != 1 {
		t.Fatalf("%d upstream sends, want 1", n)
	}
}

// TestRelayUpstreamFailures: a failure to connect releases the key (nothing was sent: the
// retry sends); a timeout is stored (the upstream may have sent: the retry replays 504).
func TestRelayUpstreamFailures(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	refused := func(http.ResponseWriter, *http.Request) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	}
	expectError(t, f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "dial"), refused), 502, MsgUpstreamDown)
	if w := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "dial"), nil); w.Code != 200 || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after a refused connection: %d %s", w.Code, w.Body)
	}

	timeout := func(http.ResponseWriter, *http.Request) error { return ErrUpstreamTimeout }
	expectError(t, f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "slow"), timeout), 504, MsgUpstreamTimeout)
	replay := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "slow"), nil)
	expectError(t, replay, 504, MsgUpstreamTimeout)
	if replay.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("the timeout's answer was not replayed")
	}
	if n := f.sends.Load(); n != 1 {
		t.Fatalf("%d upstream sends, want 1 (the retry after the refused connection)", n)
	}
}

// TestRelayDeadTokenSubstituted: an upstream code 190 becomes the relay's own 503 with none of
// the upstream's headers, the channel is marked disconnected, and the key is given back.
func TestRelayDeadTokenSubstituted(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	f.fake.FailNext("POST /"+tPNID+"/messages", 1, 0, fakegraph.ErrInvalidToken())
	w := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "dead"), nil)
	expectError(t, w, 503, MsgDisconnected)
	for _, h := range []string{"Www-Authenticate", "X-Fb-Trace-Id", "X-Fb-Request-Id"} {
		if w.Header().Get(h) != "" {
			t.Fatalf("the substituted answer carries the upstream's %s", h)
		}
	}
	ch, err := f.store.RelayChannelByToken(context.Background(), f.token)
	if err != nil || !ch.Disconnected {
		t.Fatalf("channel not marked disconnected: %+v %v", ch, err)
	}
	// The key is free again: the caller's retry is judged afresh (now refused as disconnected,
	// not replayed).
	if w := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "dead"), nil); w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatal("a send refused for a dead token was stored for replays")
	}
}

// flushRecorder records when the caller first received body bytes.
type flushRecorder struct {
	*httptest.ResponseRecorder
	got  chan struct{}
	once sync.Once
}

func (f *flushRecorder) Write(p []byte) (int, error) {
	n, err := f.ResponseRecorder.Write(p)
	f.once.Do(func() { close(f.got) })
	return n, err
}

// TestRelayStreamsSends: a successful send's answer reaches the caller while the upstream is
// still writing it (streamed, not buffered), and is kept for replays all the same.
func TestRelayStreamsSends(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder(), got: make(chan struct{})}
	r := httptest.NewRequest("POST", "http://relay.example.com/"+tPNID+"/messages", strings.NewReader(sendBody("hi", "stream")))
	r.Header.Set("Authorization", "Bearer "+f.token)
	f.relay.Serve(rec, r, func(w http.ResponseWriter, r *http.Request) error {
		f.sends.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		w.Write([]byte(`{"messaging_product":"whatsapp",`))
		select { // the caller has the first half before the upstream writes the rest
		case <-rec.got:
		case <-time.After(10 * time.Second):
			t.Error("the answer was held back until the upstream finished")
		}
		w.Write([]byte(`"messages":[{"id":"wamid.stream"}]}`))
		return nil
	})
	f.wait()
	replay := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "stream"), nil)
	if replay.Body.String() != `{"messaging_product":"whatsapp","messages":[{"id":"wamid.stream"}]}` || rec.Body.String() != replay.Body.String() {
		t.Fatalf("caller got %q, replay %q", rec.Body, replay.Body)
	}
}

// TestRelayRewritesPagingInPlace: a template listing's paging links point at {proxy_url}
// without the access token, the rest of the upstream's bytes untouched, and the listed
// templates enter the channel's scope; a sibling number listed by the business account does
// not.
func TestRelayRewritesPagingInPlace(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	w := f.serve("GET", "/"+tWABA+"/message_templates?limit=1", "", nil)
	body := w.Body.String()
	if w.Code != 200 || strings.Contains(body, "access_token") || strings.Contains(body, tUpstream) ||
		!strings.Contains(body, `"next":"https://relay.example.com/upstream-proxy/`+tWABA+`/message_templates?`) {
		t.Fatalf("listing: %d %s", w.Code, body)
	}
	if got, _ := strconv.Atoi(w.Header().Get("Content-Length")); got != len(body) {
		t.Fatalf("Content-Length %d for %d bytes", got, len(body))
	}
	if w := f.serve("GET", "/t1", "", nil); w.Code == 403 {
		t.Fatal("a listed template stayed out of scope")
	}
	expectError(t, f.serve("GET", "/t2", "", nil), 403, MsgPathNotAllowed) // not listed (limit=1)
}

// TestRelayInspectionIsCapped: a read answer larger than the inspection cap is passed on as
// the upstream sent it but for its paging link, rewritten as it streams, never buffered whole
// (TestRelayRewritesPagingOfLargeAnswers for pages of 9 and 50 MiB).
func TestRelayInspectionIsCapped(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	big := `{"data":[{"id":"x","pad":"` + strings.Repeat("a", maxInspectBody) + `"}],"paging":{"next":"https://graph.facebook.com/v26.0/x?access_token=zz"}}`
	var largest int
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "http://relay.example.com/"+tWABA+"/message_templates", nil)
	r.Header.Set("Authorization", "Bearer "+f.token)
	f.relay.Serve(w, r, func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		for rest := big; rest != ""; {
			n := min(len(rest), 32<<10)
			w.Write([]byte(rest[:n]))
			rest = rest[n:]
			if a, ok := w.(*answer); ok {
				largest = max(largest, a.buf.Len())
			}
		}
		return nil
	})
	want := strings.Replace(big, "https://graph.facebook.com/v26.0/x?access_token=zz", "https://relay.example.com/upstream-proxy/x", 1)
	if w.Code != 200 || w.Body.String() != want {
		t.Fatalf("got %d, %d bytes of %d", w.Code, w.Body.Len(), len(want))
	}
	if largest > maxInspectBody {
		t.Fatalf("buffered %d bytes, cap %d", largest, maxInspectBody)
	}
}

// TestRelayRateLimitBeforeClaim: past the channel's limit a send gets 429 with Retry-After,
// goes nowhere, and claims nothing: its key is free once the limit allows again.
func TestRelayRateLimitBeforeClaim(t *testing.T) {
	testRateLimitBeforeClaim(t, nil)
}

// TestRelayRedisAdmission: the same on Redis, where the limit and the claim are one script.
func TestRelayRedisAdmission(t *testing.T) {
	rdb := testenv.RedisClient(t, testenv.Redis(t))
	testRateLimitBeforeClaim(t, func() (Admission, idempotency.Store) {
		prefix := "t:" + rand.Text() + ":"
		limitLog := ratelimit.NewRedis(rdb, 2, time.Minute, prefix+"rl:")
		ri := idempotency.NewRedis(rdb, idempotency.Options{Prefix: prefix + "idem:"}, nil)
		t.Cleanup(func() { _ = ri.Close() })
		return admission.NewRedis(rdb, limitLog, ri, nil, nil), ri
	})
}

func testRateLimitBeforeClaim(t *testing.T, newAdmission func() (Admission, idempotency.Store)) {
	f := newRelayFixture(t, 2, newAdmission)
	for i := range 2 {
		w := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "ok"+strconv.Itoa(i)), nil)
		if w.Code != 200 || w.Header().Get("RateLimit-Limit") != "2" {
			t.Fatalf("send %d: %d %s %v", i, w.Code, w.Body, w.Header())
		}
	}
	w := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "late"), nil)
	expectError(t, w, 429, "Rate limit exceeded")
	if ra, _ := strconv.Atoi(w.Header().Get("Retry-After")); ra < 1 || ra > 60 {
		t.Fatalf("Retry-After %q", w.Header().Get("Retry-After"))
	}
	expectError(t, f.serve("GET", "/"+tPNID, "", nil), 429, "Rate limit exceeded")
	if n := f.sends.Load(); n != 2 {
		t.Fatalf("%d sends reached the upstream, want 2", n)
	}
	// The refused key was not claimed: another limit (a fresh admission on the same stores
	// would do; here the claim is checked directly) finds it free.
	res, err := f.idem.Begin(context.Background(), admission.ClaimKey(f.channel, "late"), "fp")
	if err != nil || res.Outcome != idempotency.Acquired {
		t.Fatalf("the refused send's key was claimed: %+v %v", res, err)
	}
}

// TestRelayRefusalsNeedNoUpstream: bad tokens, scope misses and bad keys are answered by the
// relay alone.
func TestRelayRefusalsNeedNoUpstream(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	never := func(http.ResponseWriter, *http.Request) error {
		t.Error("the upstream was called")
		return nil
	}
	expectError(t, f.serve("GET", "/"+tPNID+"/../999", "", never), 403, MsgPathNotAllowed)
	expectError(t, f.serve("POST", "/999/messages", sendBody("x", ""), never), 403, MsgPathNotAllowed)
	expectError(t, f.serve("POST", "/"+tWABA+"/subscribed_apps", "", never), 403, MsgPathNotAllowed)
	expectError(t, f.serve("POST", "/"+tPNID+"/messages", `{"idempotency_key":7}`, never), 422, ErrKeyNotString.Error())
	expectError(t, f.serve("POST", "/"+tPNID+"/messages", sendBody("x", strings.Repeat("k", 256)), never), 422, MsgIdemKeyLength)
	r := httptest.NewRequest("GET", "http://relay.example.com/"+tPNID, nil)
	r.Header.Set("Authorization", "Bearer wab_"+strings.Repeat("x", 40))
	w := httptest.NewRecorder()
	f.relay.Serve(w, r, never)
	expectError(t, w, 401, MsgInvalidToken)
	r.Header.Del("Authorization")
	w = httptest.NewRecorder()
	f.relay.Serve(w, r, never)
	expectError(t, w, 401, MsgAuthRequired)
	big := `{"messaging_product":"whatsapp","pad":"` + strings.Repeat("a", MaxSendBody) + `"}`
	expectError(t, f.serve("POST", "/"+tPNID+"/messages", big, never), 413, MsgBodyTooLarge)
}
