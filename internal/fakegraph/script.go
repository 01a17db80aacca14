package fakegraph

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
)

// Scripted upstream errors per recipient: POST /_fake/script and Script make the next sends to a
// recipient answer chosen upstream errors, one per send and in order, each with the envelope the
// upstream gives for that code (§1.6, §1.7); the sends after them succeed again. Tests and the
// demo use it to show how a broadcast retries the rate-limit codes (130429, 131056) and fails a
// recipient on the others.

// scriptedErrors are the codes Script knows, each with the upstream's answer to a send. The
// wording is the upstream's (whatsapp.md §1.6/§1.7; 131026 as its "failed" status words it,
// statuses.go); the HTTP status is the documented one (DocStatus).
var scriptedErrors = map[int]func() *gerr{
	// Meta's own sample on the error-codes page, with its subcode.
	130429: func() *gerr {
		e := waErr(130429, "Rate limit hit", "Message failed to send because there were too many messages sent from this phone number in a short period of time")
		e.subcode = 2494055
		return e
	},
	131056: func() *gerr {
		return waErr(131056, "(Business Account, Consumer Account) pair rate limit hit", "Too many messages sent from the sender phone number to the same recipient phone number in a short period of time.")
	},
	// The synchronous form of 131047 (the upstream usually accepts the send and reports a
	// "failed" status instead; some fixtures show this 400).
	131047: func() *gerr {
		return waErr(131047, "Re-engagement message", "Message failed to send because more than 24 hours have passed since the customer last replied to this number.")
	},
	131026: func() *gerr { return waErr(131026, "Message undeliverable", "Message Undeliverable.") },
	131048: func() *gerr {
		return waErr(131048, "Spam rate limit hit", "Message failed to send because there are restrictions on how many messages can be sent from this phone number. This may be because too many previous messages were blocked or flagged as spam.")
	},
	131000: func() *gerr { return waErr(131000, "Something went wrong", "Something went wrong") },
	131016: func() *gerr { return waErr(131016, "Service unavailable", "A service is temporarily unavailable.") },
	131030: func() *gerr {
		return waErr(131030, "Recipient phone number not in allowed list", "Recipient phone number not in allowed list: Add recipient phone number to recipient list and try again.")
	},
	// An access token the upstream no longer takes (§7.3): 401 without error_data.
	190: errInvalidToken,
}

// ScriptableCodes lists, in ascending order, the upstream error codes Script and
// POST /_fake/script accept.
func ScriptableCodes() []int {
	codes := make([]int, 0, len(scriptedErrors))
	for c := range scriptedErrors {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	return codes
}

// Script makes the next sends (POST /{phone-number-id}/messages) to the recipient to answer the
// upstream errors codes, one per send and in order, after the request passed the fake's
// validation; then sends to it succeed again. to is the recipient as a send gives it; only its
// digits count ("+1 555-0100" is "15550100"). Codes add to what is still scripted for the
// recipient. A code Script does not know (ScriptableCodes) panics: tests should say what they
// mean.
func (s *Server) Script(to string, codes ...int) {
	if err := s.script(to, codes); err != nil {
		panic("fakegraph: Script: " + err.Error())
	}
}

func (s *Server) script(to string, codes []int) error {
	waID, _ := recipientIDs(to)
	if waID == "" {
		return fmt.Errorf(`"to" must be a phone number (digits)`)
	}
	for _, c := range codes {
		if scriptedErrors[c] == nil {
			return fmt.Errorf("error %d cannot be scripted; known codes: %s", c, joinInts(ScriptableCodes()))
		}
	}
	if len(codes) == 0 {
		return nil
	}
	s.failMu.Lock()
	if s.scripts == nil {
		s.scripts = map[string][]int{}
	}
	s.scripts[waID] = append(s.scripts[waID], codes...)
	s.failMu.Unlock()
	return nil
}

// Scripted returns the codes still scripted for the recipient (its digits), in order.
func (s *Server) Scripted(to string) []int {
	waID, _ := recipientIDs(to)
	s.failMu.Lock()
	defer s.failMu.Unlock()
	return slices.Clone(s.scripts[waID])
}

// takeScripted pops the next scripted error of a recipient, or nil.
func (s *Server) takeScripted(waID string) *gerr {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	codes := s.scripts[waID]
	if len(codes) == 0 {
		return nil
	}
	if len(codes) == 1 {
		delete(s.scripts, waID)
	} else {
		s.scripts[waID] = codes[1:]
	}
	return scriptedErrors[codes[0]]()
}

// MessagesTo returns the recorded sends (POST …/messages with a "to") to the recipient, in
// order, whatever their answer; only the digits of to and of each send's "to" are compared. It
// reads the request record, so WithMaxRecorded bounds it too.
func (s *Server) MessagesTo(to string) []Request {
	want, _ := recipientIDs(to)
	var out []Request
	for _, r := range s.RequestsTo("POST", "/messages") {
		var b struct {
			To string `json:"to"`
		}
		if json.Unmarshal(r.Body, &b) != nil || b.To == "" {
			continue
		}
		if got, _ := recipientIDs(b.To); got == want {
			out = append(out, r)
		}
	}
	return out
}

// scriptRequest is the body of POST /_fake/script.
type scriptRequest struct {
	To     string `json:"to"`
	Errors []int  `json:"errors"`
}

// handleScript serves POST /_fake/script {"to": "<digits>", "errors": [130429, …]}: 200 with
// the recipient and everything now scripted for it, 400 {"error": …} for a bad body.
func (s *Server) handleScript(w http.ResponseWriter, r *http.Request) {
	var in scriptRequest
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		demoError(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	if len(in.Errors) == 0 {
		demoError(w, http.StatusBadRequest, `"errors" must list at least one upstream error code`)
		return
	}
	if err := s.script(in.To, in.Errors); err != nil {
		demoError(w, http.StatusBadRequest, err.Error())
		return
	}
	waID, _ := recipientIDs(in.To)
	writeDemoJSON(w, http.StatusOK, struct {
		To       string `json:"to"`
		Scripted []int  `json:"scripted"`
	}{waID, s.Scripted(waID)})
}

func joinInts(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, ", ")
}
