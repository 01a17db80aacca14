package inbound_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/store"
)

// groupStore is a GroupStore that records the size of every group, holds the first one until
// release is closed (entered tells it started), and fails every group when fail is set.
type groupStore struct {
	*store.Store
	entered chan struct{}
	release chan struct{}
	fail    bool

	mu    sync.Mutex
	sizes []int
}

func (s *groupStore) StoreEventsGroup(ctx context.Context, posts []store.Post) ([]store.InboundResult, error) {
	s.mu.Lock()
	s.sizes = append(s.sizes, len(posts))
	first := len(s.sizes) == 1
	s.mu.Unlock()
	if first {
		s.entered <- struct{}{}
		<-s.release
	}
	if s.fail {
		return nil, errors.New("database unreachable")
	}
	return s.Store.StoreEventsGroup(ctx, posts)
}

// waitQueued returns once n posts wait for a group.
func waitQueued(h *inbound.Handler, n int) {
	for inbound.Waiting(h) < n {
		runtime.Gosched()
	}
}

// TestHandlerGroupCommit: posts that wait for their turn are stored in one group, each answered
// with its own counts (an item two of them carry is stored once), and each post's hand-off
// reservation is followed by its own Deliver.
func TestHandlerGroupCommit(t *testing.T) {
	f := newFixture(t)
	gs := &groupStore{Store: f.st, entered: make(chan struct{}, 1), release: make(chan struct{})}
	ho := &handOff{free: 100}
	obs := &observer{}
	h := newHandler(t, inbound.Config{Store: gs, Concurrency: 1, MaxWait: time.Hour, Observer: obs, HandOff: func() inbound.HandOff { return ho }})

	answers := make(chan map[string]int, 3)
	send := func(body string) {
		w := signed(h, body)
		var got map[string]int
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &got) != nil {
			t.Errorf("answer %d %s", w.Code, w.Body)
		}
		answers <- got
	}
	go send(messages("a"))
	<-gs.entered // the first post's group holds the only turn
	go send(messages("b", "shared"))
	go send(messages("c", "shared"))
	waitQueued(h, 2)
	close(gs.release)
	events, dups := 0, 0
	for range 3 {
		a := <-answers
		events, dups = events+a["events"], dups+a["duplicates"]
	}
	if events != 4 || dups != 1 {
		t.Fatalf("%d events, %d duplicates answered; want 4 and 1", events, dups)
	}
	if len(gs.sizes) != 2 || gs.sizes[0] != 1 || gs.sizes[1] != 2 {
		t.Fatalf("groups of %v posts, want [1 2]", gs.sizes)
	}
	if n := obs.overflow.Load(); n != 0 {
		t.Fatalf("%d overflows", n)
	}
	ho.mu.Lock()
	defer ho.mu.Unlock()
	if len(ho.reserved) != 3 || len(ho.delivers) != 3 {
		t.Fatalf("%d reservations, %d delivers; want 3 and 3", len(ho.reserved), len(ho.delivers))
	}
	claimed := 0
	for i, d := range ho.delivers {
		if d.reserved != ho.reserved[i] || len(d.jobs) > d.reserved {
			t.Fatalf("reserved %v, delivers %+v", ho.reserved, ho.delivers)
		}
		claimed += len(d.jobs)
	}
	if claimed != 4 { // one webhook, every new event handed off
		t.Fatalf("%d deliveries handed off, want 4", claimed)
	}
}

// TestHandlerGroupFails: when a group's transaction fails, every post of it is answered 503 and
// gets its reservation back.
func TestHandlerGroupFails(t *testing.T) {
	f := newFixture(t)
	gs := &groupStore{Store: f.st, entered: make(chan struct{}, 1), release: make(chan struct{}), fail: true}
	ho := &handOff{free: 100}
	h := newHandler(t, inbound.Config{Store: gs, Concurrency: 1, MaxWait: time.Hour, HandOff: func() inbound.HandOff { return ho }})
	codes := make(chan int, 3)
	go func() { codes <- signed(h, messages("a")).Code }()
	<-gs.entered
	go func() { codes <- signed(h, messages("b")).Code }()
	go func() { codes <- signed(h, messages("c")).Code }()
	waitQueued(h, 2)
	close(gs.release)
	for range 3 {
		if c := <-codes; c != 503 {
			t.Fatalf("answer %d, want 503", c)
		}
	}
	ho.mu.Lock()
	defer ho.mu.Unlock()
	if len(ho.delivers) != 3 {
		t.Fatalf("%d delivers, want 3", len(ho.delivers))
	}
	for _, d := range ho.delivers {
		if len(d.jobs) != 0 {
			t.Fatalf("jobs delivered after a failed group: %+v", ho.delivers)
		}
	}
}

// TestHandlerGroupOverflow: a post that waits MaxWait without a group taking it is stored alone,
// outside the limit (counted), and a post whose client gives up while waiting is answered 503.
func TestHandlerGroupOverflow(t *testing.T) {
	f := newFixture(t)
	gs := &groupStore{Store: f.st, entered: make(chan struct{}, 1), release: make(chan struct{})}
	obs := &observer{}
	h := newHandler(t, inbound.Config{Store: gs, Concurrency: 1, MaxWait: 50 * time.Millisecond, Observer: obs})
	first := make(chan int)
	go func() { first <- signed(h, messages("a")).Code }()
	<-gs.entered

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if w := signedCtx(ctx, h, messages("c")); w.Code != 503 || obs.overflow.Load() != 0 {
		t.Fatalf("gave up waiting: %d, %d overflows", w.Code, obs.overflow.Load())
	}
	if w := signed(h, messages("b")); w.Code != 200 || obs.overflow.Load() != 1 {
		t.Fatalf("after MaxWait: %d, %d overflows; want 200 and 1", w.Code, obs.overflow.Load())
	}
	close(gs.release)
	if c := <-first; c != 200 {
		t.Fatalf("first: %d", c)
	}
}

// signedCtx posts a signed body with the request context ctx.
func signedCtx(ctx context.Context, h http.Handler, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/webhooks/upstream", strings.NewReader(body))
	r.Header.Set(inbound.SignatureHeader, inbound.Sign(appSecret, []byte(body)))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}
