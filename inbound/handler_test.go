package inbound_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	appSecret   = "app-secret"
	verifyToken = "verify-token"
	phoneID     = "106540352242922"
	wabaID      = "102290129340398"
)

// fixture is a store with one org, an active channel on phoneID (account wabaID) and an
// org-scoped webhook for both event types.
type fixture struct {
	st      *store.Store
	org     uuid.UUID
	channel uuid.UUID
	webhook uuid.UUID
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	kit := testenv.NewStore(t)
	org := kit.Org(t)
	ch := kit.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: phoneID, WabaID: wabaID,
		DisplayPhoneNumber: "+1 555-0100", UpstreamToken: "t"}})
	w, _ := kit.Webhook(t, org.ID, "https://h.example.com", &testenv.WebhookOpts{Events: []string{inbound.TypeMessage, inbound.TypeStatus}})
	return &fixture{st: kit.Store, org: org.ID, channel: ch.ID, webhook: w.ID}
}

func (f *fixture) channelStatus(t *testing.T) string {
	t.Helper()
	c, err := f.st.GetChannel(context.Background(), f.org, f.channel)
	if err != nil {
		t.Fatal(err)
	}
	return c.Status
}

// observer counts what the handler reports.
type observer struct {
	rejected, malformed, overflow, stored atomic.Int32
	mu                                    sync.Mutex
	last                                  store.InboundResult
}

func (o *observer) Rejected()  { o.rejected.Add(1) }
func (o *observer) Malformed() { o.malformed.Add(1) }
func (o *observer) Overflow()  { o.overflow.Add(1) }
func (o *observer) Stored(res store.InboundResult) {
	o.stored.Add(1)
	o.mu.Lock()
	o.last = res
	o.mu.Unlock()
}

// handOff records the protocol's calls: every Reserve must be followed by one Deliver.
type handOff struct {
	free int

	mu       sync.Mutex
	reserved []int
	delivers []delivered
}

type delivered struct {
	reserved int
	jobs     []store.ClaimedDelivery
	queued   bool
}

func (h *handOff) InstanceID() string   { return "test-instance" }
func (h *handOff) Lease() time.Duration { return time.Minute }
func (h *handOff) Reserve(n int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n = min(n, h.free)
	h.reserved = append(h.reserved, n)
	return n
}
func (h *handOff) Deliver(reserved int, jobs []store.ClaimedDelivery, queued bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.delivers = append(h.delivers, delivered{reserved, jobs, queued})
}

func newHandler(t *testing.T, cfg inbound.Config) *inbound.Handler {
	t.Helper()
	cfg.AppSecret, cfg.VerifyToken = appSecret, verifyToken
	h, err := inbound.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func post(h http.Handler, body, signature string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/webhooks/upstream", strings.NewReader(body))
	if signature != "" {
		r.Header.Set(inbound.SignatureHeader, signature)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func signed(h http.Handler, body string) *httptest.ResponseRecorder {
	return post(h, body, inbound.Sign(appSecret, []byte(body)))
}

// messages is an upstream batch of text messages with the ids given, for phoneID.
func messages(ids ...string) string {
	var msgs []string
	for _, id := range ids {
		msgs = append(msgs, `{"from":"15550001111","id":"wamid.`+id+`","timestamp":"1700000000","type":"text","text":{"body":"hi"}}`)
	}
	return change("messages", `{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550100","phone_number_id":"`+phoneID+`"},`+
		`"messages":[`+strings.Join(msgs, ",")+`]}`)
}

func change(field, value string) string {
	return `{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","changes":[{"field":"` + field + `","value":` + value + `}]}]}`
}

func TestHandlerVerification(t *testing.T) {
	h := newHandler(t, inbound.Config{Store: newFixture(t).st})
	get := func(query string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/webhooks/upstream?"+query, nil))
		return w
	}
	if w := get("hub.mode=subscribe&hub.verify_token=" + verifyToken + "&hub.challenge=1158201444"); w.Code != 200 || w.Body.String() != "1158201444" {
		t.Fatalf("verification: %d %q", w.Code, w.Body)
	}
	if w := get("hub.mode=subscribe&hub.verify_token=wrong&hub.challenge=1"); w.Code != 403 {
		t.Fatalf("wrong verify token: %d", w.Code)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPut, "/webhooks/upstream", nil))
	if w.Code != 405 || w.Header().Get("Allow") != "GET, POST" {
		t.Fatalf("PUT: %d, Allow %q", w.Code, w.Header().Get("Allow"))
	}
}

func TestHandlerRefusesBadSignature(t *testing.T) {
	f := newFixture(t)
	obs := &observer{}
	ho := &handOff{free: 10}
	h := newHandler(t, inbound.Config{Store: f.st, Observer: obs, HandOff: func() inbound.HandOff { return ho }})
	body := messages("a")
	for _, sig := range []string{"", inbound.Sign("wrong-secret", []byte(body)), "sha256=00"} {
		if w := post(h, body, sig); w.Code != 401 {
			t.Fatalf("signature %q: %d %s", sig, w.Code, w.Body)
		}
	}
	if n := obs.rejected.Load(); n != 3 {
		t.Fatalf("%d posts counted rejected, want 3", n)
	}
	if len(ho.reserved) != 0 || obs.stored.Load() != 0 {
		t.Fatalf("a refused post reserved %v, stored %d", ho.reserved, obs.stored.Load())
	}
	// signed, but no WhatsApp payload: 200 and dropped
	if w := signed(h, `{"object":"page"}`); w.Code != 200 || obs.malformed.Load() != 1 {
		t.Fatalf("other object: %d, %d malformed", w.Code, obs.malformed.Load())
	}
	if w := signed(h, `{"x":"`+strings.Repeat("a", inbound.MaxBody)+`"}`); w.Code != 413 {
		t.Fatalf("huge body: %d", w.Code)
	}
}

func TestHandlerStoresAndHandsOff(t *testing.T) {
	f := newFixture(t)
	obs := &observer{}
	ho := &handOff{free: 2}
	var invalidated []uuid.UUID
	h := newHandler(t, inbound.Config{Store: f.st, Observer: obs, HandOff: func() inbound.HandOff { return ho },
		Invalidate: func(id uuid.UUID) { invalidated = append(invalidated, id) }})

	// three events for one webhook, two slots free: two handed off, one queued
	w := signed(h, messages("a", "b", "c"))
	if w.Code != 200 || w.Body.String() != `{"duplicates":0,"events":3}`+"\n" {
		t.Fatalf("batch: %d %q", w.Code, w.Body)
	}
	if len(ho.reserved) != 1 || ho.reserved[0] != 2 || len(ho.delivers) != 1 {
		t.Fatalf("reserved %v, delivers %+v", ho.reserved, ho.delivers)
	}
	d := ho.delivers[0]
	if d.reserved != 2 || len(d.jobs) != 2 || !d.queued {
		t.Fatalf("deliver(%d, %d jobs, queued %v), want (2, 2 jobs, queued)", d.reserved, len(d.jobs), d.queued)
	}
	for _, j := range d.jobs {
		if j.WebhookID != f.webhook || j.Attempt != 1 || j.Claim != 0 || len(j.Payload) == 0 || j.ID.Version() != 7 {
			t.Fatalf("handed-off job %+v", j)
		}
	}
	if obs.stored.Load() != 1 || obs.last.ByType[inbound.TypeMessage] != 3 {
		t.Fatalf("observed %d stored, last %+v", obs.stored.Load(), obs.last)
	}
	// a re-send: duplicates, nothing handed off
	if w := signed(h, messages("a", "b", "c")); w.Code != 200 || !strings.Contains(w.Body.String(), `"duplicates":3`) {
		t.Fatalf("re-send: %d %s", w.Code, w.Body)
	}
	if d := ho.delivers[1]; len(d.jobs) != 0 || d.queued {
		t.Fatalf("re-send delivered %+v", d)
	}
	// media handed to the channel: its relay scope is reloaded
	image := change("messages", `{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550100","phone_number_id":"`+phoneID+`"},`+
		`"messages":[{"from":"15550001111","id":"wamid.img","timestamp":"1700000002","type":"image","image":{"id":"1040000000000001"}}]}`)
	if w := signed(h, image); w.Code != 200 || len(invalidated) != 1 || invalidated[0] != f.channel {
		t.Fatalf("image: %d, invalidated %v", w.Code, invalidated)
	}
	// every Reserve was followed by one Deliver with the same n
	if len(ho.reserved) != len(ho.delivers) {
		t.Fatalf("%d reservations, %d delivers", len(ho.reserved), len(ho.delivers))
	}
	for i, n := range ho.reserved {
		if ho.delivers[i].reserved != n {
			t.Fatalf("reserve %d, deliver %d", n, ho.delivers[i].reserved)
		}
	}
}

// failingStore fails StoreEvents.
type failingStore struct{ inbound.Store }

func (failingStore) StoreEvents(context.Context, []store.IncomingItem, store.Claim) (store.InboundResult, error) {
	return store.InboundResult{}, errors.New("database unreachable")
}

func TestHandlerStoreFailsAnswers503(t *testing.T) {
	f := newFixture(t)
	ho := &handOff{free: 10}
	h := newHandler(t, inbound.Config{Store: failingStore{f.st}, HandOff: func() inbound.HandOff { return ho }})
	w := signed(h, messages("a"))
	if w.Code != 503 || w.Header().Get("Retry-After") == "" {
		t.Fatalf("store failed: %d (Retry-After %q), want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	// the reservation is given back all the same
	if len(ho.delivers) != 1 || ho.delivers[0].reserved != ho.reserved[0] || len(ho.delivers[0].jobs) != 0 {
		t.Fatalf("reserved %v, delivers %+v", ho.reserved, ho.delivers)
	}
}

func TestHandlerBanPolicy(t *testing.T) {
	f := newFixture(t)
	h := newHandler(t, inbound.Config{Store: f.st})
	ban := func(state string) string {
		return change("account_update", `{"event":"DISABLED_UPDATE","ban_info":{"waba_ban_state":"`+state+`"}}`)
	}
	for _, state := range []string{inbound.BanScheduleForDisable, inbound.BanReinstate} {
		if w := signed(h, ban(state)); w.Code != 200 {
			t.Fatalf("%s: %d", state, w.Code)
		}
		if s := f.channelStatus(t); s != "active" {
			t.Fatalf("after %s the channel is %s", state, s)
		}
	}
	if w := signed(h, ban(inbound.BanDisable)); w.Code != 200 {
		t.Fatalf("DISABLE: %d", w.Code)
	}
	if s := f.channelStatus(t); s != "inactive" {
		t.Fatalf("after DISABLE the channel is %s", s)
	}
}

func TestHandlerNumberRemoved(t *testing.T) {
	f := newFixture(t)
	h := newHandler(t, inbound.Config{Store: f.st})
	other := change("account_update", `{"event":"PHONE_NUMBER_REMOVED","phone_number":"15550199"}`)
	if w := signed(h, other); w.Code != 200 || f.channelStatus(t) != "active" {
		t.Fatalf("another number removed: %d, channel %s", w.Code, f.channelStatus(t))
	}
	removed := change("account_update", `{"event":"PHONE_NUMBER_REMOVED","phone_number":"15550100"}`)
	if w := signed(h, removed); w.Code != 200 || f.channelStatus(t) != "inactive" {
		t.Fatalf("number removed: %d, channel %s", w.Code, f.channelStatus(t))
	}
}

// blockingStore holds StoreEvents until release is closed.
type blockingStore struct {
	inbound.Store
	entered chan struct{}
	release chan struct{}
}

func (s blockingStore) StoreEvents(ctx context.Context, items []store.IncomingItem, claim store.Claim) (store.InboundResult, error) {
	s.entered <- struct{}{}
	<-s.release
	return s.Store.StoreEvents(ctx, items, claim)
}

// TestHandlerOverflow: with every slot taken, a post waits MaxWait and is then stored anyway,
// counted as overflow; a post whose client gives up while waiting is answered 503.
func TestHandlerOverflow(t *testing.T) {
	f := newFixture(t)
	obs := &observer{}
	bs := blockingStore{Store: f.st, entered: make(chan struct{}, 2), release: make(chan struct{})}
	h := newHandler(t, inbound.Config{Store: bs, Observer: obs, Concurrency: 1, MaxWait: 50 * time.Millisecond})

	first := make(chan int)
	go func() { first <- signed(h, messages("a")).Code }()
	<-bs.entered // the first post holds the only slot

	// a client that gives up while waiting for a slot
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/webhooks/upstream", strings.NewReader(messages("c")))
	r.Header.Set(inbound.SignatureHeader, inbound.Sign(appSecret, []byte(messages("c"))))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 503 || obs.overflow.Load() != 0 {
		t.Fatalf("gave up waiting: %d, %d overflows", w.Code, obs.overflow.Load())
	}

	second := make(chan int)
	go func() { second <- signed(h, messages("b")).Code }()
	<-bs.entered // stored outside the limit, after MaxWait
	if n := obs.overflow.Load(); n != 1 {
		t.Fatalf("%d overflows, want 1", n)
	}
	close(bs.release)
	if a, b := <-first, <-second; a != 200 || b != 200 {
		t.Fatalf("answers %d and %d, want 200 and 200", a, b)
	}
}

func TestNewNeedsAStore(t *testing.T) {
	if _, err := inbound.New(inbound.Config{}); err == nil {
		t.Fatal("New without a store: no error")
	}
}
