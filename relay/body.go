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
	if bytes.IndexByte(body, '\\') < 0 && !bytes.Contains(body, []byte(name)) {
		return body, "", false, nil // no escape that could spell name, and name is not there
	}
	if !json.Valid(body) {
		return body, "", false, nil
	}
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return body, "", false, nil
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
		match := keyIs(body[i:keyEnd], name)
		i = skipWS(body, keyEnd) + 1 // ':'
		valStart := skipWS(body, i)
		valEnd := skipValue(body, valStart)
		i = skipWS(body, valEnd)
		last := body[i] == '}'
		if match {
			found = true
			if err := json.Unmarshal(body[valStart:valEnd], &value); err != nil {
				return body, "", true, ErrKeyNotString
			}
			switch {
			case !last: // cut the member and the comma after it, up to the next member
				next := skipWS(body, i+1)
				cuts = append(cuts, span{memberStart, next})
			case prevKeptEnd >= 0: // last, after kept members: cut from the end of the last kept one
				cuts = append(cuts, span{prevKeptEnd, valEnd})
			default: // the only member
				cuts = append(cuts, span{memberStart, valEnd})
			}
		}
		if !match {
			prevKeptEnd = valEnd
		}
		if last {
			break
		}
		i++ // ','
	}
	if !found {
		return body, "", false, nil
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
	return out, value, true, nil
}

// keyIs reports whether the JSON string raw (valid JSON, quotes included) decodes to name.
// Without escapes, the bytes are compared in place (no decoding, no allocation).
func keyIs(raw []byte, name string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1:len(raw)-1]) == name
	}
	var key string
	json.Unmarshal(raw, &key) // valid JSON: cannot fail
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
