package relay

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

func TestUpstreamPath(t *testing.T) {
	for in, want := range map[string]string{
		"/123/messages": "/123/messages", "123/messages": "/123/messages", "/v26.0/123/messages": "/123/messages",
		"/v3/x": "/x", "/": "/", "/vx/y": "/vx/y",
	} {
		if got := UpstreamPath(in); got != want {
			t.Errorf("UpstreamPath(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestIsVersionSegment: the hand-written check says what the regular expression it replaced
// says, on every segment built from the characters that matter (up to 5 of them), and
// UpstreamPath is unchanged for paths with extra, missing or doubled slashes.
func TestIsVersionSegment(t *testing.T) {
	re := regexp.MustCompile(`^v\d+(\.\d+)?$`)
	alphabet := []string{"v", "V", "0", "9", ".", "a", "/", "\u0660"}
	var walk func(seg string, depth int)
	walk = func(seg string, depth int) {
		if got, want := isVersionSegment(seg), re.MatchString(seg); got != want {
			t.Errorf("isVersionSegment(%q) = %v, the regexp says %v", seg, got, want)
		}
		if depth == 5 {
			return
		}
		for _, c := range alphabet {
			walk(seg+c, depth+1)
		}
	}
	walk("", 0)
	old := func(p string) string {
		p = "/" + strings.TrimLeft(p, "/")
		if seg, rest, _ := strings.Cut(p[1:], "/"); re.MatchString(seg) {
			return "/" + rest
		}
		return p
	}
	for _, p := range []string{"", "/", "//", "///x", "x", "//v1/x", "/v1", "/v1/", "v2.0/a/b", "/a//b", "/v1.2.3/x"} {
		if got, want := UpstreamPath(p), old(p); got != want {
			t.Errorf("UpstreamPath(%q) = %q, was %q", p, got, want)
		}
	}
}

func TestTokenDead(t *testing.T) {
	dead := `{"error":{"message":"Error validating access token","type":"OAuthException","code":190,"error_subcode":463,"fbtrace_id":"A"}}`
	if !TokenDead(401, []byte(dead)) || !TokenDead(400, []byte(dead)) {
		t.Fatal("code 190 not detected")
	}
	if TokenDead(500, []byte(dead)) || TokenDead(400, []byte(`{"error":{"code":100}}`)) || TokenDead(401, []byte(`nope`)) {
		t.Fatal("false positive")
	}
}

func TestRewriteLinks(t *testing.T) {
	body := `{"data":[{"id":"1","name":"hello"}],"paging":{"cursors":{"before":"B","after":"A"},` +
		`"next":"https://graph.facebook.com/v26.0/999/message_templates?fields=name&limit=1&access_token=EAAGsecret&after=A",` +
		`"previous":"https://graph.facebook.com/v26.0/999/message_templates?access_token=EAAGsecret&before=B"}}`
	out := string(RewriteLinks([]byte(body), "https://relay.example.com/upstream-proxy/", "EAAGsecret"))
	if strings.Contains(out, "EAAGsecret") || strings.Contains(out, "access_token") || strings.Contains(out, "graph.facebook.com") {
		t.Fatalf("token or upstream left: %s", out)
	}
	var v struct {
		Data   []map[string]string
		Paging struct {
			Cursors        map[string]string
			Next, Previous string
		}
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	if v.Paging.Next != "https://relay.example.com/upstream-proxy/999/message_templates?fields=name&limit=1&after=A" ||
		v.Paging.Previous != "https://relay.example.com/upstream-proxy/999/message_templates?before=B" ||
		v.Paging.Cursors["after"] != "A" || v.Data[0]["name"] != "hello" {
		t.Fatalf("rewritten: %+v", v)
	}
	// In place: member order, spacing and the upstream's escapes are kept; only the links change.
	kept := `{"paging": {"next":"https:\/\/graph.facebook.com\/v26.0\/9\/message_templates?access_token=EAAGsecret&after=A"},` +
		` "data":[{"name":"a<b>\/c \u00e9","id":"1"}]}`
	want := `{"paging": {"next":"https://relay.example.com/upstream-proxy/9/message_templates?after=A"},` +
		` "data":[{"name":"a<b>\/c \u00e9","id":"1"}]}`
	if got := string(RewriteLinks([]byte(kept), "https://relay.example.com/upstream-proxy", "EAAGsecret")); got != want {
		t.Fatalf("rewritten in place:\n got %s\nwant %s", got, want)
	}
	plain := `{"messages":[{"id":"wamid.x"}]}`
	if got := string(RewriteLinks([]byte(plain), "https://r", "tok")); got != plain {
		t.Fatalf("changed a body without links: %s", got)
	}
	if got := ObjectIDs([]byte(body)); len(got) != 1 || got[0] != "1" {
		t.Fatalf("ObjectIDs = %v", got)
	}
}
