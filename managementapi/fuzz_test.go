package managementapi

import (
	"encoding/json"
	"flag"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// FuzzRequestBody: whatever the body, reading and validating it never panics, every refusal is
// a 4xx, and whatever is accepted is valid UTF-8 text without NUL characters (what Postgres's
// text types take).
func FuzzRequestBody(f *testing.F) {
	for _, s := range []string{
		`{"name":"CRM","url":"https://crm.example.com/h","events":["messages","message_status"]}`,
		`{"name":"a\u0000b","url":"https://x.example","events":["messages"]}`,
		"{\"name\":\"a\xffb\",\"url\":\"https://x.example\",\"events\":[\"messages\"]}",
		`{"name":"x","url":"https://x.example/\u0000","events":["messages"],"channel_ids":["\u0000"]}`,
		`{"status":"paused"}`, `{"status":"\u0000"}`, `{"name":"k","expires_in":"720h"}`, `{"expires_in":"-1h\u0000"}`, `{"since":"2026-11-25T00:00:00Z"}`,
		`{"name":"\ud800"}`, `{"name":null,"events":[null]}`, `[]`, `{`, ``, `{"name":1}{}`,
		`{"name":"b","template":{"name":"t","language":{"code":"en"},"components":[{"type":"body","x":1.5e3}]},"recipients":[{"to":"+1 (555) 010-0100","components":[]},{"to":"15550100100"}],"start_at":"2030-01-01T00:00:00Z","rate_per_minute":10}`,
		`{"name":"b","template":{"name":"t","language":{"code":"en"},"components":["\ud800","\u0000"]},"recipients":[{"to":"15550100","components":[{"\u0000":1}]}]}`,
		`{"name":"b","template":{"name":"t","language":{"code":"en"}},"recipients":[{"to":"15550100"},{"to":7}],"rate_per_minute":1e999}`,
	} {
		f.Add([]byte(s))
	}
	// The huge bodies run with the seed corpus (go test). Under -fuzz they are left out: the
	// engine first runs every seed for coverage, about a second per huge seed on a busy machine,
	// which took all of a 20s -fuzztime before any new input was tried.
	if fl := flag.Lookup("test.fuzz"); fl == nil || fl.Value.String() == "" {
		for _, s := range hugeBodies() {
			f.Add([]byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "/webhooks", strings.NewReader(string(body)))
		r.Header.Set("Content-Type", "application/json")
		o, e := readObject(httptest.NewRecorder(), r)
		if e != nil {
			if e.Status < 400 || e.Status >= 500 {
				t.Fatalf("status %d for %q", e.Status, body)
			}
			return
		}
		text := func(what, s string) {
			if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
				t.Fatalf("%s %q accepted from %q", what, s, body)
			}
		}
		check := func(e *Error) bool {
			if e != nil && (e.Status < 400 || e.Status >= 500) {
				t.Fatalf("status %d for %q", e.Status, body)
			}
			return e == nil
		}
		if in, e := parseWebhookInput(o); check(e) {
			text("name", in.Name)
			text("url", in.URL)
			for _, ev := range in.Events {
				text("event", ev)
			}
		}
		if name, e := requiredName(o); check(e) {
			text("name", name)
		}
		if in, e := parseAPIKeyInput(o); check(e) {
			text("name", in.name)
			if in.expiresIn < 0 {
				t.Fatalf("expires_in %v accepted from %q", in.expiresIn, body)
			}
		}
		if s, e := parseStatus(o); check(e) {
			text("status", s)
		}
		if s, _, e := o.str("since"); check(e) {
			text("since", s)
		}
		in, pending := broadcastInput(o)
		if nb, e := new(Service).parseBroadcast(in, pending, time.Now()); check(e) {
			text("name", nb.Name)
			jsonb := func(what string, raw []byte) {
				if raw != nil && (!json.Valid(raw) || !utf8.Valid(raw) || jsonbRefuses.Match(raw)) {
					t.Fatalf("%s %s accepted from %q", what, raw, body)
				}
			}
			jsonb("template", nb.Template)
			for _, r := range nb.Recipients {
				if _, ok := phoneNumber(r.To); !ok || strings.Trim(r.To, "0123456789") != "" {
					t.Fatalf("recipient %q accepted from %q", r.To, body)
				}
				jsonb("components", r.Components)
			}
			if nb.RatePerMinute < 1 || nb.RatePerMinute > DefaultRelayLimitPerMinute || len(nb.Recipients) == 0 {
				t.Fatalf("%+v accepted from %q", nb, body)
			}
		}
	})
}

// jsonbRefuses matches the escapes Postgres's jsonb refuses in a JSON text: NUL and a surrogate
// (an escaped backslash before them excepted).
var jsonbRefuses = regexp.MustCompile(`(?:^|[^\\])(?:\\\\)*\\u(?:0000|[dD][89a-fA-F])`)

// hugeFields are the body fields the API reads, with a valid value each.
var hugeFields = map[string]string{
	"name": `"CRM"`, "url": `"https://crm.example.com/h"`, "events": `["messages"]`,
	"channel_ids": `["0193a5d8-5c6d-7e8f-9a0b-1c2d3e4f5a6b"]`, "status": `"paused"`,
	"expires_in": `"720h"`, "since": `"2026-11-25T00:00:00Z"`,
}

// hugeBodies returns bodies with a huge string in each field in turn: a 1 MiB value (the body is
// then over MaxBodyBytes), a value just short of the body limit (as a string, and as the element
// of an array), and a 256 KiB field name next to the valid fields.
func hugeBodies() []string {
	fields := slices.Sorted(maps.Keys(hugeFields))
	var out []string
	for _, field := range fields {
		rest := ""
		for _, f := range fields {
			if f != field {
				rest += `,"` + f + `":` + hugeFields[f]
			}
		}
		under := MaxBodyBytes - len(rest) - len(field) - 16
		out = append(out,
			`{"`+field+`":"`+strings.Repeat("x", 1<<20)+`"`+rest+`}`,
			`{"`+field+`":"`+strings.Repeat("x", under)+`"`+rest+`}`,
			`{"`+field+`":["`+strings.Repeat("é", under/2-2)+`"]`+rest+`}`,
			`{"`+strings.Repeat(field, (256<<10)/len(field))+`":"x","`+field+`":`+hugeFields[field]+rest+`}`,
		)
	}
	return out
}

// TestHugeBodies: the huge bodies are what they claim: the 1 MiB values are over the body limit
// (413), the others are read and reach validation.
func TestHugeBodies(t *testing.T) {
	t.Parallel()
	for i, body := range hugeBodies() {
		r := httptest.NewRequest("POST", "/webhooks", strings.NewReader(body))
		_, e := readObject(httptest.NewRecorder(), r)
		if over := len(body) > MaxBodyBytes; (e == errTooLarge) != over || (!over && e != nil) {
			t.Errorf("body %d (%d bytes): %v", i, len(body), e)
		}
	}
}

// TestTextFieldsRefuseNUL: strings with a NUL character or invalid UTF-8 are refused with the
// documented 422, never passed on to Postgres.
func TestTextFieldsRefuseNUL(t *testing.T) {
	for body, field := range map[string]string{
		`{"name":"a\u0000b"}`:   "name",
		"{\"name\":\"a\x00b\"}": "", // a raw control character is not JSON at all
		"{\"name\":\"a\xffb\"}": "name",
		`{"name":"ok","url":"https://x.example","events":["messages\u0000"]}`:                    "events",
		`{"name":"ok","url":"https://x.example","events":["messages"],"channel_ids":["\u0000"]}`: "channel_ids",
		`{"status":"paused\u0000"}`: "status",
	} {
		r := httptest.NewRequest("POST", "/webhooks", strings.NewReader(body))
		o, e := readObject(httptest.NewRecorder(), r)
		if field == "" {
			if e == nil || e.Status != http.StatusBadRequest {
				t.Errorf("%q: %v, want 400", body, e)
			}
			continue
		}
		if e != nil {
			t.Fatalf("%q: %v", body, e)
		}
		var got *Error
		switch field {
		case "status":
			_, got = parseStatus(o)
		case "name":
			_, got = requiredName(o)
		default:
			_, got = parseWebhookInput(o)
		}
		want := `"` + field + `" must be valid UTF-8 text without NUL characters`
		if got == nil || got.Status != http.StatusUnprocessableEntity || got.Message != want {
			t.Errorf("%q: %v, want 422 %s", body, got, want)
		}
	}
}
