package e2e

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/traces"
)

// otlpSpan is a span an OTLP collector received.
type otlpSpan struct {
	name, trace, id, parent string
	kind                    tracepb.Span_SpanKind
	attrs                   map[string]string
}

// otlpCollector is an in-process OTLP/HTTP trace collector (protobuf): it records every span
// exported to it.
type otlpCollector struct {
	url   string
	mu    sync.Mutex
	spans []otlpSpan
}

func newOTLPCollector(t *testing.T) *otlpCollector {
	c := &otlpCollector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		b, err := io.ReadAll(body)
		var req collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &req)
		}
		if err != nil {
			t.Errorf("otlp collector: %s %s: %v", r.Method, r.URL.Path, err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					attrs := map[string]string{}
					for _, kv := range s.Attributes {
						v := kv.Value.GetStringValue()
						if v == "" {
							v = fmt.Sprint(kv.Value.GetIntValue())
						}
						attrs[kv.Key] = v
					}
					c.spans = append(c.spans, otlpSpan{name: s.Name, trace: hex.EncodeToString(s.TraceId), id: hex.EncodeToString(s.SpanId),
						parent: hex.EncodeToString(s.ParentSpanId), kind: s.Kind, attrs: attrs})
				}
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	c.url = srv.URL + "/v1/traces"
	return c
}

// inTrace returns the spans received in the trace id (hex).
func (c *otlpCollector) inTrace(id string) []otlpSpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []otlpSpan
	for _, s := range c.spans {
		if s.trace == id {
			out = append(out, s)
		}
	}
	return out
}

// named returns the first span named name, and whether there is one.
func named(spans []otlpSpan, name string) (otlpSpan, bool) {
	for _, s := range spans {
		if s.name == name {
			return s, true
		}
	}
	return otlpSpan{}, false
}

// env is the environment that points Caddy's exporter at the collector, exporting often.
func (c *otlpCollector) env() []string {
	return []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" + c.url, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_SERVICE_NAME=wabarelay-test"}
}

// TestTracingThroughCaddy: with Caddy's `tracing` directive on the inbound and relay routes
// and its exporter pointed at an OTLP collector, one signed upstream post makes one trace
// holding Caddy's server span of the intake, the store span, and the delivery's claim and
// attempt spans, and the receiver gets a traceparent of that trace (the attempt span's); a
// relay call carrying a caller's traceparent reaches the upstream in the caller's trace.
func TestTracingThroughCaddy(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	col := newOTLPCollector(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	app := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, testenv.CAFile(t, rc.Certificate()))
	site := `handle_path ` + proxyPrefix + `/* {
		tracing
		wabarelay_proxy
	}
	handle /webhooks/upstream {
		tracing
		wabarelay_inbound
	}`
	origin := e.caddySite("", app, e.fake.URL(), site, col.env()...)
	ch := e.channel(true)
	_, secret := e.fix.Webhook(t, e.org, rc.URL+"/hook", &testenv.WebhookOpts{Name: "r"})
	rc.Verify(secret)

	// one signed post → one trace: intake (Caddy's server span) → store → claim, attempt
	if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, upstreamBatch(map[string][2][]string{pnid: {{"tr1"}, nil}})); status != 200 {
		t.Fatalf("inbound: %d %s", status, body)
	}
	hit := rc.WaitN(t, 1)[0]
	sc := traces.Parse(hit.Header.Get(traces.Header))
	if !sc.IsValid() {
		t.Fatalf("delivery without a valid traceparent: %q", hit.Header.Get(traces.Header))
	}
	traceID := sc.TraceID().String()
	var spans []otlpSpan
	testenv.Eventually(t, testenv.Patience, func() bool {
		spans = col.inTrace(traceID)
		_, a := named(spans, "wabarelay.delivery.attempt")
		_, c := named(spans, "wabarelay.delivery.claim")
		_, s := named(spans, "wabarelay.inbound.store")
		return a && c && s && len(spans) >= 4
	}, "the delivery's trace exported")
	store, _ := named(spans, "wabarelay.inbound.store")
	claim, _ := named(spans, "wabarelay.delivery.claim")
	attempt, _ := named(spans, "wabarelay.delivery.attempt")
	var server otlpSpan
	for _, s := range spans {
		if s.kind == tracepb.Span_SPAN_KIND_SERVER && s.id == store.parent {
			server = s
		}
	}
	if server.id == "" || server.parent != "" {
		t.Fatalf("trace %s: the store span's parent is not Caddy's root server span; spans %+v", traceID, spans)
	}
	if claim.parent != store.id || attempt.parent != store.id {
		t.Fatalf("claim (parent %s) and attempt (parent %s) spans are not children of the store span %s", claim.parent, attempt.parent, store.id)
	}
	if attempt.id != sc.SpanID().String() {
		t.Fatalf("the receiver's traceparent names span %s, not the attempt span %s", sc.SpanID(), attempt.id)
	}
	if attempt.attrs["http.response.status_code"] != "200" || attempt.attrs["wabarelay.delivery.attempt"] != "1" ||
		attempt.attrs["wabarelay.event.id"] != hit.Header.Get("webhook-id") || attempt.attrs["wabarelay.webhook.id"] == "" {
		t.Fatalf("attempt span attributes %v", attempt.attrs)
	}
	t.Logf("trace %s: %d spans (%s, %s, %s, %s)", traceID, len(spans), server.name, store.name, claim.name, attempt.name)

	// a relay call in the caller's trace: the upstream sees that trace
	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, _ := http.NewRequest("POST", origin+proxyPrefix+"/"+pnid+"/messages", strings.NewReader(textBody))
	req.Header.Set("Authorization", "Bearer "+ch.ChannelToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(traces.Header, "00-"+callerTrace+"-"+callerSpan+"-01")
	if r := do(t, req); r.status != 200 {
		t.Fatalf("relay: %d %s", r.status, r.body)
	}
	sends := e.fake.RequestsTo("POST", "/"+pnid+"/messages")
	if len(sends) != 1 {
		t.Fatalf("%d sends upstream", len(sends))
	}
	up := traces.Parse(sends[0].Header.Get(traces.Header))
	if up.TraceID().String() != callerTrace {
		t.Fatalf("upstream traceparent %q: not in the caller's trace %s", sends[0].Header.Get(traces.Header), callerTrace)
	}
	// it names Caddy's server span of the call, a child of the caller's span
	testenv.Eventually(t, testenv.Patience, func() bool {
		s, ok := named(col.inTrace(callerTrace), "handler")
		return ok && s.id == up.SpanID().String() && s.parent == callerSpan
	}, "Caddy's server span of the relay call, the caller's child, exported")
}
