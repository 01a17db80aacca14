package traces

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const sample = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func TestParseFormat(t *testing.T) {
	sc := Parse(sample)
	if !sc.IsValid() || !sc.IsRemote() || !sc.IsSampled() {
		t.Fatalf("Parse(%q) = %+v: want a valid, remote, sampled context", sample, sc)
	}
	if got := sc.TraceID().String(); got != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("trace id %s", got)
	}
	if got := Format(sc); got != sample {
		t.Fatalf("Format(Parse(x)) = %q, want %q", got, sample)
	}
	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"} {
		if sc := Parse(bad); sc.IsValid() {
			t.Errorf("Parse(%q) is valid", bad)
		}
	}
	if got := Format(trace.SpanContext{}); got != "" {
		t.Fatalf("Format(invalid) = %q", got)
	}
}

// TestOffCostsNothing: without a recording span in the context (tracing off) Child starts
// nothing and allocates nothing; a nil or empty Provider has no tracer.
func TestOffCostsNothing(t *testing.T) {
	ctx := context.Background()
	if c, span := Child(ctx, "x"); span != nil || c != ctx {
		t.Fatal("Child without a recording span started one")
	}
	if n := testing.AllocsPerRun(100, func() { Child(ctx, "x") }); n != 0 {
		t.Fatalf("Child without a recording span: %v allocations", n)
	}
	// a valid but unsampled parent is not recording either
	unsampled := trace.ContextWithRemoteSpanContext(ctx, Parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"))
	if _, span := Child(unsampled, "x"); span != nil {
		t.Fatal("Child of a non-recording span started one")
	}
	var p *Provider
	p.Remember(nil)
	if p.Tracer() != nil || new(Provider).Tracer() != nil {
		t.Fatal("a nil or empty Provider has a tracer")
	}
}

func TestChildContinueProvider(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, server := tp.Tracer("caddy").Start(context.Background(), "server")

	var p Provider
	p.Remember(server)
	if p.Tracer() == nil {
		t.Fatal("Provider did not remember a recording span's provider")
	}
	first := p.cur.Load()
	p.Remember(server)
	if p.cur.Load() != first {
		t.Fatal("the same provider was remembered again")
	}

	_, child := Child(ctx, "wabarelay.inbound.store")
	if child == nil || !child.IsRecording() {
		t.Fatal("Child of a recording span started none")
	}
	child.End()
	stored := Format(child.SpanContext())

	// later, outside the request: continue from the stored traceparent
	attempt := Continue(p.Tracer(), Parse(stored), "wabarelay.delivery.attempt")
	attempt.End()
	server.End()
	if got := attempt.SpanContext().TraceID(); got != server.SpanContext().TraceID() {
		t.Fatalf("attempt in trace %s, want %s", got, server.SpanContext().TraceID())
	}
	ended := rec.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans ended, want 3", len(ended))
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range ended {
		byName[s.Name()] = s
	}
	if byName["wabarelay.inbound.store"].Parent().SpanID() != server.SpanContext().SpanID() {
		t.Error("store span not a child of the server span")
	}
	if byName["wabarelay.delivery.attempt"].Parent().SpanID() != child.SpanContext().SpanID() {
		t.Error("attempt span not a child of the store span")
	}
	if byName["wabarelay.inbound.store"].InstrumentationScope().Name != Scope {
		t.Error("store span not in wabarelay's scope")
	}

	// without a tracer: no span, the parent's traceparent carried on
	if got := Format(Continue(nil, Parse(stored), "x").SpanContext()); got != stored {
		t.Fatalf("Continue without a tracer carries %q, want %q", got, stored)
	}
}
