package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/store"
)

// FuzzScope: whatever the path, the relay's path checks never panic, and a channel reaches
// only its own number, its business account and its objects — never subscribed_apps, never a
// path with dot or empty segments.
func FuzzScope(f *testing.F) {
	for _, s := range []string{"/1001/messages", "/v26.0/2001/message_templates", "/t1", "/1002/messages",
		"/2001/subscribed_apps", "/1001/../1002/messages", "//1001", "/1001/", "/", "", "/v1/v2/1001", `/1001\x`} {
		f.Add(s, "")
	}
	f.Add("/1001/messages", "/1001%2Fmessages")
	f.Add("/1001/"+strings.Repeat("m", 1<<20), "")                                // a 1 MiB segment
	f.Add("/"+strings.Repeat("1001/", 64<<10), "/"+strings.Repeat("%2F", 64<<10)) // 256 KiB of segments
	ch := &store.RelayChannel{PhoneNumberID: "1001", WabaID: "2001", Objects: store.NewObjectSet("t1")}
	f.Fuzz(func(t *testing.T, path, raw string) {
		if CheckPath(path, raw) != nil {
			return
		}
		segs := strings.Split(path[1:], "/")
		for _, s := range segs {
			if s == "" || s == "." || s == ".." {
				t.Fatalf("CheckPath admitted %q", path)
			}
		}
		up := UpstreamPath(path)
		if !InScope(ch, up) {
			return
		}
		first, rest, _ := strings.Cut(strings.TrimPrefix(up, "/"), "/")
		if first != "1001" && first != "2001" && first != "t1" {
			t.Fatalf("InScope admitted %q (first segment %q)", path, first)
		}
		if next, _, _ := strings.Cut(rest, "/"); next == "subscribed_apps" {
			t.Fatalf("InScope admitted %q", path)
		}
	})
}

// FuzzRewriteLinks: rewriting an answer never panics, never lets the upstream token through,
// and keeps JSON answers JSON.
func FuzzRewriteLinks(f *testing.F) {
	f.Add([]byte(`{"data":[{"id":"1"}],"paging":{"next":"https://graph.facebook.com/v26.0/9/message_templates?access_token=EAAGsecret&after=A"}}`))
	f.Add([]byte(`{"paging":{"next":1,"previous":"::"}}`))
	f.Add([]byte(`{"error":{"message":"EAAGsecret","code":190}}`))
	f.Add([]byte(`not json EAAGsecret`))
	for _, in := range hugeSeeds() {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out := RewriteLinks(body, "https://relay.example.com/upstream-proxy", "EAAGsecret")
		if bytes.Contains(out, []byte("EAAGsecret")) {
			t.Fatalf("token left in %q", out)
		}
		if json.Valid(body) && !json.Valid(out) {
			t.Fatalf("JSON answer no longer JSON: %q -> %q", body, out)
		}
		_ = TokenDead(400, body)
		_, _ = Handed(&store.RelayChannel{PhoneNumberID: "1", WabaID: "2"}, "GET", "/2/message_templates", 200, body)
	})
}

// hugeSeeds are seed inputs with huge strings: 1 MiB string values, 256 KiB keys, a paging
// link of 1 MiB carrying the token, and the token at the end of a 1 MiB value.
func hugeSeeds() []string {
	mib, key := strings.Repeat("x", 1<<20), strings.Repeat("k", 256<<10)
	return []string{
		`{"idempotency_key":"` + mib + `","to":"1"}`,
		`{"` + key + `":"v","idempotency_key":"k"}`,
		`{"` + key + `":"` + mib + `"}`,
		`{"data":[{"id":"` + mib + `"}],"paging":{"next":"https://graph.facebook.com/v26.0/9/x?access_token=EAAGsecret&after=` + mib + `"}}`,
		`{"error":{"message":"` + mib + `EAAGsecret","code":190}}`,
		`["` + mib + `"]`,
	}
}

// FuzzRedactor: whatever the bytes, the secret and the way they are split into writes, the
// redactor's output has the input's length, never holds the secret and equals the input with
// every occurrence masked; it never holds back len(secret) bytes or more.
func FuzzRedactor(f *testing.F) {
	f.Add([]byte("aaab"), "aab", []byte{1, 1, 1, 1})
	f.Add([]byte(`{"next":"https://g/x?access_token=EAAGsecret&after=A"}`), "EAAGsecret", []byte{30, 3, 0, 7})
	f.Add([]byte("EAAGsecretEAAGsecretEAAGsecre"), "EAAGsecret", []byte{9, 1, 10})
	f.Add([]byte("abababab"), "abab", []byte{3, 0, 3})
	f.Add([]byte("a*b*a*b"), "*a*", []byte{2, 2})
	f.Add([]byte(strings.Repeat("x", 1<<20)+"EAAGsecret"), "EAAGsecret", []byte{255, 0, 250})
	f.Fuzz(func(t *testing.T, in []byte, secret string, splits []byte) {
		if secret == "" {
			return
		}
		var out bytes.Buffer
		var r redactor
		r.reset(&out, secret)
		rest := in
		for _, n := range splits {
			k := min(int(n), len(rest))
			if _, err := r.Write(rest[:k]); err != nil {
				if errors.Is(err, errUnredactable) { // a secret of every byte value
					return
				}
				t.Fatal(err)
			}
			if len(r.held) >= len(secret) {
				t.Fatalf("held back %d bytes of a %d-byte secret", len(r.held), len(secret))
			}
			rest = rest[k:]
		}
		if _, err := r.Write(rest); errors.Is(err, errUnredactable) {
			return
		}
		if err := r.flush(); err != nil {
			t.Fatal(err)
		}
		got := out.Bytes()
		if len(got) != len(in) || bytes.Contains(got, []byte(secret)) {
			t.Fatalf("redact(%q, %q) = %q", in, secret, got)
		}
		if w := want(string(in), secret); string(got) != w {
			t.Fatalf("redact(%q, %q) = %q, want %q", in, secret, got, w)
		}
	})
}
