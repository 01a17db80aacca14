package dispatcher

import (
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/wabarelay/wabarelay/traces"
)

// The spans of a traced delivery (DESIGN §5b "Tracing"), both children of the span that stored
// its event ("wabarelay.inbound.store").
const (
	// claimSpan runs from the claim that took the delivery (the claim statement, or the inbound
	// transaction for a delivery handed off) to the start of its attempt.
	claimSpan = "wabarelay.delivery.claim"
	// attemptSpan is the attempt's POST, until its answer is read.
	attemptSpan = "wabarelay.delivery.attempt"
)

// Attribute keys of the delivery spans.
const (
	attrWebhook  = attribute.Key("wabarelay.webhook.id")
	attrDelivery = attribute.Key("wabarelay.delivery.id")
	attrEvent    = attribute.Key("wabarelay.event.id")
	attrAttempt  = attribute.Key("wabarelay.delivery.attempt")
	attrClaimSeq = attribute.Key("wabarelay.delivery.claim_seq")
	attrProbe    = attribute.Key("wabarelay.delivery.probe")
	attrStatus   = attribute.Key("http.response.status_code")
)

// traceAttempt continues the trace of j's event (its stored traceparent) for the attempt req
// starting at started: the claim span (claimed to started, ended here) and the attempt span,
// returned for endAttempt, whose traceparent req carries. Without a provider remembered
// (Config.Traces) no span records, and req carries the event's traceparent itself. It returns
// nil, and req carries none, when the stored traceparent does not parse.
func (d *Dispatcher) traceAttempt(req *http.Request, j job, claimed, started time.Time) trace.Span {
	parent := traces.Parse(j.Traceparent)
	if !parent.IsValid() {
		return nil
	}
	t := d.cfg.Traces.Tracer()
	ids := trace.WithAttributes(attrWebhook.String(j.WebhookID.String()), attrDelivery.String(j.ID.String()),
		attrEvent.String(j.EventID.String()), attrAttempt.Int(j.Attempt))
	if t != nil {
		if claimed.IsZero() || claimed.After(started) {
			claimed = started
		}
		claim := traces.Continue(t, parent, claimSpan, trace.WithTimestamp(claimed), ids,
			trace.WithAttributes(attrClaimSeq.Int(j.Claim), attrProbe.Bool(j.Probe)))
		claim.End(trace.WithTimestamp(started))
	}
	span := traces.Continue(t, parent, attemptSpan, trace.WithTimestamp(started), trace.WithSpanKind(trace.SpanKindClient), ids)
	req.Header[traces.Header] = []string{traces.Format(span.SpanContext())}
	return span
}

// endAttempt ends an attempt span with r's outcome: the receiver's status, and an error
// status (the delivery log's class of failure, never the full error) unless it succeeded.
func endAttempt(span trace.Span, r *result) {
	if r.statusCode != 0 {
		span.SetAttributes(attrStatus.Int(r.statusCode))
	}
	if !r.ok {
		span.SetStatus(codes.Error, r.errMsg)
	}
	span.End()
}
