package relay

import (
	"bytes"
	"encoding/json"
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
