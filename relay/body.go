package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
)

// ErrKeyNotString is returned when idempotency_key is present but not a JSON string.
var ErrKeyNotString = errors.New(`"idempotency_key" must be a string`)

// IdempotencyKeyField is the send-body field that carries an idempotency key.
const IdempotencyKeyField = "idempotency_key"

// RemoveKey removes every top-level member named name from the JSON object body and returns
// the body with the rest of its bytes unchanged, and the member's value (the last one when the
// name repeats, as encoding/json reads it). found is false, and body is returned as is, when the
// body is not a JSON object or has no such member. The value must be a string.
func RemoveKey(body []byte, name string) (out []byte, value string, found bool, err error) {
	out, raw, _ := removeMembers(body, name, "")
	if raw == nil {
		return body, "", false, nil
	}
	if err := json.Unmarshal(raw, &value); err != nil {
		return body, "", true, ErrKeyNotString
	}
	return out, value, true, nil
}

// cleanSendBody takes out of a send's body what the upstream must not see: its idempotency_key
// (returned, as RemoveKey does) and any top-level access_token member of the caller's, whatever
// its value (the relay sends the channel's token in Authorization; a token in the body would
// travel next to it, as one in the query or a form body would: request.go). A body that is not a
// JSON object is returned as it is.
func cleanSendBody(body []byte) (out []byte, key string, found bool, err error) {
	out, raw, _ := removeMembers(body, IdempotencyKeyField, accessTokenParam)
	if raw == nil {
		return out, "", false, nil
	}
	if err := json.Unmarshal(raw, &key); err != nil {
		return body, "", true, ErrKeyNotString
	}
	return out, key, true, nil
}

// removeMembers removes every top-level member named name or drop (unless drop is "") from the
// JSON object body and returns the body with the rest of its bytes unchanged, the raw value of
// the last member named name (nil when there is none) and whether anything was removed. A body
// that is not a JSON object, or has neither member, is returned as it is.
func removeMembers(body []byte, name, drop string) (out, nameValue []byte, removed bool) {
	if bytes.IndexByte(body, '\\') < 0 && !bytes.Contains(body, []byte(name)) &&
		(drop == "" || !bytes.Contains(body, []byte(drop))) {
		return body, nil, false // no escape that could spell a name, and neither name is there
	}
	if !json.Valid(body) {
		return body, nil, false
	}
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return body, nil, false
	}
	i++
	type span struct{ start, end int } // [start, end) of a member to cut, separators included
	var cuts []span
	prevKeptEnd := -1 // end of the value of the last member that stays
	for {
		i = skipWS(body, i)
		if body[i] == '}' {
			break
		}
		memberStart := i
		keyEnd := skipString(body, i)
		isName := keyIs(body[i:keyEnd], name)
		match := isName || drop != "" && keyIs(body[i:keyEnd], drop)
		i = skipWS(body, keyEnd) + 1 // ':'
		valStart := skipWS(body, i)
		valEnd := skipValue(body, valStart)
		i = skipWS(body, valEnd)
		last := body[i] == '}'
		if isName {
			nameValue = body[valStart:valEnd]
		}
		if match {
			switch {
			case !last: // cut the member and the comma after it, up to the next member
				next := skipWS(body, i+1)
				cuts = append(cuts, span{memberStart, next})
			case prevKeptEnd >= 0: // last, after kept members: cut from the end of the last kept one
				cuts = append(cuts, span{prevKeptEnd, valEnd})
			default: // the only member
				cuts = append(cuts, span{memberStart, valEnd})
			}
		} else {
			prevKeptEnd = valEnd
		}
		if last {
			break
		}
		i++ // ','
	}
	if len(cuts) == 0 {
		return body, nil, false
	}
	// Cuts may overlap (repeated members); apply their union.
	slices.SortFunc(cuts, func(a, b span) int { return a.start - b.start })
	out = make([]byte, 0, len(body))
	pos := 0
	for _, c := range cuts {
		if c.start > pos {
			out = append(out, body[pos:c.start]...)
		}
		pos = max(pos, c.end)
	}
	out = append(out, body[pos:]...)
	return out, nameValue, true
}

// keyIs reports whether the JSON string raw (valid JSON, quotes included) decodes to name.
// Without escapes, the bytes are compared in place (no decoding, no allocation).
func keyIs(raw []byte, name string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1:len(raw)-1]) == name
	}
	var key string
	_ = json.Unmarshal(raw, &key) // valid JSON: cannot fail
	return key == name
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the JSON string starting at b[i] == '"'.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index after the JSON value starting at b[i] (the input is valid JSON).
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return i
	default: // number, true, false, null
		for i < len(b) && !(b[i] == ',' || b[i] == '}' || b[i] == ']' || b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
		return i
	}
}
