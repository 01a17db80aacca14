package relay

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/store"
)

// ErrBadPath is returned by [CheckPath] for a path the relay refuses to forward.
var ErrBadPath = errors.New("path not allowed")

// CheckPath refuses, before any upstream call, relay paths that could address something other
// than what they seem to: an empty segment (including a trailing slash), a "." or ".."
// segment, a backslash, or an encoded "/" or "\" (rawPath is the request's escaped path,
// empty when it needs no escaping). It does not rely on the host server having cleaned the
// path.
func CheckPath(path, rawPath string) error {
	if !strings.HasPrefix(path, "/") || strings.Contains(path, `\`) {
		return ErrBadPath
	}
	for seg := range strings.SplitSeq(path[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return ErrBadPath
		}
	}
	if l := strings.ToLower(rawPath); strings.Contains(l, "%2f") || strings.Contains(l, "%5c") {
		return ErrBadPath
	}
	return nil
}

// InScope reports whether a channel may call upstreamPath (see [UpstreamPath]) with its token,
// deciding from memory only (docs/relay.md, "Scope rule"): the first segment must be the
// channel's phone number id, its business account id, or an object handed to it (ch.Objects:
// template ids from its own template calls, media ids from its own uploads and events). The
// subscribed_apps edge is the service's own business: refused for every channel token, since
// several channels may share a business account.
func InScope(ch *store.RelayChannel, upstreamPath string) bool {
	first, rest, more := strings.Cut(strings.TrimPrefix(upstreamPath, "/"), "/")
	if first == "" {
		return false
	}
	if second, _, _ := strings.Cut(rest, "/"); more && second == "subscribed_apps" {
		return false
	}
	if first == ch.PhoneNumberID || first == ch.WabaID {
		return true
	}
	return ch.Objects.Has(first)
}

// Handed returns the object ids a successful upstream answer hands to the channel, and their
// kind: the template ids of its own business account's `…/message_templates` answers (a
// listing's data[].id, a created template's id) and the id of a medium it uploaded
// (`POST /<phone_number_id>/media`). Ids in any other answer (e.g. `GET
// /<waba_id>/phone_numbers`) are never handed over.
func Handed(ch *store.RelayChannel, method, upstreamPath string, status int, body []byte) (kind string, ids []string) {
	if status/100 != 2 {
		return "", nil
	}
	switch handsObjects(ch, method, upstreamPath) {
	case store.ObjectTemplate:
		return store.ObjectTemplate, ObjectIDs(body)
	case store.ObjectMedia:
		var v struct {
			ID json.RawMessage `json:"id"`
		}
		if json.Unmarshal(body, &v) != nil {
			return "", nil
		}
		if id := stringID(v.ID); id != "" {
			return store.ObjectMedia, []string{id}
		}
	}
	return "", nil
}

// handsObjects returns the kind of objects a successful answer to this call hands to the
// channel, or "" for calls whose answers hand it nothing.
func handsObjects(ch *store.RelayChannel, method, upstreamPath string) string {
	first, rest, ok := strings.Cut(strings.TrimPrefix(upstreamPath, "/"), "/")
	switch {
	case !ok || strings.Contains(rest, "/"):
	case rest == "message_templates" && first == ch.WabaID && ch.WabaID != "" &&
		(method == http.MethodGet || method == http.MethodPost):
		return store.ObjectTemplate
	case rest == "media" && first == ch.PhoneNumberID && ch.PhoneNumberID != "" && method == http.MethodPost:
		return store.ObjectMedia
	}
	return ""
}

// stringID returns raw as a string if it is a non-empty JSON string, else "".
func stringID(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// ObjectAdmitter records the objects handed to a channel ([store.Store]).
type ObjectAdmitter interface {
	AdmitChannelObjects(ctx context.Context, id uuid.UUID, kind string, objectIDs []string) ([]string, error)
}

// Admit records ids of kind as handed to ch, shared by every instance (the store announces the
// change, so their cached copies of the channel reload), and adds those admitted to ch.Objects
// at once for this instance.
func Admit(ctx context.Context, s ObjectAdmitter, ch *store.RelayChannel, kind string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	admitted, err := s.AdmitChannelObjects(ctx, ch.ID, kind, ids)
	if err != nil {
		return err
	}
	if ch.Objects != nil {
		ch.Objects.Add(admitted...)
	}
	return nil
}
