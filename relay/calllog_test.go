package relay

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/admission"
	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/ratelimit"
)

// callRecorder is a CallLog keeping every call.
type callRecorder struct {
	mu    sync.Mutex
	calls []Call
}

func (l *callRecorder) Record(c Call) {
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

// take returns the calls recorded since the last take.
func (l *callRecorder) take() []Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.calls
	l.calls = nil
	return c
}

// withCallLog puts a recorder on f's relay.
func withCallLog(f *relayFixture) *callRecorder {
	l := &callRecorder{}
	f.relay.CallLog = l
	return l
}

// expectCall checks that exactly one call was recorded since the last take, like want in every
// field but the time and latency (which must be set), and returns it.
func (f *relayFixture) expectCall(t *testing.T, l *callRecorder, what string, want Call) Call {
	t.Helper()
	calls := l.take()
	if len(calls) != 1 {
		t.Fatalf("%s: %d calls recorded, want 1: %+v", what, len(calls), calls)
	}
	got := calls[0]
	if got.At.IsZero() || got.Latency <= 0 || time.Since(got.At) < got.Latency {
		t.Errorf("%s: at %v, latency %v", what, got.At, got.Latency)
	}
	want.At, want.Latency = got.At, got.Latency
	want.ChannelID = f.channel
	if want.OrgID = got.OrgID; got.OrgID.String() == "00000000-0000-0000-0000-000000000000" {
		t.Errorf("%s: no org", what)
	}
	if got != want {
		t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
	}
	return got
}

// TestCallLogSendExits: each exit of the send path records one Call with the answer's status
// and outcome, the body's "to", the key, the wamid of a success (a replay's too) and the
// upstream's error code and subcode; calls off the send path are not recorded.
func TestCallLogSendExits(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	l := withCallLog(f)
	send := "/" + tPNID + "/messages"
	const to = "15551234567"

	w := f.serve("POST", send, sendBody("hi", ""), nil)
	wamid := wamidOf(w.Body.Bytes())
	if w.Code != 200 || !strings.HasPrefix(wamid, "wamid.") {
		t.Fatalf("send: %d %s", w.Code, w.Body)
	}
	f.expectCall(t, l, "send without a key", Call{Status: 200, Outcome: OutcomeOK, Recipient: to, WAMID: wamid})

	w = f.serve("POST", send, sendBody("hi", "k1"), nil)
	keyed := wamidOf(w.Body.Bytes())
	if w.Code != 200 || keyed == "" || keyed == wamid {
		t.Fatalf("keyed send: %d %s", w.Code, w.Body)
	}
	f.expectCall(t, l, "keyed send", Call{Status: 200, Outcome: OutcomeOK, Recipient: to, WAMID: keyed, IdempotencyKey: "k1"})
	f.serve("POST", send, sendBody("hi", "k1"), nil)
	f.expectCall(t, l, "replay", Call{Status: 200, Outcome: OutcomeReplayed, Recipient: to, WAMID: keyed, IdempotencyKey: "k1", Replayed: true})
	expectError(t, f.serve("POST", send, sendBody("other", "k1"), nil), 422, MsgIdemMismatch)
	f.expectCall(t, l, "key mismatch", Call{Status: 422, Outcome: OutcomeIdempotencyConflict, Recipient: to, IdempotencyKey: "k1"})
	expectError(t, f.serve("POST", send, sendBody("hi", strings.Repeat("k", 256)), nil), 422, MsgIdemKeyLength)
	f.expectCall(t, l, "key too long", Call{Status: 422, Outcome: OutcomeInvalidRequest, Recipient: to})
	expectError(t, f.serve("POST", send, `{"to":"1","idempotency_key":5}`, nil), 422, ErrKeyNotString.Error())
	f.expectCall(t, l, "key not a string", Call{Status: 422, Outcome: OutcomeInvalidRequest, Recipient: "1"})
	expectError(t, f.serve("POST", send, `{"to":"`+strings.Repeat("1", MaxSendBody)+`"}`, nil), 413, MsgBodyTooLarge)
	f.expectCall(t, l, "body too large", Call{Status: 413, Outcome: OutcomeInvalidRequest})
	expectError(t, f.serve("POST", send+"?a=%zz", sendBody("hi", ""), nil), 400, MsgBadQuery)
	f.expectCall(t, l, "bad query", Call{Status: 400, Outcome: OutcomeInvalidRequest})

	// The upstream's errors: its code and subcode, a keyed send's too.
	f.fake.FailNext("POST "+send, 1, 0, fakegraph.ErrReengagement())
	if w := f.serve("POST", send, sendBody("late", ""), nil); w.Code != 400 {
		t.Fatalf("re-engagement: %d %s", w.Code, w.Body)
	}
	f.expectCall(t, l, "upstream 4xx", Call{Status: 400, Outcome: OutcomeUpstream4xx, Recipient: to, ErrorCode: 131047})
	f.fake.FailNext("POST "+send, 1, 0, fakegraph.GraphError("Invalid parameter", "OAuthException", 100, 2494010))
	if w := f.serve("POST", send, sendBody("bad", "k2"), nil); w.Code != 400 {
		t.Fatalf("invalid parameter: %d %s", w.Code, w.Body)
	}
	f.expectCall(t, l, "upstream 4xx, keyed", Call{Status: 400, Outcome: OutcomeUpstream4xx, Recipient: to, IdempotencyKey: "k2", ErrorCode: 100, ErrorSubcode: 2494010})
	f.fake.FailNext("POST "+send, 1, 0, fakegraph.ErrSomethingWentWrong())
	f.serve("POST", send, sendBody("five", "k3"), nil)
	f.expectCall(t, l, "upstream 5xx", Call{Status: 500, Outcome: OutcomeUpstream5xx, Recipient: to, IdempotencyKey: "k3", ErrorCode: 131000})
	f.serve("POST", send, sendBody("five", "k3"), nil)
	f.expectCall(t, l, "replayed 5xx", Call{Status: 500, Outcome: OutcomeReplayed, Recipient: to, IdempotencyKey: "k3", ErrorCode: 131000, Replayed: true})
	down := func(http.ResponseWriter, *http.Request) error {
		return &net.OpError{Op: "dial", Err: context.DeadlineExceeded}
	}
	f.serve("POST", send, sendBody("hi", ""), down)
	f.expectCall(t, l, "upstream unreachable", Call{Status: 504, Outcome: OutcomeUpstreamError, Recipient: to})

	// Not the send path: a read, another number's messages, an unknown token.
	f.serve("GET", "/"+tWABA+"/message_templates", "", nil)
	expectError(t, f.serve("POST", "/9009/messages", sendBody("hi", ""), nil), 403, MsgPathNotAllowed)
	tok := f.token
	f.token = "nope"
	expectError(t, f.serve("POST", send, sendBody("hi", ""), nil), 401, MsgInvalidToken)
	f.token = tok
	if calls := l.take(); len(calls) != 0 {
		t.Fatalf("calls off the send path recorded: %+v", calls)
	}

	// A dead upstream token: 503, the upstream's 190 recorded; the channel's next send is
	// refused before the upstream (the cache entry was dropped at once) and recorded too.
	f.fake.FailNext("POST "+send, 1, 0, fakegraph.GraphError("Error validating access token", "OAuthException", 190, 463))
	expectError(t, f.serve("POST", send, sendBody("hi", "k4"), nil), 503, MsgDisconnected)
	f.expectCall(t, l, "dead token", Call{Status: 503, Outcome: OutcomeDisconnected, Recipient: to, IdempotencyKey: "k4", ErrorCode: 190, ErrorSubcode: 463})
	expectError(t, f.serve("POST", send, sendBody("hi", ""), nil), 503, MsgDisconnected)
	f.expectCall(t, l, "disconnected channel", Call{Status: 503, Outcome: OutcomeDisconnected})
}

// TestCallLogRefusals: the channel's rate limit, an inactive channel and a key in progress are
// recorded with the relay's own status.
func TestCallLogRefusals(t *testing.T) {
	f := newRelayFixture(t, 2, func() (Admission, idempotency.Store) {
		lim := ratelimit.NewMemory(2, time.Hour)
		t.Cleanup(func() { lim.Close() })
		mem := idempotency.NewMemory(idempotency.Options{Wait: -1})
		t.Cleanup(func() { _ = mem.Close() })
		return admission.NewMemory(lim, mem), mem
	})
	l := withCallLog(f)
	send := "/" + tPNID + "/messages"
	// A key claimed and not finished: the send with it is in progress (409).
	fp := idempotency.Fingerprint("POST", send, "", []byte(sendBody("hi", "")))
	if _, res, err := f.relay.Admission.Claim(context.Background(), f.channel, "busy", fp); err != nil || res.Outcome != idempotency.Acquired {
		t.Fatalf("claim: %v %v", res, err)
	}
	expectError(t, f.serve("POST", send, sendBody("hi", "busy"), nil), 409, MsgIdemInProgress)
	f.expectCall(t, l, "in progress", Call{Status: 409, Outcome: OutcomeIdempotencyConflict, Recipient: "15551234567", IdempotencyKey: "busy"})
	// The claim and that send used the limit's two calls: the next sends are refused.
	f.serve("POST", send, sendBody("hi", ""), nil)
	f.expectCall(t, l, "rate limited", Call{Status: 429, Outcome: OutcomeRateLimited, Recipient: "15551234567"})
	f.serve("POST", send, sendBody("hi", "k"), nil)
	f.expectCall(t, l, "rate limited, keyed", Call{Status: 429, Outcome: OutcomeRateLimited, Recipient: "15551234567", IdempotencyKey: "k"})

	// An inactive channel (deactivated before the cache saw it).
	g := newRelayFixture(t, 100, nil)
	gl := withCallLog(g)
	if _, err := g.store.DeactivateChannel(context.Background(), g.channel); err != nil {
		t.Fatal(err)
	}
	expectError(t, g.serve("POST", send, sendBody("hi", ""), nil), 403, MsgNotActive)
	g.expectCall(t, gl, "inactive", Call{Status: 403, Outcome: OutcomeInactive})
	expectError(t, g.serve("GET", "/"+tWABA+"/message_templates", "", nil), 403, MsgNotActive)
	if calls := gl.take(); len(calls) != 0 {
		t.Fatalf("a refused read recorded: %+v", calls)
	}
}

// TestCallLogScan: the scans behind the log read what they should and never fail on garbage.
func TestCallLogScan(t *testing.T) {
	for _, tc := range []struct {
		body, to string
	}{
		{`{"to":"1555"}`, "1555"},
		{` { "messaging_product" : "whatsapp" , "to" : "1\u0035" }`, "15"},
		{`{"text":{"to":"nested"},"to":"top"}`, "top"},
		{`{"to":5}`, ""},
		{`["to","x"]`, ""},
		{`{"to":"unterminated`, ""},
		{`{"to`, ""},
		{`{"a":"\`, ""},
		{`{"a":{"b":"\`, ""},
		{`{"a":[1,2`, ""},
		{`{"a" 1, "to":"x"}`, ""},
		{``, ""},
		{`{"to":"` + strings.Repeat("9", 257) + `"}`, ""},
		{`{"to":"` + strings.Repeat("9", 25) + `"}`, ""},                                     // no phone number: nothing of it recorded
		{`{"to":"+1 (555) 123-4567"}`, "+1 (555) 123-4567"},                                  // a number written with separators
		{`{"to":"user.` + strings.Repeat("a", 64) + `"}`, "user." + strings.Repeat("a", 64)}, // a business-scoped user id
		{`{"to":"user.` + strings.Repeat("a", 65) + `"}`, ""},
	} {
		if got := recipientOf([]byte(tc.body)); got != tc.to {
			t.Errorf("recipientOf(%q) = %q, want %q", tc.body, got, tc.to)
		}
	}
	ans := `{"messaging_product":"whatsapp","contacts":[{"input":"1","wa_id":"1"}],"messages":[{"id":"wamid.A","message_status":"accepted"},{"id":"wamid.B"}]}`
	if w, c, s := answerFacts(200, []byte(ans)); w != "wamid.A" || c != 0 || s != 0 {
		t.Errorf("success: %q %d %d", w, c, s)
	}
	errAns := `{"error":{"message":"x","type":"OAuthException","code":131056,"error_subcode":2494100,"error_data":{"details":"y"}}}`
	if w, c, s := answerFacts(400, []byte(errAns)); w != "" || c != 131056 || s != 2494100 {
		t.Errorf("error: %q %d %d", w, c, s)
	}
	for _, garbage := range []string{`{"error":{"code":"x"}}`, `{"error":{"code":99999999999}}`, `{"error":[]}`, `<html>`, `{"messages":[]}`, `{"messages":[{"id":7}]}`} {
		w, c, s := answerFacts(400, []byte(garbage))
		w2, _, _ := answerFacts(200, []byte(garbage))
		if w != "" || c != 0 || s != 0 || w2 != "" {
			t.Errorf("%s: %q %d %d %q", garbage, w, c, s, w2)
		}
	}
}

// blockingLog is a CallLog whose Record waits until release is closed, telling recording first.
type blockingLog struct {
	recording chan Call
	release   chan struct{}
}

func (l *blockingLog) Record(c Call) {
	l.recording <- c
	<-l.release
}

// TestAnswerBeforeBookkeeping: a send's answer reaches the caller before the relay's
// bookkeeping after it (the call log's record, here held up; a keyed send's stored answer
// follows it), not when the handler returns: the caller reads the whole answer while the
// record is still waiting. A key released after the send (the upstream unreachable) is free
// before its answer goes out.
func TestAnswerBeforeBookkeeping(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	// up, like f.relay.CallLog, is set between calls: the calls' socket I/O orders them.
	up := Upstream(f.upstream)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.relay.Serve(w, r, up)
	}))
	t.Cleanup(srv.Close)
	send := srv.URL + "/" + tPNID + "/messages"
	post := func(body string) (*http.Response, []byte, error) {
		req, _ := http.NewRequest("POST", send, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+f.token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, b, err
	}
	for _, key := range []string{"", "k-flushed"} {
		l := &blockingLog{recording: make(chan Call, 1), release: make(chan struct{})}
		var once sync.Once
		release := func() { once.Do(func() { close(l.release) }) }
		t.Cleanup(release) // a failure below must not leave the handler held (the server's Close waits for it)
		f.relay.CallLog = l
		type answer struct {
			resp *http.Response
			body []byte
			err  error
		}
		got := make(chan answer, 1)
		go func() {
			resp, body, err := post(sendBody("hi", key))
			got <- answer{resp, body, err}
		}()
		c := <-l.recording // the handler is in the record now, held there
		select {
		case a := <-got:
			if a.err != nil || a.resp.StatusCode != 200 || wamidOf(a.body) != c.WAMID || c.WAMID == "" {
				t.Fatalf("key %q: %v %v %s (recorded wamid %q)", key, a.err, a.resp, a.body, c.WAMID)
			}
			if a.resp.ContentLength != int64(len(a.body)) {
				t.Errorf("key %q: Content-Length %d for %d bytes", key, a.resp.ContentLength, len(a.body))
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("key %q: no answer while the call log's record waits", key)
		}
		release()
		f.wait()
	}

	// Released: the upstream unreachable, the key is free for the retry the answer prompts.
	f.relay.CallLog = nil
	up = func(http.ResponseWriter, *http.Request) error {
		return &net.OpError{Op: "dial", Err: context.DeadlineExceeded}
	}
	if resp, body, err := post(sendBody("hi", "k-released")); err != nil || resp.StatusCode != 504 {
		t.Fatalf("unreachable upstream: %v %v %s", err, resp, body)
	}
	up = f.upstream
	if resp, body, err := post(sendBody("hi", "k-released")); err != nil || resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after a released key: %v %v %s", err, resp, body)
	}
}
