package relay

import (
	"bytes"
	"encoding/json"
	"net/url"
	"regexp"
	"strings"
)

// versionSegment matches an upstream version path segment such as "v26.0".
var versionSegment = regexp.MustCompile(`^v\d+(\.\d+)?$`)

// UpstreamPath turns a relay path (relative to {proxy_url}) into the path under the upstream
// base: a leading version segment the caller included anyway is dropped, so the upstream never
// sees the version twice.
func UpstreamPath(p string) string {
	p = "/" + strings.TrimLeft(p, "/")
	if seg, rest, _ := strings.Cut(p[1:], "/"); versionSegment.MatchString(seg) {
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
// code 190 with status 400 or 401.
func TokenDead(status int, body []byte) bool {
	if status != 400 && status != 401 {
		return false
	}
	var e graphError
	return json.Unmarshal(body, &e) == nil && e.Error != nil && e.Error.Code == 190
}

// RewriteLinks rewrites a JSON response for the caller: paging.next and paging.previous links
// point at proxyBase instead of the upstream, without any access_token; and, as a last guard,
// any occurrence of secret (the upstream token) is removed. It returns body unchanged when there
// is nothing to rewrite.
func RewriteLinks(body []byte, proxyBase, secret string) []byte {
	if bytes.Contains(body, []byte(`"paging"`)) {
		var top map[string]json.RawMessage
		if json.Unmarshal(body, &top) == nil && top["paging"] != nil {
			var paging map[string]json.RawMessage
			if json.Unmarshal(top["paging"], &paging) == nil {
				changed := false
				for _, k := range []string{"next", "previous"} {
					var link string
					if json.Unmarshal(paging[k], &link) != nil || link == "" {
						continue
					}
					if b, err := json.Marshal(ProxyLink(link, proxyBase)); err == nil {
						paging[k], changed = b, true
					}
				}
				if changed {
					top["paging"], _ = json.Marshal(paging)
					if b, err := json.Marshal(top); err == nil {
						body = b
					}
				}
			}
		}
	}
	if secret != "" && bytes.Contains(body, []byte(secret)) {
		body = bytes.ReplaceAll(body, []byte(secret), []byte("REDACTED"))
	}
	return body
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
