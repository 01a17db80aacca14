// Package traces carries W3C trace context through wabarelay's own work (DESIGN §5b
// "Tracing"): the intake of an upstream post, and the claims and attempts of its deliveries.
//
// wabarelay makes no exporter of its own. With Caddy's `tracing` directive on a route, Caddy
// wraps the route's handlers in a server span of its one process-wide TracerProvider (its
// exporter configured by the OTEL_* environment): spans made inside such a request come from
// that span's provider (Child), and work done later, outside of any request (a delivery
// attempt), uses the provider a Provider remembered from a traced request (Continue). Without
// the directive there is no recording span in any request and nothing to remember: the
// helpers return at their first test, allocating nothing.
//
// A traceparent is stored with each event of a traced post (events.traceparent), so that its
// delivery attempts, on whichever instance and however much later, continue the trace.
package traces

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Scope is the instrumentation scope (tracer name) of wabarelay's spans.
const Scope = "github.com/wabarelay/wabarelay"

// Header is the W3C trace context header that carries a traceparent.
const Header = "traceparent"

// w3c is the W3C trace context format (traceparent and tracestate).
var w3c propagation.TraceContext

// carrier is a propagation.TextMapCarrier holding one traceparent value.
type carrier struct{ traceparent string }

func (c *carrier) Get(key string) string {
	if key == Header {
		return c.traceparent
	}
	return ""
}

func (c *carrier) Set(key, value string) {
	if key == Header {
		c.traceparent = value
	}
}

func (c *carrier) Keys() []string { return []string{Header} }

// Parse returns the remote span context the W3C traceparent tp names. It is invalid
// (IsValid false) when tp is empty or not a traceparent.
func Parse(tp string) trace.SpanContext {
	if tp == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), &carrier{traceparent: tp}))
}

// Format returns the W3C traceparent of sc ("00-<trace id>-<span id>-<flags>"), or "" when sc
// is invalid.
func Format(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	var c carrier
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), &c)
	return c.traceparent
}

// Child starts a span named name as a child of the recording span in ctx, from that span's
// TracerProvider (Caddy's, under its `tracing` directive), and returns it with its context.
// When ctx holds no recording span (tracing off, or the trace not sampled) it returns ctx and
// a nil span: nothing was started, nothing was allocated.
func Child(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil
	}
	return parent.TracerProvider().Tracer(Scope).Start(ctx, name, opts...)
}

// Continue starts a span named name as a child of the remote span context parent (an event's
// stored traceparent) with tracer t and returns it. With a nil t (no traced request seen yet
// by this process) it returns a non-recording span carrying parent itself: the work still
// propagates the trace (Format of its context is parent's traceparent), it records nothing.
func Continue(t trace.Tracer, parent trace.SpanContext, name string, opts ...trace.SpanStartOption) trace.Span {
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), parent)
	if t == nil {
		return trace.SpanFromContext(ctx)
	}
	_, span := t.Start(ctx, name, opts...)
	return span
}

// Provider remembers the TracerProvider of the traced requests it is shown, so that work done
// later outside of any request exports its spans through the same exporter: Caddy keeps one
// TracerProvider per process for every `tracing` directive. The zero value is ready and holds
// none; a nil *Provider holds none either. Safe for concurrent use.
type Provider struct {
	cur atomic.Pointer[remembered]
}

type remembered struct {
	tp     trace.TracerProvider
	tracer trace.Tracer
}

// Remember keeps span's TracerProvider when span is recording (a nil span is not). It costs
// one atomic load when the provider is the one already kept.
func (p *Provider) Remember(span trace.Span) {
	if p == nil || span == nil || !span.IsRecording() {
		return
	}
	tp := span.TracerProvider()
	if cur := p.cur.Load(); cur != nil && same(cur.tp, tp) {
		return
	}
	p.cur.Store(&remembered{tp: tp, tracer: tp.Tracer(Scope)})
}

// same reports whether a and b are the same provider (false for a type that cannot be compared:
// it is then remembered again).
func same(a, b trace.TracerProvider) (eq bool) {
	defer func() {
		if recover() != nil {
			eq = false
		}
	}()
	return a == b
}

// Tracer returns the tracer of the remembered provider, or nil when none was remembered.
func (p *Provider) Tracer() trace.Tracer {
	if p == nil {
		return nil
	}
	if cur := p.cur.Load(); cur != nil {
		return cur.tracer
	}
	return nil
}
