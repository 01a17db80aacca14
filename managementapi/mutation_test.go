package managementapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/managementapi"
)

// TestMutatedRequests: 2,000 seeded mutations of valid management requests — bodies with NUL
// characters, invalid UTF-8, wrong types, truncation, random bytes, huge strings; mutated paths,
// query strings and keys — then huge strings in every field (managementapi.HugeBodies) —
// served over real connections: no 5xx, no dropped connection, every
// refusal a JSON {"error": ...}, and what was stored before is intact afterwards.
func TestMutatedRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := httptest.NewServer(e.handler)
	defer srv.Close()
	ch := e.createChannel(e.keyA, "keep me")
	cid := ch.ID.String()
	wh := e.createWebhook(e.keyA, `{"name":"keep","url":"https://crm.example.com/h","events":["messages"]}`)
	before := func() (string, string) {
		c := e.do("GET", "/channels/"+cid, e.keyA, "")
		w := e.do("GET", "/webhooks/"+wh.ID, e.keyA, "")
		return string(c.body), string(w.body)
	}
	c0, w0 := before()

	valid := []struct{ method, path, body string }{
		{"POST", "/channels", `{"name":"Support line"}`},
		{"POST", "/webhooks", `{"name":"CRM","url":"https://crm.example.com/hooks","events":["messages","message_status"],"channel_ids":["` + cid + `"]}`},
		{"PATCH", "/webhooks/" + wh.ID, `{"status":"paused"}`},
		{"POST", "/webhooks/" + wh.ID + "/deliveries/recover", `{"since":"2026-11-01T00:00:00Z"}`},
		{"POST", "/webhooks/" + wh.ID + "/replay", `{"since":"2026-11-01T00:00:00Z","until":"2026-11-02T00:00:00Z","types":["messages"],"channel_ids":["` + cid + `"]}`},
		{"GET", "/webhooks/" + wh.ID + "/deliveries?status=failed&limit=10", ""},
		{"POST", "/webhooks/" + wh.ID + "/channels/" + cid, ""},
		{"GET", "/channels/" + cid, ""},
		{"DELETE", "/webhooks/" + wh.ID + "/channels/" + cid, ""},
		{"POST", "/api_keys", `{"name":"CI","expires_in":"720h"}`},
		{"GET", "/api_keys", ""},
		// (the kept channel is pending: a valid broadcast is refused 409, so nothing is created)
		{"POST", "/channels/" + cid + "/broadcasts", `{"name":"Nov","template":{"name":"offer","language":{"code":"en"},"components":[{"type":"body"}]},"recipients":[{"to":"+1 555-0100","components":[]},{"to":"15550101"}],"start_at":"2030-01-01T00:00:00Z","rate_per_minute":10}`},
		{"GET", "/broadcasts/" + wh.ID + "/recipients?status=failed&limit=10&after=3", ""},
	}
	rng := rand.New(rand.NewSource(42))
	inserts := []string{`\u0000`, "\x00", "\xff", "\xc3\x28", `\ud800`, `"`, `\`, "\n", `{}`, `[]`, `null`, `1e999`, strings.Repeat("x", 5000),
		strings.Repeat("x", 256<<10), strings.Repeat("x", 1<<20)}
	mutate := func(s string) string {
		if s == "" {
			s = `{"name":"x"}`
		}
		b := []byte(s)
		switch rng.Intn(7) {
		case 0:
			b[rng.Intn(len(b))] ^= byte(1 + rng.Intn(255))
		case 1: // inside a string value
			if i := bytes.IndexByte(b[1:], '"'); i >= 0 {
				j := i + 2
				b = append(b[:j:j], append([]byte(inserts[rng.Intn(len(inserts))]), b[j:]...)...)
			}
		case 2:
			b = b[:rng.Intn(len(b))]
		case 3: // a value of another type
			var m map[string]any
			if json.Unmarshal(b, &m) == nil {
				for k := range m {
					m[k] = []any{1, true, nil, "\x00", map[string]any{}, []any{nil}, 1.5, strings.Repeat("é", 300)}[rng.Intn(8)]
					break
				}
				b, _ = json.Marshal(m)
			}
		case 4:
			i := rng.Intn(len(b))
			junk := make([]byte, 1+rng.Intn(6))
			rng.Read(junk)
			b = append(b[:i:i], append(junk, b[i:]...)...)
		case 5:
			b = []byte(strings.Repeat(`{"a":`, 2000))
		default:
			b = bytes.Replace(b, []byte(`"`), []byte(`"`+inserts[rng.Intn(len(inserts))]), 1)
		}
		return string(b)
	}
	mutatePath := func(p string) string {
		switch rng.Intn(5) {
		case 0:
			return p + "%00"
		case 1:
			return strings.Replace(p, "-", "%ff", 1)
		case 2:
			return p + "?limit=%00&status=\x7f&cursor=" + strings.Repeat("a", 40)
		case 3:
			return p + "/" + fmt.Sprint(rng.Intn(100))
		default:
			return strings.ToUpper(p)
		}
	}
	client := srv.Client()
	send := func(method, path, body, key, desc string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			return // not something a client can send
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Api-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: connection lost: %v", desc, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: answer cut off: %v", desc, err)
		}
		if resp.StatusCode >= 500 {
			t.Fatalf("%s: %d %s", desc, resp.StatusCode, got)
		}
		if resp.StatusCode >= 400 {
			var m map[string]any
			if json.Unmarshal(got, &m) != nil || len(m) != 1 || m["error"] == nil {
				t.Fatalf("%s: %d is not a JSON error: %s", desc, resp.StatusCode, got)
			}
		}
		// the kept webhook stays active and assigned for the comparison below
		if resp.StatusCode < 300 && strings.Contains(path, wh.ID) && method != "GET" {
			e.do("PATCH", "/webhooks/"+wh.ID, e.keyA, `{"status":"active"}`)
			e.do("POST", "/webhooks/"+wh.ID+"/channels/"+cid, e.keyA, "")
		}
	}
	short := func(s string) string {
		if len(s) > 200 {
			return fmt.Sprintf("%s…(%d bytes)", s[:200], len(s))
		}
		return s
	}
	for i := 0; i < 2000; i++ {
		v := valid[rng.Intn(len(valid))]
		method, path, body := v.method, v.path, v.body
		switch rng.Intn(4) {
		case 0:
			path = mutatePath(path)
		case 1:
			// (not DELETE: deleting the kept resources is a valid request)
			method = []string{"GET", "PUT", "PATCH", "POST", "OPTIONS"}[rng.Intn(5)]
		default:
			body = mutate(body)
		}
		key := e.keyA
		if rng.Intn(20) == 0 {
			key = []string{e.keyB, "crt_pk_" + strings.Repeat("0", 44), "", "crt_pk_\u00e9"}[rng.Intn(4)]
		}
		send(method, path, body, key, fmt.Sprintf("#%d %s %s %q", i, method, path, short(body)))
	}
	// huge strings in every field of every request with a body: 1 MiB values, values just
	// short of the body limit, 256 KiB field names
	for _, v := range valid {
		if v.body == "" {
			continue
		}
		for i, body := range managementapi.HugeBodies() {
			send(v.method, v.path, body, e.keyA, fmt.Sprintf("huge #%d %s %s %q", i, v.method, v.path, short(body)))
		}
	}
	if c1, w1 := before(); c1 != c0 || w1 != w0 {
		t.Fatalf("stored data changed:\n%s\n%s\nwas\n%s\n%s", c1, w1, c0, w0)
	}
}
