package store

import (
	"strings"
	"unicode/utf8"
)

// IsText reports whether s can be stored in a Postgres text column: valid UTF-8 without NUL
// characters. Caller and upstream content that is not text never reaches a text parameter.
func IsText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// recordableObjectIDs returns the elements of ids that can be recorded in a channel's scope:
// text of at most MaxObjectIDLen bytes (a longer one names no upstream object, and the scope's
// primary key would refuse one of a few kilobytes).
func recordableObjectIDs(ids []string) []string {
	out := ids[:0:0]
	for _, id := range ids {
		if recordableObjectID(id) {
			out = append(out, id)
		}
	}
	return out
}

// recordableObjectID reports an object id that can be recorded in a channel's scope (see
// recordableObjectIDs).
func recordableObjectID(id string) bool { return len(id) <= MaxObjectIDLen && IsText(id) }

// MaxWAMIDLen bounds the message ids stored for the timeline (events.wamid, messages.wamid):
// the upstream's are under 100 bytes; a longer one names no message and would bloat an index.
const MaxWAMIDLen = 256

// nullText returns nil for an empty s and for one that cannot be an id worth storing (not text,
// or longer than MaxWAMIDLen bytes), else &s: the optional id columns' parameter.
func nullText(s string) *string {
	if s == "" || len(s) > MaxWAMIDLen || !IsText(s) {
		return nil
	}
	return &s
}
