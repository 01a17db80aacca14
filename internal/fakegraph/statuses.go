package fakegraph

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The status webhooks of the messages the fake accepts (WithCallback), as the upstream sends
// them (§3.4): one signed post per status, field "messages", value.statuses with one status.
//
//   - A deliverable recipient gets "sent", "delivered" and "read" (WithStatusOrder changes the
//     order in which they are posted, e.g. read before delivered, or leaves some out). The
//     statuses' timestamps are those of the events, whatever the posting order: sent at the
//     acceptance's second, delivered one step later, read two steps later (a step is the
//     WithStatusDelay rounded up to whole seconds, at least 1 s). "pricing" comes with "sent"
//     and "delivered" only, as upstream (statusPricing: by the template's category).
//   - An undeliverable recipient (WithUndeliverable; DefaultUndeliverable: wa_ids starting with
//     999) gets the send accepted (200 with a wamid, as upstream) and then a single "failed"
//     status with errors [{"code": 131026, "title": "Message undeliverable", ...}].
//
// A post the callback does not answer 200 ends that message's reports (the upstream retries,
// the fake does not); the failure is logged (WithLog).

// Statuses the fake reports.
const (
	StatusSent      = "sent"
	StatusDelivered = "delivered"
	StatusRead      = "read"
	StatusFailed    = "failed"
)

// CodeUndeliverable is the code of the error a "failed" status carries for an undeliverable
// recipient: 131026, "Message undeliverable".
const CodeUndeliverable = 131026

// UndeliverableRecipient is a made-up recipient that DefaultUndeliverable refuses (country
// calling code 999), for demos and tests: "+999 555 0100" gives the same wa_id.
const UndeliverableRecipient = "9995550100"

// statusRank orders the statuses of a delivered message in time; it also says which statuses
// WithStatusOrder accepts.
var statusRank = map[string]int64{StatusSent: 0, StatusDelivered: 1, StatusRead: 2}

// defaultStatusOrder is the posting order unless WithStatusOrder says otherwise.
var defaultStatusOrder = []string{StatusSent, StatusDelivered, StatusRead}

// DefaultUndeliverable is the fake's rule for recipients it cannot deliver to, unless
// WithUndeliverable replaces it: a wa_id (the digits of the send's "to") starting with 999, a
// country calling code the ITU has not assigned, so that no WhatsApp account can have it
// (UndeliverableRecipient is one).
func DefaultUndeliverable(waID string) bool { return strings.HasPrefix(waID, "999") }

// WithUndeliverable sets which recipients the fake cannot deliver to: f gets the recipient's
// wa_id (the digits of the send's "to"). Such a send is accepted (200 with a wamid, as the
// upstream answers) and, with WithCallback, followed by a "failed" status carrying error
// 131026 instead of sent/delivered/read. Nil makes every recipient deliverable. Default:
// DefaultUndeliverable.
func WithUndeliverable(f func(waID string) bool) Option {
	return func(s *Server) { s.undeliverable = f }
}

// WithStatusOrder sets the statuses posted, in this order, for each message to a deliverable
// recipient; each must be "sent", "delivered" or "read" (else WithStatusOrder panics), and a
// repeat is posted again (the upstream may send a status twice). The statuses keep the
// timestamps of their events whatever the order, so WithStatusOrder("sent", "read",
// "delivered") reports a "read" that arrives before the "delivered" that happened before it. No
// statuses: nothing is reported. Default: sent, delivered, read.
func WithStatusOrder(statuses ...string) Option {
	for _, st := range statuses {
		if _, ok := statusRank[st]; !ok {
			panic(fmt.Sprintf("fakegraph: WithStatusOrder: %q is not one of sent, delivered, read", st))
		}
	}
	order := append([]string{}, statuses...)
	return func(s *Server) { s.statusOrder = order }
}

// WithStatusDelay makes the fake wait d before each status webhook of a message (the demo
// uses about a second, so that a timeline fills in as one watches). Default: 0, posted at once.
func WithStatusDelay(d time.Duration) Option { return func(s *Server) { s.statusDelay = d } }

// reportStatuses posts the statuses of a message the fake accepted at "accepted" to the
// callback, one webhook each (see the top of this file).
func (s *Server) reportStatuses(pnid, wamid, recipient string, pricing *whPricing, accepted time.Time) {
	s.mu.RLock()
	n := s.numbers[pnid]
	var display, waba string
	if n != nil {
		display, waba = digitsOf(n.display), n.waba
	}
	s.mu.RUnlock()
	if waba == "" {
		waba = pnid
	}
	step := int64((s.statusDelay + time.Second - 1) / time.Second)
	if step < 1 {
		step = 1
	}
	t0 := accepted.Unix()
	meta := whMetadata{display, pnid}

	var statuses []whStatus
	if s.undeliverable != nil && s.undeliverable(recipient) {
		statuses = []whStatus{{ID: wamid, Status: StatusFailed, Timestamp: strconv.FormatInt(t0+step, 10), RecipientID: recipient,
			Errors: []whError{undeliverableError()}}}
	} else {
		for _, st := range s.statusOrder {
			ws := whStatus{ID: wamid, Status: st, Timestamp: strconv.FormatInt(t0+statusRank[st]*step, 10), RecipientID: recipient}
			if st != StatusRead {
				ws.Pricing = pricing
			}
			statuses = append(statuses, ws)
		}
	}
	for _, ws := range statuses {
		if s.statusDelay > 0 {
			t := time.NewTimer(s.statusDelay)
			select {
			case <-s.bg.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		value := whValue{MessagingProduct: "whatsapp", Metadata: meta, Statuses: []whStatus{ws}}
		code, _, err := s.postWebhook(s.bg, s.callback, s.appSecret, s.webhookBody(waba, value))
		if err != nil || code != http.StatusOK {
			logf(s.logw, "%s status webhook %s of %s: %d %v\n", time.Now().Format(time.RFC3339), ws.Status, wamid, code, err)
			return
		}
	}
}

// undeliverableError is errors[0] of the "failed" status of an undeliverable recipient, in the
// upstream's shape (§3.4).
func undeliverableError() whError {
	return whError{Code: CodeUndeliverable, Title: "Message undeliverable", Message: "Message undeliverable",
		ErrorData: whErrorData{"Message Undeliverable."}, Href: "/documentation/business-messaging/whatsapp/support/error-codes"}
}
