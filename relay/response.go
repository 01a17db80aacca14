package relay

import (
	"bytes"
	"encoding/json"
	"net/url"
	"strings"
)

// isVersionSegment reports an upstream version path segment such as "v26.0": "v", digits, and
// optionally "." and digits (the regular expression `^v\d+(\.\d+)?$`, without its cost on
// every call).
func isVersionSegment(seg string) bool {
	if len(seg) < 2 || seg[0] != 'v' {
		return false
	}
	major, minor, dotted := strings.Cut(seg[1:], ".")
	return allDigits(major) && (!dotted || allDigits(minor))
}

// allDigits reports a non-empty string of ASCII digits.
func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// UpstreamPath turns a relay path (relative to {proxy_url}) into the path under the upstream
// base: a leading version segment the caller included anyway is dropped, so the upstream never
// sees the version twice.
func UpstreamPath(p string) string {
	if len(p) < 2 || p[0] != '/' || p[1] == '/' {
		p = "/" + strings.TrimLeft(p, "/") // else p is that already, without a copy
	}
	if seg, rest, _ := strings.Cut(p[1:], "/"); isVersionSegment(seg) {
		return "/" + rest
	}
	return p
}

// FirstSegment returns the first segment of an upstream path: the object the call is about.
func FirstSegment(p string) string {
	seg, _, _ := strings.Cut(strings.TrimLeft(p, "/"), "/")
	return seg
}

// graphError is the upstream's error envelope.
type graphError struct {
	Error *struct {
		Code int `json:"code"`
	} `json:"error"`
}

// TokenDead reports an upstream answer that says the access token is no longer valid: error
// code 190 with status 400 or 401. Answers that cannot be one (another status, or no "190" in
// the bytes) are told apart without decoding any JSON.
func TokenDead(status int, body []byte) bool {
	if status != 400 && status != 401 || !bytes.Contains(body, []byte("190")) {
		return false
	}
	var e graphError
	return json.Unmarshal(body, &e) == nil && e.Error != nil && e.Error.Code == 190
}

// RewriteLinks rewrites a JSON response for the caller: paging.next and paging.previous links
// point at proxyBase instead of the upstream, without any access_token; and, as a last guard,
// any occurrence of secret (the upstream token) is removed. The links are replaced in place:
// every other byte of the upstream's answer is kept (member order, spacing, escapes). It
// returns body itself when there is nothing to rewrite.
func RewriteLinks(body []byte, proxyBase, secret string) []byte {
	if bytes.Contains(body, []byte(`"paging"`)) && json.Valid(body) {
		body = rewritePaging(body, proxyBase)
	}
	if secret != "" && bytes.Contains(body, []byte(secret)) {
		body = bytes.ReplaceAll(body, []byte(secret), []byte("REDACTED"))
	}
	return body
}

// rewritePaging replaces the string values of the top-level paging object's next and previous
// members of the valid JSON body with their [pagingLink]s. An answer too large to buffer gets
// the same rewrite as it streams, from a [pagingRewriter].
func rewritePaging(body []byte, proxyBase string) []byte {
	type span struct {
		start, end int
		repl       []byte
	}
	var spans []span
	eachMember(body, skipWS(body, 0), func(key []byte, vs, ve int) bool {
		if !keyIs(key, "paging") {
			return true
		}
		eachMember(body, vs, func(key []byte, vs, ve int) bool {
			if (keyIs(key, "next") || keyIs(key, "previous")) && body[vs] == '"' {
				if repl, ok := pagingLink(body[vs:ve], proxyBase); ok {
					spans = append(spans, span{vs, ve, repl})
				}
			}
			return true
		})
		return false
	})
	if len(spans) == 0 {
		return body
	}
	out := make([]byte, 0, len(body)+64)
	pos := 0
	for _, sp := range spans {
		out = append(append(out, body[pos:sp.start]...), sp.repl...)
		pos = sp.end
	}
	return append(out, body[pos:]...)
}

// eachMember calls fn with the raw key (a JSON string, quotes included) and the value's
// [start, end) of every member of the JSON object starting at b[i] (b is valid JSON), until fn
// returns false. It does nothing when b[i] is not '{'.
func eachMember(b []byte, i int, fn func(key []byte, valStart, valEnd int) bool) {
	if i >= len(b) || b[i] != '{' {
		return
	}
	for i++; ; i++ { // i at '{' or ','
		i = skipWS(b, i)
		if b[i] == '}' {
			return
		}
		keyEnd := skipString(b, i)
		vs := skipWS(b, skipWS(b, keyEnd)+1)
		ve := skipValue(b, vs)
		if !fn(b[i:keyEnd], vs, ve) {
			return
		}
		if i = skipWS(b, ve); b[i] == '}' {
			return
		}
	}
}

// jsonString encodes s as a JSON string without escaping HTML characters (links keep their
// '&').
func jsonString(s string) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// ProxyLink maps an upstream URL to the relay: {proxyBase}/<path without version>?<query
// without access_token>.
func ProxyLink(link, proxyBase string) string {
	u, err := url.Parse(link)
	if err != nil {
		return ""
	}
	var kept []string
	for _, kv := range strings.Split(u.RawQuery, "&") {
		if kv != "" && !strings.HasPrefix(kv, "access_token=") && kv != "access_token" {
			kept = append(kept, kv)
		}
	}
	out := strings.TrimRight(proxyBase, "/") + UpstreamPath(u.EscapedPath())
	if len(kept) > 0 {
		out += "?" + strings.Join(kept, "&")
	}
	return out
}

// ObjectIDs returns the object ids an upstream answer names: a top-level "id" (e.g. a created
// template) and the ids in "data" (e.g. a template listing). See [Handed] for which answers
// hand them to a channel.
func ObjectIDs(body []byte) []string {
	var v struct {
		ID   json.RawMessage `json:"id"`
		Data []struct {
			ID json.RawMessage `json:"id"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &v) != nil {
		return nil
	}
	var ids []string
	if id := stringID(v.ID); id != "" {
		ids = append(ids, id)
	}
	for _, d := range v.Data {
		if id := stringID(d.ID); id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}
