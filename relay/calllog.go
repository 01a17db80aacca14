package relay

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/store"
)

// Call is one relay call on the send path (`POST …/messages`), or a refusal of one, as the
// relay log records it (docs/relay.md, "Relay log"): a row of its own for a call that went
// upstream or was replayed, a count for a refusal (relaylog.Writer, store.KeepsRow).
type Call struct {
	// At is when the call arrived.
	At time.Time
	// OrgID and ChannelID are the caller's channel's.
	OrgID, ChannelID uuid.UUID
	// Status is the status answered to the caller: the upstream's, or the relay's own.
	Status int
	// Outcome is what came of the call, as the metrics count it.
	Outcome Outcome
	// ErrorCode and ErrorSubcode are the upstream's error.code and error.error_subcode when it
	// answered a JSON error (a replayed one included); 0 when it did not, or sent none.
	ErrorCode, ErrorSubcode int
	// Latency is the time from the call's arrival to its answer.
	Latency time.Duration
	// IdempotencyKey is the send's idempotency_key ("" without one).
	IdempotencyKey string
	// Replayed: the answer is a stored one, replayed for the idempotency key.
	Replayed bool
	// Recipient is the request body's top-level "to" ("" if none, or not a string).
	Recipient string
	// WAMID is messages[0].id of a successful answer ("" if none).
	WAMID string
}

// CallLog records the calls on the send path ([Relay.CallLog]; relaylog.Writer).
type CallLog interface {
	// Record takes one call. It must not block: a log that cannot keep up drops the call.
	Record(c Call)
}

// maxPeek caps the copy of a passed-through send answer kept to read its wamid (a send's
// answer is a few hundred bytes; a longer one is not looked into).
const maxPeek = 16 << 10

// record hands c, with the channel and (unless set) the latency since start, to the call log.
// A call that got no answer (Status 0: the caller went away first) is not recorded.
func (relay *Relay) record(c *Call, ch *store.RelayChannel, start time.Time) {
	if c.Status == 0 {
		return
	}
	c.At = start
	if c.Latency == 0 {
		c.Latency = time.Since(start)
	}
	c.OrgID, c.ChannelID = ch.OrgID, ch.ID
	relay.CallLog.Record(*c)
}

// recipientOf returns the top-level "to" of a send's body, found by a scan (no decoding).
func recipientOf(body []byte) string {
	v, ok := member(body, "to")
	if !ok {
		return ""
	}
	// A "to" longer than a phone number written with separators (or a business-scoped user id)
	// is no address of the upstream's and is not recorded: the log's rows are bounded in size as
	// in number.
	s, ok := stringValue(v)
	if !ok || !store.RecipientRecorded(s) {
		return ""
	}
	return s
}

// answerFacts reads what the relay log keeps of an answer's body: messages[0].id of a success,
// error.code and error.error_subcode of an error. A body that is not such JSON yields zeros.
func answerFacts(status int, body []byte) (wamid string, code, subcode int) {
	if status >= 200 && status < 300 {
		return wamidOf(body), 0, 0
	}
	if status < 400 {
		return "", 0, 0
	}
	e, ok := member(body, "error")
	if !ok || len(e) == 0 || e[0] != '{' {
		return "", 0, 0
	}
	if v, ok := member(e, "code"); ok {
		code, _ = intValue(v)
	}
	if v, ok := member(e, "error_subcode"); ok {
		subcode, _ = intValue(v)
	}
	return "", code, subcode
}

// wamidOf returns messages[0].id of a send's answer.
func wamidOf(body []byte) string {
	m, ok := member(body, "messages")
	if !ok || len(m) == 0 || m[0] != '[' {
		return ""
	}
	i := skipWS(m, 1)
	if i >= len(m) || m[i] != '{' {
		return ""
	}
	v, ok := member(m[i:min(skipValue(m, i), len(m))], "id")
	if !ok {
		return ""
	}
	s, ok := stringValue(v)
	if !ok || len(s) > store.MaxWAMIDLen {
		return ""
	}
	return s
}

// member returns the raw value of the first top-level member name of the JSON object b,
// found by scanning, not decoding. ok is false when b is not an object, as far as it is
// scanned, or has no such member. Any input is safe (the scan stops at what it cannot read).
func member(b []byte, name string) (raw []byte, ok bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	i++
	for {
		i = skipWS(b, i)
		if i >= len(b) || b[i] != '"' {
			return nil, false // '}' or not JSON
		}
		keyEnd := skipString(b, i)
		if keyEnd >= len(b) {
			return nil, false
		}
		key := b[i+1 : keyEnd-1]
		match := len(key) == len(name) && string(key) == name // escaped names do not match
		i = skipWS(b, keyEnd)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		vs := skipWS(b, i+1)
		if vs >= len(b) {
			return nil, false
		}
		ve := skipValue(b, vs)
		if ve > len(b) {
			return nil, false // an unterminated string
		}
		if match {
			return b[vs:ve], ve > vs
		}
		i = skipWS(b, ve)
		if i >= len(b) || b[i] != ',' {
			return nil, false
		}
		i++
	}
}

// stringValue decodes a raw JSON string value.
func stringValue(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), true
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// intValue decodes a raw JSON integer value that fits an int32 (the log's column).
func intValue(raw []byte) (int, bool) {
	n, err := strconv.ParseInt(string(raw), 10, 32)
	if err != nil {
		return 0, false
	}
	return int(n), true
}
