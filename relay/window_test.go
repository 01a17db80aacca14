package relay

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/admission"
	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/store"
	"github.com/wabarelay/wabarelay/window"
)

// The customers of the window tests: one who wrote an hour ago (open), one who wrote 25 hours
// ago (closed), one never heard from (closed on a channel receiving for 2 days).
const (
	custOpen   = "15550001"
	custClosed = "15550002"
	custNever  = "15550003"
)

// withWindows gives f's relay windows in mode guard on a stub clock at the real time, after
// making its channel one that has been receiving for two days, with custOpen and custClosed's
// messages stored by intake.
func withWindows(t *testing.T, f *relayFixture, guard WindowGuard) (*Windows, *clock.Stub) {
	t.Helper()
	f.fx.Exec(t, `UPDATE channels SET connected_at = now() - interval '2 days', contacts_since = now() - interval '2 days' WHERE id = $1`, f.channel)
	now := time.Now()
	storeIncoming(t, f.store, custOpen, "wamid.open", now.Add(-time.Hour))
	storeIncoming(t, f.store, custClosed, "wamid.closed", now.Add(-25*time.Hour))
	clk := clock.NewStub(now)
	ws := NewWindows(f.store, clk)
	f.relay.Windows, f.relay.WindowGuard = ws, guard
	return ws, clk
}

// storeIncoming stores, as intake does, a message from customer on the fixture's number.
func storeIncoming(t testing.TB, s *store.Store, customer, wamid string, sent time.Time) {
	t.Helper()
	if _, err := s.StoreEvents(context.Background(), []store.IncomingItem{{Type: "messages", PhoneNumberID: tPNID,
		DedupeKey: "m:" + wamid, Customer: customer, WAMID: wamid, Sent: sent, Data: json.RawMessage(`{}`)}}, store.Claim{}); err != nil {
		t.Fatal(err)
	}
}

func textTo(to, key string) string {
	b := `{"messaging_product":"whatsapp","to":"` + to + `","type":"text","text":{"body":"hi"}`
	if key != "" {
		b += `,"idempotency_key":"` + key + `"`
	}
	return b + "}"
}

func templateTo(to string) string {
	return `{"messaging_product":"whatsapp","to":"` + to + `","type":"template","template":{"name":"hello_world","language":{"code":"en_US"}}}`
}

var reengagementRe = regexp.MustCompile(`^\{"error":\{"message":"\(#131047\) Re-engagement message","type":"OAuthException","code":131047,"error_data":\{"messaging_product":"whatsapp","details":"Message failed to send because more than 24 hours have passed since the customer last replied to this number\."\},"fbtrace_id":"[A-Za-z0-9_-]{23}"\}\}$`)

// TestWindowHeader: in annotate mode every send with a "to" carries Wabarelay-Window — open,
// closed (an old message; nothing from the customer on a channel receiving for 2 days) and
// unknown (a channel connected an hour ago; a "to" that is no wa_id) —, every send goes upstream,
// a send without "to" carries none, and the window moves with the stub clock.
func TestWindowHeader(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	_, clk := withWindows(t, f, GuardAnnotate)
	path := "/" + tPNID + "/messages"
	for _, c := range []struct {
		to   string
		want window.State
	}{{custOpen, window.Open}, {"+1 555-0001", window.Open}, {custClosed, window.Closed}, {custNever, window.Closed}, {"user.abc", window.Unknown}} {
		w := f.serve("POST", path, textTo(c.to, ""), nil)
		if w.Code != 200 || w.Header().Get(WindowHeader) != string(c.want) {
			t.Fatalf("to %s: %d, %s %q; want 200 and %s", c.to, w.Code, WindowHeader, w.Header().Get(WindowHeader), c.want)
		}
	}
	if n := f.sends.Load(); n != 5 {
		t.Fatalf("annotate: %d sends reached the upstream, want 5", n)
	}
	// a read receipt has no "to": no header
	w := f.serve("POST", path, `{"messaging_product":"whatsapp","status":"read","message_id":"wamid.open"}`, nil)
	if _, ok := w.Header()[WindowHeader]; ok {
		t.Fatalf("a send without to: header %q", w.Header().Get(WindowHeader))
	}
	// 23 h later the open window has closed (23 h + the hour since the message)
	clk.Advance(23 * time.Hour)
	if w := f.serve("POST", path, textTo(custOpen, ""), nil); w.Header().Get(WindowHeader) != "closed" {
		t.Fatalf("24 h after the message: %q", w.Header().Get(WindowHeader))
	}

	// unknown: a channel receiving for an hour only, and a customer never heard from
	g := newRelayFixture(t, 100, nil)
	g.relay.Windows, g.relay.WindowGuard = NewWindows(g.store, nil), GuardEnforce
	if w := g.serve("POST", path, textTo(custNever, ""), nil); w.Code != 200 || w.Header().Get(WindowHeader) != "unknown" {
		t.Fatalf("new channel: %d %q", w.Code, w.Header().Get(WindowHeader))
	}
	// off: no header
	g.relay.WindowGuard = GuardOff
	if w := g.serve("POST", path, textTo(custNever, ""), nil); w.Code != 200 || w.Header().Get(WindowHeader) != "" {
		t.Fatalf("off: %d %q", w.Code, w.Header().Get(WindowHeader))
	}
}

// TestWindowEnforce: with window_guard enforce a free-form send to a closed window is answered
// locally with the upstream's exact 131047 envelope: no upstream call, a relay log record (400,
// 131047), no rate-limit slot taken, no idempotency key claimed (the same key goes upstream once
// the customer writes). Templates pass; open windows pass.
func TestWindowEnforce(t *testing.T) {
	const limit = 2
	f := newRelayFixture(t, limit, nil)
	log := withCallLog(f)
	withWindows(t, f, GuardEnforce)
	path := "/" + tPNID + "/messages"

	for i := range 3 { // more refusals than the limit allows calls
		for _, body := range []string{textTo(custClosed, "k1"), textTo(custNever, ""),
			`{"messaging_product":"whatsapp","to":"` + custClosed + `","type":"image","image":{"id":"1"}}`} {
			w := f.serve("POST", path, body, nil)
			if w.Code != 400 || !reengagementRe.Match(w.Body.Bytes()) || w.Header().Get(WindowHeader) != "closed" ||
				w.Header().Get("Content-Type") != "application/json; charset=UTF-8" {
				t.Fatalf("refusal %d of %s: %d %s %v", i, body, w.Code, w.Body, w.Header())
			}
			c := log.take()
			if len(c) != 1 || c[0].Status != 400 || c[0].ErrorCode != CodeReengagement || c[0].Outcome != OutcomeWindowClosed ||
				c[0].ChannelID != f.channel || c[0].WAMID != "" {
				t.Fatalf("relay log: %+v", c)
			}
		}
	}
	if n := f.sends.Load(); n != 0 {
		t.Fatalf("%d refused sends reached the upstream", n)
	}
	// the refusals took no slot of the limit: the limit's two calls are left
	if w := f.serve("POST", path, templateTo(custClosed), nil); w.Code != 200 || w.Header().Get(WindowHeader) != "closed" {
		t.Fatalf("a template to a closed window: %d %s", w.Code, w.Body)
	}
	if w := f.serve("POST", path, textTo(custOpen, ""), nil); w.Code != 200 || w.Header().Get(WindowHeader) != "open" {
		t.Fatalf("a text to an open window: %d %s", w.Code, w.Body)
	}
	if w := f.serve("POST", path, templateTo(custClosed), nil); w.Code != 429 {
		t.Fatalf("the limit's third call: %d, want 429", w.Code)
	}
	if n := f.sends.Load(); n != 2 {
		t.Fatalf("%d sends upstream, want 2", n)
	}
	log.take()

	// the key k1 was never claimed: once the customer writes, the same key goes upstream
	h := newRelayFixture(t, 100, nil)
	ws, _ := withWindows(t, h, GuardEnforce)
	if w := h.serve("POST", path, textTo(custClosed, "k1"), nil); w.Code != 400 {
		t.Fatalf("closed: %d", w.Code)
	}
	storeIncoming(t, h.store, custClosed, "wamid.back", time.Now())
	ws.Invalidate(h.channel) // (no listener here: the cross-instance test has one)
	w := h.serve("POST", path, textTo(custClosed, "k1"), nil)
	if w.Code != 200 || w.Header().Get(WindowHeader) != "open" || w.Header().Get("Idempotent-Replayed") != "" || h.sends.Load() != 1 {
		t.Fatalf("the same key after the customer wrote: %d %s (sends %d)", w.Code, w.Body, h.sends.Load())
	}
	if w := h.serve("POST", path, textTo(custClosed, "k1"), nil); w.Header().Get("Idempotent-Replayed") != "true" || h.sends.Load() != 1 {
		t.Fatalf("its repeat is replayed: %d %v", w.Code, w.Header())
	}
}

// queryCounter is a pgx tracer counting the statements that read contacts.
type queryCounter struct{ contacts atomic.Int64 }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "FROM contacts") {
		q.contacts.Add(1)
	}
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestWindowAcrossInstances: a message stored by one instance's intake opens the window on
// another instance's relay by notification: that relay read the channel's windows once, and
// never again, whatever it answered.
func TestWindowAcrossInstances(t *testing.T) {
	f := newRelayFixture(t, 1000, nil) // instance A: f.store is its intake
	f.fx.Exec(t, `UPDATE channels SET connected_at = now() - interval '2 days', contacts_since = now() - interval '2 days' WHERE id = $1`, f.channel)

	// instance B: its own pool (counted), cache, windows and listener
	counter := &queryCounter{}
	fb := testenv.NewStore(t, &testenv.StoreOpts{DSN: f.fx.DSN, Key: f.fx.Key, Pool: func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter }})
	cacheB, windowsB := NewCache(fb.Store, DefaultTTL), NewWindows(fb.Store, nil)
	cacheB.SetWindows(windowsB)
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { defer close(done); cacheB.Listen(ctx, f.fx.DSN, nil, func() { listening <- struct{}{} }) }()
	t.Cleanup(func() { cancel(); <-done })
	<-listening
	lim := ratelimit.NewMemory(1000, time.Minute)
	t.Cleanup(func() { lim.Close() })
	mem := idempotency.NewMemory(idempotency.Options{})
	t.Cleanup(func() { _ = mem.Close() })
	relayB := &Relay{Channels: cacheB, Objects: fb.Store, Admission: admission.NewMemory(lim, mem),
		UpstreamBase: f.relay.UpstreamBase, Windows: windowsB, WindowGuard: GuardEnforce}
	sendB := func() *http.Response {
		t.Helper()
		w := f.serveWith(relayB, "POST", "/"+tPNID+"/messages", textTo(custNever, ""))
		return w.Result()
	}

	if r := sendB(); r.StatusCode != 400 || r.Header.Get(WindowHeader) != "closed" {
		t.Fatalf("before the customer wrote: %d %s", r.StatusCode, r.Header.Get(WindowHeader))
	}
	if n := counter.contacts.Load(); n != 1 {
		t.Fatalf("%d reads of contacts by instance B to load the channel's windows, want 1", n)
	}
	chB, err := cacheB.Lookup(context.Background(), f.token) // (from B's memory: the send loaded it)
	if err != nil {
		t.Fatal(err)
	}
	storeIncoming(t, f.store, custNever, "wamid.a", time.Now()) // instance A's intake
	testenv.Eventually(t, testenv.Patience, func() bool {
		return windowsB.State(context.Background(), chB, custNever) == window.Open
	}, "instance B never saw the window open")
	if r := sendB(); r.StatusCode != 200 || r.Header.Get(WindowHeader) != "open" {
		t.Fatalf("after the customer wrote: %d %s", r.StatusCode, r.Header.Get(WindowHeader))
	}
	if n := counter.contacts.Load(); n != 1 {
		t.Fatalf("%d reads of contacts by instance B, want still 1: the window opened by notification", n)
	}
}

// serveWith runs one send through relay (another instance's) with f's token and upstream.
func (f *relayFixture) serveWith(relay *Relay, method, path, body string) *httptest.ResponseRecorder {
	f.t.Helper()
	r := httptest.NewRequest(method, "http://relay.example.com"+path, strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+f.token)
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	relay.Serve(w, r, f.upstream)
	return w
}

// TestWindowsBounded: a channel's set holds at most perChannel open windows, the newest; a
// customer left out is unknown, never closed (enforce lets the send through), and one announced
// while the set is full is left out too.
func TestWindowsBounded(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	f.fx.Exec(t, `UPDATE channels SET connected_at = now() - interval '2 days', contacts_since = now() - interval '2 days' WHERE id = $1`, f.channel)
	now := time.Now()
	storeIncoming(t, f.store, "15550001001", "w1", now.Add(-3*time.Hour))
	storeIncoming(t, f.store, "15550001002", "w2", now.Add(-2*time.Hour))
	storeIncoming(t, f.store, "15550001003", "w3", now.Add(-time.Hour))
	ws := NewWindows(f.store, nil)
	ws.perChannel = 2
	f.relay.Windows, f.relay.WindowGuard = ws, GuardEnforce
	path := "/" + tPNID + "/messages"
	for to, want := range map[string]string{"15550001003": "open", "15550001002": "open", "15550001001": "unknown", "15550001999": "unknown"} {
		if w := f.serve("POST", path, textTo(to, ""), nil); w.Code != 200 || w.Header().Get(WindowHeader) != want {
			t.Fatalf("to %s: %d %q, want 200 %s", to, w.Code, w.Header().Get(WindowHeader), want)
		}
	}
	ws.Apply(f.channel.String() + " 15550001004 " + strconv.FormatInt(now.UnixMicro(), 10))
	if w := f.serve("POST", path, textTo("15550001004", ""), nil); w.Header().Get(WindowHeader) != "unknown" {
		t.Fatalf("announced into a full set: %q, want unknown", w.Header().Get(WindowHeader))
	}
}

// TestWindowYoungChannelAgreesWithAPI: on a channel connected an hour ago, a customer whose last
// message is 25 hours old is closed in the header, as the API's window.Decide over the stored row
// says (not unknown like one never heard from, who stays unknown), and enforce refuses a text.
func TestWindowYoungChannelAgreesWithAPI(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	f.fx.Exec(t, `UPDATE channels SET connected_at = now() - interval '1 hour', contacts_since = now() - interval '2 days' WHERE id = $1`, f.channel)
	now := time.Now()
	storeIncoming(t, f.store, custClosed, "wamid.closed", now.Add(-25*time.Hour))
	f.relay.Windows, f.relay.WindowGuard = NewWindows(f.store, nil), GuardAnnotate
	path := "/" + tPNID + "/messages"
	for to, want := range map[string]string{custClosed: "closed", custNever: "unknown"} {
		if w := f.serve("POST", path, textTo(to, ""), nil); w.Code != 200 || w.Header().Get(WindowHeader) != want {
			t.Fatalf("to %s: %d %q, want 200 %s", to, w.Code, w.Header().Get(WindowHeader), want)
		}
	}
	org := testenv.QueryValue[uuid.UUID](t, f.fx, `SELECT org_id FROM channels WHERE id = $1`, f.channel)
	api, err := f.store.ContactWindow(context.Background(), org, f.channel, custClosed)
	if err != nil {
		t.Fatal(err)
	}
	if state, _ := window.Decide(api.LastInboundAt, api.ReceivingSince, api.At); state != window.Closed {
		t.Fatalf("the API's window: %s (%+v), want closed", state, api)
	}
}
