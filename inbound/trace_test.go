package inbound_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/traces"
)

// TestHandlerTracesStore: in a traced request (a recording server span in its context, as
// Caddy's `tracing` makes) the post stores its events in a "wabarelay.inbound.store" span, a
// child of the request's; the events and the deliveries handed off keep that span's
// traceparent, and the provider is remembered for the dispatcher. Untraced, nothing is stored.
func TestHandlerTracesStore(t *testing.T) {
	f := newFixture(t)
	ho := &handOff{free: 1}
	var remembered traces.Provider
	h := newHandler(t, inbound.Config{Store: f.st, HandOff: func() inbound.HandOff { return ho }, Traces: &remembered})

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, server := tp.Tracer("caddy").Start(context.Background(), "POST")
	body := messages("t1", "t2")
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/webhooks/upstream", strings.NewReader(body))
	r.Header.Set(inbound.SignatureHeader, inbound.Sign(appSecret, []byte(body)))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	server.End()
	if w.Code != 200 {
		t.Fatalf("traced post: %d %s", w.Code, w.Body)
	}
	spans := rec.Ended()
	if len(spans) != 2 || spans[0].Name() != "wabarelay.inbound.store" || spans[0].Parent().SpanID() != server.SpanContext().SpanID() {
		t.Fatalf("spans %v: want the store span, a child of the server span", spans)
	}
	want := traces.Format(spans[0].SpanContext())
	if n := count(t, f, `SELECT count(*) FROM events WHERE traceparent = $1`, want); n != 2 {
		t.Fatalf("%d events keep the store span's traceparent %s, want 2", n, want)
	}
	if len(ho.delivers) != 1 || len(ho.delivers[0].jobs) != 1 || ho.delivers[0].jobs[0].Traceparent != want {
		t.Fatalf("handed off %+v: want one job with traceparent %s", ho.delivers, want)
	}
	if remembered.Tracer() == nil {
		t.Fatal("the traced request's provider was not remembered")
	}

	// untraced: no span, no traceparent
	if w := signed(h, messages("u1")); w.Code != 200 {
		t.Fatalf("untraced post: %d %s", w.Code, w.Body)
	}
	if n := count(t, f, `SELECT count(*) FROM events WHERE traceparent IS NULL AND type = $1`, inbound.TypeMessage); n != 1 || len(rec.Ended()) != 2 {
		t.Fatalf("untraced post: %d events without traceparent (want 1), %d spans (want 2)", n, len(rec.Ended()))
	}
}

// count runs a count query on the fixture's database.
func count(t *testing.T, f *fixture, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.st.Pool().QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
