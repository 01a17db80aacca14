package relay

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/store"
)

// SendResult is what came of one send made on a channel's behalf ([Relay.SendFor]).
type SendResult struct {
	// Status is the answer's status: the upstream's own (Answered), or the relay's — 403 the
	// channel is not active or the path is outside its scope, 503 CHANNEL_DISCONNECTED, 429
	// the channel's limit is full, 502 the upstream unreachable or its answer unusable, 504 no
	// answer in time.
	Status int
	// Outcome is the call's outcome, as the relay's metrics count it.
	Outcome Outcome
	// Answered: the answer is the upstream's own.
	Answered bool
	// WAMID is messages[0].id of a successful answer ("" if none).
	WAMID string
	// ErrorCode and ErrorSubcode are the upstream's error.code and error.error_subcode (0: none).
	ErrorCode, ErrorSubcode int
	// ErrorTitle is the upstream error's one line: error.error_user_title, else error.message
	// ("" if none).
	ErrorTitle string
	// NotSent: the upstream provably did not act (never reached, or it rejected the access
	// token), or the relay refused the send itself; it may be sent again.
	NotSent bool
	// RateLimited: the channel's limit (shared with the callers) refused the send, nothing was
	// sent; RetryAfter is when the limit has room again.
	RateLimited bool
	RetryAfter  time.Duration
	// TimedOut: the upstream did not answer within SendDeadline. Aborted: its answer was cut
	// short. Either way the send may have happened — as with any answer that is neither the
	// upstream's (Answered) nor NotSent (a 502 for an answer the relay could not read).
	TimedOut, Aborted bool
}

// maxSendAnswer caps what [Relay.SendFor] keeps of an answer (a send's answer is a few
// hundred bytes; only its error's title is read from it).
const maxSendAnswer = maxPeek

// SendFor sends body, a `POST /<phone_number_id>/messages` body, on behalf of ch with no caller:
// through the relay's own path — the channel's status and the path's scope, the channel's rate
// limit (shared with its callers across instances), the swap to the channel's access token,
// the inspection of the answer (a dead token marks the channel disconnected, as for a caller)
// and the call log (recipient and wamid: the send is on the timeline). There is no window
// guard (broadcasts send templates, which every window allows) and no idempotency key (the
// caller keeps its own at-most-once record). Once called, the send runs to its end even if ctx
// is cancelled, bounded by SendDeadline, so that its outcome is known.
func (relay *Relay) SendFor(ctx context.Context, ch *store.RelayChannel, body []byte, up Upstream) SendResult {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), SendDeadline)
	defer cancel()
	rec := &sendRecorder{hdr: http.Header{}}
	path := "/" + ch.PhoneNumberID + "/messages"
	logged := relay.CallLog != nil
	c := Call{Recipient: recipientOf(body)}
	res := SendResult{NotSent: true}
	switch {
	case ch.Status != "active":
		res.Status, res.Outcome = relay.refuse(rec, OutcomeInactive, http.StatusForbidden, MsgNotActive), OutcomeInactive
	case ch.Disconnected:
		res.Status, res.Outcome = relay.refuse(rec, OutcomeDisconnected, http.StatusServiceUnavailable, MsgDisconnected), OutcomeDisconnected
	case ch.PhoneNumberID == "" || !InScope(ch, UpstreamPath(path)):
		// Not logged, as for a caller: no send of the channel's.
		res.Status, res.Outcome = relay.refuse(rec, OutcomeForbidden, http.StatusForbidden, MsgPathNotAllowed), OutcomeForbidden
		return res
	}
	if res.Status == 0 {
		if d, _ := relay.admit(ctx, ch); !d.Allowed {
			res.Status = relay.refuse(rec, OutcomeRateLimited, http.StatusTooManyRequests, httpx.MsgRateLimited)
			res.Outcome, res.RateLimited, res.RetryAfter = OutcomeRateLimited, true, d.RetryAfter
		}
	}
	if res.Status != 0 {
		if logged {
			c.Status, c.Outcome = res.Status, res.Outcome
			relay.record(&c, ch, start)
		}
		return res
	}

	stripped, _, _, err := cleanSendBody(body) // a template's JSON carries no access_token upstream
	if err != nil {
		stripped = body // an idempotency_key that is not a string: the upstream judges the body
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, path, nil)
	if err != nil { // a phone number id that is no path segment; InScope refuses those first
		res.Status, res.Outcome = http.StatusForbidden, OutcomeForbidden
		return res
	}
	r.Header.Set("Content-Type", "application/json")
	setBody(r, stripped)
	o := relay.forward(rec, r, ch, up, false, nil, true)
	res = SendResult{
		Status: o.status, Outcome: o.outcome, Answered: o.answered, WAMID: o.wamid,
		ErrorCode: o.errCode, ErrorSubcode: o.errSubcode, NotSent: o.notSent,
		Aborted: o.aborted || o.cut, TimedOut: !o.answered && o.status == http.StatusGatewayTimeout,
	}
	if o.status >= 400 && o.answered {
		res.ErrorTitle = errorTitle(rec.body.Bytes())
	}
	if logged {
		c.Status, c.Outcome, c.ErrorCode, c.ErrorSubcode, c.WAMID = o.status, o.outcome, o.errCode, o.errSubcode, o.wamid
		relay.record(&c, ch, start)
	}
	return res
}

// errorTitle returns the one line of an upstream JSON error answer: error.error_user_title,
// else error.message ("" if neither).
func errorTitle(body []byte) string {
	e, ok := member(body, "error")
	if !ok || len(e) == 0 || e[0] != '{' {
		return ""
	}
	for _, name := range []string{"error_user_title", "message"} {
		if v, ok := member(e, name); ok {
			if s, ok := stringValue(v); ok && s != "" {
				return s
			}
		}
	}
	return ""
}

// sendRecorder is the ResponseWriter of a send made with no caller: it keeps the status, the
// headers and the start of the body.
type sendRecorder struct {
	hdr    http.Header
	status int
	body   bytes.Buffer
}

func (w *sendRecorder) Header() http.Header { return w.hdr }

func (w *sendRecorder) WriteHeader(status int) {
	if w.status == 0 && status >= 200 {
		w.status = status
	}
}

func (w *sendRecorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if n := min(len(p), maxSendAnswer-w.body.Len()); n > 0 {
		w.body.Write(p[:n])
	}
	return len(p), nil
}
