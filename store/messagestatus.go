package store

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// MessageStatus is what an upstream status (value.statuses[]) says about its outgoing message:
// what StoreEvents applies to the message's row in messages (DESIGN §5b "Message timeline"), and
// what the timeline shows of each status event.
type MessageStatus struct {
	// Status is the upstream's status: "sent", "delivered", "read", "failed" (and "accepted")
	// move the message's latest status; others ("deleted", "warning", …) are stored as events
	// only (StatusRank).
	Status string
	// Timestamp is the upstream's timestamp of the status (zero: unknown).
	Timestamp time.Time
	// Recipient is the status's recipient_id ("" when absent).
	Recipient string
	// ErrorCode and ErrorTitle are errors[0].code and .title (0 and "" when absent).
	ErrorCode  int
	ErrorTitle string
	// Pricing is the status's pricing object; nil when it carries none (store/usage.go).
	Pricing *Pricing
}

// The statuses of an outgoing message (messages.status), in the order of their rank: a
// message's latest status only moves forward (accepted < sent < delivered < read < failed), so a
// late "delivered" never replaces "read", and "failed" is final.
const (
	MessageAccepted  = "accepted"
	MessageSent      = "sent"
	MessageDelivered = "delivered"
	MessageRead      = "read"
	MessageFailed    = "failed"
)

// MessageStatuses lists the statuses of an outgoing message, in rank order.
var MessageStatuses = []string{MessageAccepted, MessageSent, MessageDelivered, MessageRead, MessageFailed}

// StatusRank returns the rank of an outgoing message's status (messages.status_rank: the index
// in MessageStatuses) and whether it is one; other upstream statuses leave messages alone.
func StatusRank(status string) (int, bool) {
	for i, s := range MessageStatuses {
		if s == status {
			return i, true
		}
	}
	return 0, false
}

// Bounds on what a status puts in messages: upstream values are far shorter; longer ones are
// dropped (the recipient) or cut (the error title), never refused.
const (
	maxRecipientLen  = 64
	maxErrorTitleLen = 1000
)

// statusFields is the part of an upstream status object ParseMessageStatus reads.
type statusFields struct {
	ID          json.RawMessage `json:"id"`
	Status      json.RawMessage `json:"status"`
	RecipientID json.RawMessage `json:"recipient_id"`
	Timestamp   json.RawMessage `json:"timestamp"`
	Errors      json.RawMessage `json:"errors"`
	Pricing     json.RawMessage `json:"pricing"`
}

// statusError is the part of a status's errors[0] ParseMessageStatus reads.
type statusError struct {
	Code  json.RawMessage `json:"code"`
	Title json.RawMessage `json:"title"`
}

// ParseMessageStatus reads an upstream status object: its id and what it says (MessageStatus).
// It never fails on content: a field of the wrong type or shape reads as absent (a bad timestamp
// as the zero time, a bad error code as 0); ok is false only when raw is not a JSON object.
func ParseMessageStatus(raw json.RawMessage) (id string, st MessageStatus, ok bool) {
	var f statusFields
	if !bytes.HasPrefix(bytes.TrimLeft(raw, " \t\r\n"), []byte("{")) || json.Unmarshal(raw, &f) != nil {
		return "", MessageStatus{}, false
	}
	st = MessageStatus{Status: jsonString(f.Status), Timestamp: UpstreamTime(f.Timestamp), Recipient: jsonString(f.RecipientID)}
	st.Pricing = parsePricing(f.Pricing)
	var errs []statusError
	if json.Unmarshal(f.Errors, &errs) == nil && len(errs) > 0 { // (not an array of objects: none)
		if n, err := strconv.ParseInt(jsonString(errs[0].Code), 10, 32); err == nil {
			st.ErrorCode = int(n)
		}
		st.ErrorTitle = jsonString(errs[0].Title)
	}
	return jsonString(f.ID), st, true
}

// UpstreamTime reads an upstream "timestamp" (unix seconds, sent as a string; a number is taken
// too). Anything else is the zero time: unknown.
func UpstreamTime(raw json.RawMessage) time.Time {
	sec, err := strconv.ParseInt(jsonString(raw), 10, 64)
	if err != nil || sec <= 0 {
		return time.Time{}
	}
	return time.Unix(sec, 0)
}

// jsonString returns a JSON string's value or a JSON number's text; "" for anything else.
func jsonString(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	switch c := raw[0]; {
	case c == '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	case c == '-' || (c >= '0' && c <= '9'):
		return string(raw)
	}
	return ""
}

// truncateText returns the longest prefix of the text s of at most n bytes that ends on a
// character boundary.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
