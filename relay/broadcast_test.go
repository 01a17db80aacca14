package relay

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/store"
)

const broadcastBody = `{"messaging_product":"whatsapp","to":"15551234567","type":"template",` +
	`"template":{"name":"hello_world","language":{"code":"en_US"}}}`

// broadcastChannel is the fixture's channel looked up by id, as the broadcast sender does.
func (f *relayFixture) broadcastChannel(t *testing.T) *store.RelayChannel {
	t.Helper()
	ch, err := f.relay.Channels.(*Cache).ByID(context.Background(), f.channel)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// TestBroadcastSendForAccepted: a send on a channel's behalf goes upstream with the channel's
// access token, returns the wamid and is in the call log with its recipient and wamid.
func TestBroadcastSendForAccepted(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	l := withCallLog(f)
	var auth string
	up := func(w http.ResponseWriter, r *http.Request) error {
		auth = r.Header.Get("Authorization")
		return f.upstream(w, r)
	}
	res := f.relay.SendFor(context.Background(), f.broadcastChannel(t), []byte(broadcastBody), up)
	if res.Status != 200 || !res.Answered || res.WAMID == "" || res.NotSent || res.RateLimited {
		t.Fatalf("result %+v", res)
	}
	if auth != "Bearer "+tUpstream {
		t.Fatalf("upstream got Authorization %q", auth)
	}
	f.expectCall(t, l, "accepted", Call{Status: 200, Outcome: OutcomeOK, Recipient: "15551234567", WAMID: res.WAMID})
}

// TestBroadcastSendForUpstreamErrors: the upstream's error code and title come back; a 190
// marks the channel disconnected exactly as for a caller (503, not sent).
func TestBroadcastSendForUpstreamErrors(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	l := withCallLog(f)
	ch := f.broadcastChannel(t)
	f.fake.FailNext("POST /"+tPNID+"/messages", 1, 0, fakegraph.ErrPairRateLimit())
	res := f.relay.SendFor(context.Background(), ch, []byte(broadcastBody), f.upstream)
	if !res.Answered || res.ErrorCode != 131056 || res.ErrorTitle == "" || res.Status < 400 {
		t.Fatalf("pair rate: %+v", res)
	}
	l.take()

	f.fake.FailNext("POST /"+tPNID+"/messages", 1, 0, fakegraph.ErrInvalidToken())
	res = f.relay.SendFor(context.Background(), ch, []byte(broadcastBody), f.upstream)
	if res.Status != 503 || res.Outcome != OutcomeDisconnected || !res.NotSent || res.ErrorCode != 190 {
		t.Fatalf("dead token: %+v", res)
	}
	f.expectCall(t, l, "dead token", Call{Status: 503, Outcome: OutcomeDisconnected, ErrorCode: 190, Recipient: "15551234567"})
	// The channel is marked, and the cache by id sees it: the next send is refused unsent.
	again := f.relay.SendFor(context.Background(), f.broadcastChannel(t), []byte(broadcastBody), f.upstream)
	if again.Status != 503 || again.Outcome != OutcomeDisconnected || !again.NotSent || again.Answered {
		t.Fatalf("after the dead token: %+v", again)
	}
	if n := f.sends.Load(); n != 2 {
		t.Fatalf("%d upstream sends, want 2", n)
	}
}

// TestBroadcastSendForLimitAndFailures: the channel's limit, shared with callers, refuses with
// its Retry-After and nothing sent; a refused connection is not sent; a timeout may have been.
func TestBroadcastSendForLimitAndFailures(t *testing.T) {
	f := newRelayFixture(t, 1, nil)
	ch := f.broadcastChannel(t)
	if w := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", ""), nil); w.Code != 200 {
		t.Fatalf("caller's send: %d", w.Code)
	}
	res := f.relay.SendFor(context.Background(), ch, []byte(broadcastBody), f.upstream)
	if !res.RateLimited || res.Status != 429 || res.RetryAfter <= 0 || !res.NotSent {
		t.Fatalf("over the limit: %+v", res)
	}

	f = newRelayFixture(t, 100, nil)
	ch = f.broadcastChannel(t)
	refused := func(http.ResponseWriter, *http.Request) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	}
	if res := f.relay.SendFor(context.Background(), ch, []byte(broadcastBody), refused); res.Status != 502 || !res.NotSent || res.Answered {
		t.Fatalf("refused connection: %+v", res)
	}
	timeout := func(http.ResponseWriter, *http.Request) error { return ErrUpstreamTimeout }
	if res := f.relay.SendFor(context.Background(), ch, []byte(broadcastBody), timeout); res.Status != 504 || res.NotSent || !res.TimedOut {
		t.Fatalf("timeout: %+v", res)
	}
	cut := func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		w.Write([]byte(`{"messaging_product":`))
		panic(http.ErrAbortHandler)
	}
	if res := f.relay.SendFor(context.Background(), ch, []byte(broadcastBody), cut); !res.Aborted || res.NotSent {
		t.Fatalf("cut answer: %+v", res)
	}
}

// TestBroadcastSendForChannelState: an inactive channel is refused 403 and a channel with no
// number 403 out of scope, without an upstream call.
func TestBroadcastSendForChannelState(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	ch := *f.broadcastChannel(t)
	ch.Status = "inactive"
	if res := f.relay.SendFor(context.Background(), &ch, []byte(broadcastBody), f.upstream); res.Status != 403 || res.Outcome != OutcomeInactive || !res.NotSent {
		t.Fatalf("inactive: %+v", res)
	}
	ch.Status, ch.PhoneNumberID = "active", ""
	if res := f.relay.SendFor(context.Background(), &ch, []byte(broadcastBody), f.upstream); res.Status != 403 || res.Outcome != OutcomeForbidden {
		t.Fatalf("no number: %+v", res)
	}
	if n := f.sends.Load(); n != 0 {
		t.Fatalf("%d upstream sends, want 0", n)
	}
}
