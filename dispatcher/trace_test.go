package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
	"github.com/wabarelay/wabarelay/traces"
)

// storeTraced stores one message event with the traceparent tp ("" for none), with claim, and
// returns its id and the result.
func (e *env) storeTraced(tp string, claim store.Claim) (uuid.UUID, store.InboundResult) {
	e.t.Helper()
	k := e.seq.Add(1)
	it := store.IncomingItem{Type: "messages", PhoneNumberID: e.phone, DedupeKey: fmt.Sprintf("t%d", k),
		Data: json.RawMessage(fmt.Sprintf(`{"message": {"id": "wamid.t%d"}}`, k)), Traceparent: tp}
	res, err := e.st.StoreEvents(context.Background(), []store.IncomingItem{it}, claim)
	if err != nil || res.Events != 1 {
		e.t.Fatalf("store events: %+v %v", res, err)
	}
	var id uuid.UUID
	if err := e.pool.QueryRow(context.Background(), `SELECT id FROM events WHERE dedupe_key = $1`, it.DedupeKey).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return id, res
}

// spanAttr returns the value of a span's attribute k (the zero Value when absent).
func spanAttr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

// TestTracedAttempts: every attempt of an event stored with a traceparent carries a
// traceparent of its own attempt span, a child of the stored one, and a claim span goes with
// it — for a delivery claimed from the queue (a failed attempt, then a retry) and one handed
// off alike; an event stored without one gets no header and no span.
func TestTracedAttempts(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	hitsOf := map[string]int{}
	var handedID string // the first attempt of every other traced event fails
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(_ int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		id := r.Header.Get("webhook-id")
		hitsOf[id]++
		fail := id != handedID && r.Header.Get(traces.Header) != "" && hitsOf[id] == 1
		mu.Unlock()
		if fail {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "ok")
	}})
	e.webhook(rc.URL)

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, intake := tp.Tracer("caddy").Start(context.Background(), "intake")
	var provider traces.Provider
	provider.Remember(intake) // (while it records)
	intake.End()
	stored := traces.Format(intake.SpanContext())
	// (ended: only the delivery spans count from here)
	base := len(rec.Ended())

	cfg := e.config(rc)
	cfg.Traces = &provider
	d, _ := e.start(cfg)

	// first the hand-off (a webhook with due deliveries waiting takes none)
	n := reserve(t, d, 1)
	handed, res := e.storeTraced(stored, store.Claim{Instance: d.InstanceID(), Lease: d.Lease(), Max: n})
	mu.Lock()
	handedID = handed.String()
	mu.Unlock()
	d.Deliver(n, res.Claimed, res.Queued > 0)
	if len(res.Claimed) != 1 {
		t.Fatalf("hand-off %+v", res)
	}
	queued, _ := e.storeTraced(stored, store.Claim{})
	plain, _ := e.storeTraced("", store.Claim{})

	for _, id := range []uuid.UUID{queued, plain, handed} {
		testenv.Eventually(t, patience, e.statusIs(id, "delivered"), "delivered")
	}
	// 2 attempts of the queued one and 1 of the handed-off one, a claim span each
	testenv.Eventually(t, patience, func() bool { return len(rec.Ended())-base == 6 }, "six delivery spans")

	spans := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	claims := map[string]int{}
	for _, s := range rec.Ended()[base:] {
		if s.Parent().SpanID() != intake.SpanContext().SpanID() || s.SpanContext().TraceID() != intake.SpanContext().TraceID() {
			t.Fatalf("span %s is not a child of the stored context", s.Name())
		}
		switch s.Name() {
		case attemptSpan:
			spans[s.SpanContext().SpanID()] = s
		case claimSpan:
			claims[spanAttr(s, attrEvent).AsString()]++
			if s.EndTime().Before(s.StartTime()) {
				t.Errorf("claim span ends before it starts")
			}
		default:
			t.Fatalf("unexpected span %s", s.Name())
		}
	}
	if claims[queued.String()] != 2 || claims[handed.String()] != 1 {
		t.Fatalf("claim spans by event %v: want 2 of the queued event, 1 of the handed-off one", claims)
	}
	byEvent := map[string][]sdktrace.ReadOnlySpan{}
	for _, h := range rc.Deliveries() {
		id := h.Header.Get("webhook-id")
		tpHeader := h.Header.Get(traces.Header)
		if id == plain.String() {
			if tpHeader != "" {
				t.Fatalf("untraced event delivered with traceparent %q", tpHeader)
			}
			continue
		}
		sc := traces.Parse(tpHeader)
		s, ok := spans[sc.SpanID()]
		if !sc.IsValid() || !ok || sc.TraceID() != intake.SpanContext().TraceID() {
			t.Fatalf("delivery of %s carries traceparent %q: not an attempt span of the stored trace", id, tpHeader)
		}
		if spanAttr(s, attrEvent).AsString() != id || spanAttr(s, attrWebhook).AsString() == "" || spanAttr(s, attrDelivery).AsString() == "" {
			t.Fatalf("attempt span attributes %v", s.Attributes())
		}
		byEvent[id] = append(byEvent[id], s)
	}
	q := byEvent[queued.String()]
	if len(q) != 2 || len(byEvent[handed.String()]) != 1 {
		t.Fatalf("attempt spans by event %v", byEvent)
	}
	if spanAttr(q[0], attrAttempt).AsInt64() != 1 || spanAttr(q[0], attrStatus).AsInt64() != 500 || q[0].Status().Code != codes.Error ||
		q[0].Status().Description != "http_500" {
		t.Fatalf("failed attempt span: attributes %v, status %+v", q[0].Attributes(), q[0].Status())
	}
	if spanAttr(q[1], attrAttempt).AsInt64() != 2 || spanAttr(q[1], attrStatus).AsInt64() != 200 || q[1].Status().Code == codes.Error {
		t.Fatalf("delivered attempt span: attributes %v, status %+v", q[1].Attributes(), q[1].Status())
	}
	if q[0].SpanKind() != trace.SpanKindClient {
		t.Fatalf("attempt span kind %v", q[0].SpanKind())
	}
}

// TestTracedWithoutProvider: a dispatcher that has no provider (no traced request seen by its
// process) still carries the event's stored traceparent to the receiver, and records nothing.
func TestTracedWithoutProvider(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	e.webhook(rc.URL)
	const stored = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	id, _ := e.storeTraced(stored, store.Claim{})
	e.run(e.config(rc))
	testenv.Eventually(t, patience, e.statusIs(id, "delivered"), "delivered")
	if got := rc.Deliveries()[0].Header.Get(traces.Header); got != stored {
		t.Fatalf("traceparent %q, want the stored %q", got, stored)
	}
}

// BenchmarkAttempt: one attempt (the POST to a local receiver) with tracing off (an event
// stored without a traceparent: the default), traced without a provider (the header only),
// and traced with a provider (claim and attempt spans, no exporter). Its figures are in
// bench/README.md, "Current results" and "Figures behind the defaults (relay admission)".
func BenchmarkAttempt(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the body is drained for the connection's reuse only
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/unused") // never connected
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	_, intake := tp.Tracer("caddy").Start(context.Background(), "intake")
	var provider traces.Provider
	provider.Remember(intake)
	secret := store.NewWebhookSecret()
	secrets := func(context.Context, uuid.UUID) (string, error) { return secret, nil }
	j := job{ID: uuid.New(), EventID: uuid.New(), WebhookID: uuid.New(), OrgID: uuid.New(), Attempt: 1, URL: srv.URL,
		Payload: []byte(`{"id":"x","type":"messages","data":{"message":{"id":"wamid.1","text":{"body":"hi"}}}}`)}
	for _, c := range []struct {
		name        string
		traceparent string
		traces      *traces.Provider
	}{
		{"off", "", nil},
		{"traced-no-provider", traces.Format(intake.SpanContext()), nil},
		{"traced", traces.Format(intake.SpanContext()), &provider},
	} {
		b.Run(c.name, func(b *testing.B) {
			d, err := New(pool, secrets, Config{AllowPrivateTargets: true, Traces: c.traces}, zap.NewNop())
			if err != nil {
				b.Fatal(err)
			}
			j := j
			j.Traceparent = c.traceparent
			claimed := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				if r := d.attempt(context.Background(), j, claimed); !r.ok {
					b.Fatalf("attempt: %+v", r)
				}
			}
		})
	}
}
