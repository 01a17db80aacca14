package dispatcher

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// answerOnCancel answers every request 200 once the request's context is done, as net/http's
// Transport does when a receiver's answer races the cancellation at the deadline: closing the
// TLS connection sends close_notify first, a Go receiver takes it as the client gone and cancels
// its handler, the handler returns (200 by default), and if that answer is read before the
// socket closes, roundTrip hands back "the response racing the context close" instead of the
// error. With the real Transport the race is rare (TestSlowReceiverIsFailure under CPU load);
// here it happens every time.
type answerOnCancel struct{ calls chan struct{} }

func (a answerOnCancel) RoundTrip(r *http.Request) (*http.Response, error) {
	a.calls <- struct{}{}
	<-r.Context().Done()
	return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// TestAnswerPastTimeoutIsTimeout: a 2xx that arrives only after the attempt's timeout (an answer
// to the cancelled request) is a timeout, not a delivery.
func TestAnswerPastTimeoutIsTimeout(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true}) // (never reached: the transport answers)
	e.webhook(rc.URL)
	ids := e.events(1)
	cfg := e.config(rc)
	cfg.Timeout, cfg.RetryDelays = 200*time.Millisecond, []time.Duration{}
	d, err := New(e.pool, e.st.WebhookSecret, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rt := answerOnCancel{calls: make(chan struct{}, 10)}
	d.client.Transport = rt // (before Run: no attempt runs yet)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx, e.dsn) }()
	t.Cleanup(func() { cancel(); <-done })

	final := func() bool { s := e.delivery(ids[0]).status; return s == "failed" || s == "delivered" }
	testenv.Eventually(t, patience, final, "the delivery delivered or failed")
	if n := len(rt.calls); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
	if row := e.delivery(ids[0]); row.status != "failed" || row.attempts != 1 || row.code != nil ||
		row.lastErr == nil || *row.lastErr != ClassTimeout {
		t.Fatalf("delivery %+v: an answer past the timeout counted", row)
	}
	at := e.attemptRows(ids[0])
	if len(at) != 1 || at[0].code != nil || at[0].body != nil || at[0].err == nil || *at[0].err != ClassTimeout || at[0].duration < 200 {
		t.Fatalf("attempts %+v", at)
	}
}
