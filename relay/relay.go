package relay

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/idempotency"
	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/store"
)

// Relay error messages (the interface document's wording).
const (
	MsgAuthRequired    = "Authorization header required"
	MsgInvalidToken    = "Invalid channel token"
	MsgNotActive       = "Channel is not active"
	MsgDisconnected    = "CHANNEL_DISCONNECTED"
	MsgPathNotAllowed  = "Path not allowed for this channel"
	MsgIdemUnavailable = "Idempotency store unavailable"
	MsgIdemInProgress  = "Request with this idempotency_key is in progress"
	MsgIdemMismatch    = "idempotency_key was already used with a different request"
	MsgIdemKeyLength   = `"idempotency_key" must be 1 to 255 characters`
	MsgBodyTooLarge    = "Request body too large"
	MsgBodyUnreadable  = "Request body could not be read"
	MsgUpstreamDown    = "Upstream unavailable"
	MsgUpstreamTimeout = "Upstream timeout"
	// MsgUpstreamEncoding answers (502) an upstream answer in a Content-Encoding the relay
	// cannot decode (anything but gzip and deflate), or whose encoded body is corrupt: the
	// relay cannot look for the upstream token in it, so nothing of it is passed on.
	MsgUpstreamEncoding = "Upstream answer could not be decoded"
	// MsgBadQuery answers (400) a query string that does not parse unambiguously (a bad
	// %-escape, a ';'): the relay could not tell which parameters it carries.
	MsgBadQuery = "Invalid query string"
	// MsgBadForm answers (400) an application/x-www-form-urlencoded body that does not parse.
	MsgBadForm = "Invalid form body"
	// MsgFormAccessToken answers (400) a multipart body with an access_token field: the relay
	// strips credentials from what it forwards and will not rewrite a streamed upload.
	MsgFormAccessToken = "access_token is not allowed in a multipart body"
)

// Limits.
const (
	// MaxSendBody caps the body of a send (`POST …/messages`), which the relay reads whole to
	// take its idempotency key out. Other bodies (media uploads) stream through unread.
	MaxSendBody = 4 << 20
	// maxKeyLen is the longest idempotency key.
	maxKeyLen = 255
	// maxInspectBody caps the answers buffered for inspection; larger ones stream through
	// uninspected.
	maxInspectBody = 8 << 20
	// maxStoredBody caps the answer of a send kept for replays (a send's answer is a few
	// hundred bytes; a larger one is replaced by the relay's 502 for replays).
	maxStoredBody = 1 << 20
	// storeTimeout bounds each call to a store made after the caller's answer is decided.
	storeTimeout = 5 * time.Second
)

// Upstream sends a prepared request to the upstream and writes the upstream's answer to w:
// Caddy's reverse_proxy in production ([Relay.Serve]'s caller adapts it), any handler in tests.
// An error means no (complete) answer was written. An error wrapping [ErrUpstreamTimeout] or
// [context.DeadlineExceeded] is answered 504, others 502; a failure to dial means nothing was
// sent. Writing to w may panic with [http.ErrAbortHandler] (reverse_proxy aborting a stream).
type Upstream func(w http.ResponseWriter, r *http.Request) error

// ErrUpstreamTimeout is wrapped by an Upstream's error when the upstream did not answer in time.
var ErrUpstreamTimeout = errors.New("relay: upstream timeout")

// Channels resolves channel tokens ([Cache]).
type Channels interface {
	Lookup(ctx context.Context, token string) (*store.RelayChannel, error)
	// Known reports, from memory, whether token names a channel (see [Cache.Known]).
	Known(token string) bool
	MarkDisconnected(ctx context.Context, id uuid.UUID) error
}

// AuthGuard refuses client addresses that presented too many bad credentials
// (internal/authguard).
type AuthGuard interface {
	Check(addr string) (retryAfter time.Duration, ok bool)
	Fail(addr string)
}

// Metrics records what the relay did.
type Metrics interface {
	// Answered counts one relay call by outcome (one of [Outcomes]).
	Answered(outcome Outcome)
	// UpstreamLatency records the time from forwarding a call to the upstream's answer.
	UpstreamLatency(d time.Duration)
	// MediaBytes counts media bytes relayed in a direction ("download", "upload").
	MediaBytes(direction string, n int64)
	// MediaFirstByte records a download's time from the caller's request to the media host's
	// answer (both upstream calls).
	MediaFirstByte(d time.Duration)
}

// Relay serves calls made with channel tokens (docs/relay.md): it authenticates the token, checks
// the path against the channel's scope, admits the call (rate limit, idempotency claim),
// swaps the token for the channel's upstream access token, sends the call upstream and looks
// at the answer only where it must (a dead token, objects handed to the channel, paging
// links). It is plain net/http code; the Caddy module is a thin adapter around it.
type Relay struct {
	// Channels resolves tokens. Required.
	Channels Channels
	// Objects records object ids handed to channels. Required.
	Objects ObjectAdmitter
	// Admission is the rate limit and idempotency claim. Required.
	Admission Admission
	// Guard refuses addresses flooding bad tokens. Optional.
	Guard AuthGuard
	// UpstreamBase is the upstream's base path (its version segment, e.g. "/v26.0"), put in
	// front of every forwarded path.
	UpstreamBase string
	// ProxyBase returns {proxy_url} for a request whose path relative to {proxy_url} is
	// relayPath: where rewritten paging links point. Default: the request's origin.
	ProxyBase func(r *http.Request, relayPath string) string
	// Authenticated, if set, is called with each authenticated request and its channel.
	Authenticated func(r *http.Request, ch *store.RelayChannel)
	// Pending tracks the work left after a caller got its answer (storing a send's answer for
	// replays), each in its own goroutine, so that whoever stops the relay can wait for it
	// (Pending.Wait). Optional: nil leaves that work untracked.
	Pending *Pending
	// MediaClient fetches media bytes from the URL the upstream's media object names (the media
	// host; never a URL from the caller). Default: a client with a 30 s response-header timeout.
	MediaClient *http.Client
	// Metrics records outcomes. Optional.
	Metrics Metrics
	// CallLog records every call on the send path (`POST …/messages`) and every refusal of one
	// whose token names a channel ([Call]). Optional: nil logs nothing and costs nothing.
	CallLog CallLog
	// Logger gets the relay's warnings. No token and no upstream URL is ever logged. Optional.
	Logger *zap.Logger
	// Windows tells the customer-service window of a send's recipient, from memory ([Windows]).
	// Optional: nil sends no Wabarelay-Window header and refuses nothing (relay/window.go).
	Windows WindowLookup
	// WindowGuard is what the relay does with the window: GuardAnnotate (the zero value's
	// meaning too), GuardEnforce or GuardOff.
	WindowGuard WindowGuard
}

// Serve answers one relay call, sending it upstream through up when it passes every check.
func (relay *Relay) Serve(w http.ResponseWriter, r *http.Request, up Upstream) {
	var start time.Time // the call's arrival, for the call log
	if relay.CallLog != nil {
		start = time.Now()
	}
	isSend := r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/messages")
	ch, status, outcome := relay.authenticate(w, r)
	if status != 0 || ch == nil {
		// A refusal of a send by a known channel (inactive, disconnected) is logged; one of a
		// path outside its scope is not a send.
		if ch != nil && isSend && outcome != OutcomeForbidden && relay.CallLog != nil {
			relay.record(&Call{Status: status, Outcome: outcome}, ch, start)
		}
		return
	}
	if relay.Authenticated != nil {
		relay.Authenticated(r, ch)
	}
	guard, status := relay.cleanRequest(w, r)
	if status != 0 {
		if isSend && relay.CallLog != nil {
			relay.record(&Call{Status: status, Outcome: OutcomeInvalidRequest}, ch, start)
		}
		return
	}
	if isSend {
		relay.send(w, r, ch, up, start)
		return
	}
	if !relay.allow(w, r, ch) {
		return
	}
	upath := UpstreamPath(r.URL.Path)
	if id, ok := downloadOf(r.Method, upath); ok {
		relay.download(w, r, ch, id, up)
		return
	}
	var uploaded *countingReader
	if r.Method == http.MethodPost && handsObjects(ch, r.Method, upath) == store.ObjectMedia && r.Body != nil {
		uploaded = &countingReader{r: r.Body}
		r.Body = uploaded
	}
	o := relay.forward(w, r, ch, up, false, guard, false)
	if uploaded != nil && relay.Metrics != nil {
		relay.Metrics.MediaBytes("upload", uploaded.n)
	}
	if o.aborted {
		panic(http.ErrAbortHandler)
	}
}

// authenticate resolves the caller's channel and checks its status and the path's scope, all
// from memory in the common case. When the call goes no further, it answers the caller itself
// and returns the status and outcome of its refusal (status 0 and no channel: the caller went
// away); ch is the channel whenever the token named one.
func (relay *Relay) authenticate(w http.ResponseWriter, r *http.Request) (ch *store.RelayChannel, status int, outcome Outcome) {
	authz := r.Header.Get("Authorization")
	if authz == "" {
		return nil, relay.refuse(w, OutcomeUnauthorized, http.StatusUnauthorized, MsgAuthRequired), OutcomeUnauthorized
	}
	scheme, token, _ := strings.Cut(authz, " ")
	token = strings.TrimSpace(token)
	wellFormed := strings.EqualFold(scheme, "Bearer") && store.ValidChannelToken(token)
	// An address that presented too many bad tokens is refused before any lookup, unless its
	// token is one the cache knows (a shared address must not lock a valid caller out).
	addr := httpx.ClientAddr(r)
	if relay.Guard != nil {
		if retry, ok := relay.Guard.Check(addr); !ok && !(wellFormed && relay.Channels.Known(token)) {
			w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
			return nil, relay.refuse(w, OutcomeAuthThrottled, http.StatusTooManyRequests, httpx.MsgRateLimited), OutcomeAuthThrottled
		}
	}
	err := ErrUnknownToken
	if wellFormed {
		ch, err = relay.Channels.Lookup(r.Context(), token)
	}
	switch {
	case errors.Is(err, ErrUnknownToken):
		if relay.Guard != nil {
			relay.Guard.Fail(addr)
		}
		return nil, relay.refuse(w, OutcomeUnauthorized, http.StatusUnauthorized, MsgInvalidToken), OutcomeUnauthorized
	case err != nil:
		if r.Context().Err() != nil {
			return nil, 0, "" // the caller went away
		}
		relay.logger().Warn("relay: channel lookup failed", zap.Error(err))
		w.Header().Set("Retry-After", "5")
		return nil, relay.refuse(w, OutcomeUnavailable, http.StatusServiceUnavailable, httpx.MsgUnavailable), OutcomeUnavailable
	case ch.Status != "active":
		return ch, relay.refuse(w, OutcomeInactive, http.StatusForbidden, MsgNotActive), OutcomeInactive
	case ch.Disconnected:
		return ch, relay.refuse(w, OutcomeDisconnected, http.StatusServiceUnavailable, MsgDisconnected), OutcomeDisconnected
	}
	// The path's shape, then the channel's own ids and objects.
	if CheckPath(r.URL.Path, r.URL.RawPath) != nil || !InScope(ch, UpstreamPath(r.URL.Path)) {
		return ch, relay.refuse(w, OutcomeForbidden, http.StatusForbidden, MsgPathNotAllowed), OutcomeForbidden
	}
	return ch, 0, ""
}

// allow counts a call without an idempotency key against the channel's limit, answering 429
// when it is over.
func (relay *Relay) allow(w http.ResponseWriter, r *http.Request, ch *store.RelayChannel) bool {
	d, decided := relay.admit(r.Context(), ch)
	if !decided {
		return true
	}
	d.SetHeaders(w.Header())
	if !d.Allowed {
		relay.refuse(w, OutcomeRateLimited, http.StatusTooManyRequests, httpx.MsgRateLimited)
		return false
	}
	return true
}

// admit counts a call without an idempotency key against the channel's limit. A limiter that
// cannot decide lets the call through (logged): decided is false and d allows.
func (relay *Relay) admit(ctx context.Context, ch *store.RelayChannel) (d ratelimit.Decision, decided bool) {
	d, err := relay.Admission.Allow(ctx, ch.ID)
	if err != nil {
		relay.logger().Warn("relay: rate limiter failed; call allowed", zap.Error(err))
		return ratelimit.Decision{Allowed: true}, false
	}
	return d, true
}

// send relays a `POST …/messages`: its body's idempotency_key (and any access_token of the
// caller's) is taken out and, when a key is present, at most one upstream send happens per
// (channel, key); repeats replay the stored answer. Once a send has started it runs to its end
// even if the caller hangs up, so that its real answer is stored and replayed to the caller's
// retry. Every exit that answers is recorded in the call log, if any (start: the call's
// arrival).
func (relay *Relay) send(w http.ResponseWriter, r *http.Request, ch *store.RelayChannel, up Upstream, start time.Time) {
	var c Call // what the call log records: each exit sets its status and outcome
	logged := relay.CallLog != nil
	if logged {
		defer relay.record(&c, ch, start)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxSendBody))
	if err != nil {
		// Nothing was sent: the body is too large, or the caller went away before it arrived.
		c.Outcome = OutcomeInvalidRequest
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			c.Status = relay.refuse(w, c.Outcome, http.StatusRequestEntityTooLarge, MsgBodyTooLarge)
		} else if errors.Is(err, errFormAccessToken) {
			c.Status = relay.refuse(w, c.Outcome, http.StatusBadRequest, MsgFormAccessToken)
		} else {
			c.Status = relay.refuse(w, c.Outcome, http.StatusBadRequest, MsgBodyUnreadable)
		}
		return
	}
	if logged {
		c.Recipient = recipientOf(body)
	}
	winState, refuseWindow := relay.sendWindow(r, ch, body) // relay/window.go
	if winState != "" {
		w.Header().Set(WindowHeader, string(winState))
	}
	stripped, key, found, err := cleanSendBody(body) // the key out, and a caller's access_token
	if err != nil {
		c.Status, c.Outcome = relay.refuse(w, OutcomeInvalidRequest, http.StatusUnprocessableEntity, err.Error()), OutcomeInvalidRequest
		return
	}
	if found && (key == "" || len(key) > maxKeyLen) {
		c.Status, c.Outcome = relay.refuse(w, OutcomeInvalidRequest, http.StatusUnprocessableEntity, MsgIdemKeyLength), OutcomeInvalidRequest
		return
	}
	c.IdempotencyKey = key
	if refuseWindow { // before the limit and the key's claim: neither is consumed
		c.Status, c.Outcome, c.ErrorCode = relay.refuseReengagement(w), OutcomeWindowClosed, CodeReengagement
		return
	}
	setBody(r, stripped)
	sendCtx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), SendDeadline)
	defer cancel()
	if !found {
		if relay.allow(w, r, ch) {
			o := relay.forward(w, r.WithContext(sendCtx), ch, up, false, nil, logged)
			c.Status, c.Outcome, c.ErrorCode, c.ErrorSubcode, c.WAMID = o.status, o.outcome, o.errCode, o.errSubcode, o.wamid
			if o.aborted {
				panic(http.ErrAbortHandler)
			}
			flushAnswer(w, r) // before the call log's record (deferred)
		} else {
			c.Status, c.Outcome = http.StatusTooManyRequests, OutcomeRateLimited
		}
		return
	}

	fp := idempotency.Fingerprint(r.Method, UpstreamPath(r.URL.Path), r.URL.RawQuery, stripped)
	d, res, err := relay.Admission.Claim(r.Context(), ch.ID, key, fp)
	if err != nil {
		if r.Context().Err() != nil {
			return // the caller went away
		}
		relay.logger().Warn("relay: idempotency store unavailable; send with a key refused", zap.Error(err))
		w.Header().Set("Retry-After", "5")
		c.Status, c.Outcome = relay.refuse(w, OutcomeIdempotencyUnavailable, http.StatusServiceUnavailable, MsgIdemUnavailable), OutcomeIdempotencyUnavailable
		return
	}
	d.SetHeaders(w.Header())
	if !d.Allowed {
		c.Status, c.Outcome = relay.refuse(w, OutcomeRateLimited, http.StatusTooManyRequests, httpx.MsgRateLimited), OutcomeRateLimited
		return
	}
	switch res.Outcome {
	case idempotency.Replay:
		resp := *res.Response
		if !ValidStatus(resp.Status) {
			resp = relayAnswer(http.StatusBadGateway, MsgUpstreamDown) // a record from before this check
		}
		w.Header().Set("Idempotent-Replayed", "true")
		writeStored(w, resp)
		relay.count(OutcomeReplayed)
		c.Status, c.Outcome, c.Replayed = resp.Status, OutcomeReplayed, true
		if logged {
			c.WAMID, c.ErrorCode, c.ErrorSubcode = answerFacts(resp.Status, resp.Body)
		}
		return
	case idempotency.InProgress:
		w.Header().Set("Retry-After", "1")
		c.Status, c.Outcome = relay.refuse(w, OutcomeIdempotencyConflict, http.StatusConflict, MsgIdemInProgress), OutcomeIdempotencyConflict
		return
	case idempotency.Mismatch:
		c.Status, c.Outcome = relay.refuse(w, OutcomeIdempotencyConflict, http.StatusUnprocessableEntity, MsgIdemMismatch), OutcomeIdempotencyConflict
		return
	}

	o := relay.forward(w, r.WithContext(sendCtx), ch, up, true, nil, logged)
	c.Status, c.Outcome, c.ErrorCode, c.ErrorSubcode, c.WAMID = o.status, o.outcome, o.errCode, o.errSubcode, o.wamid
	if logged {
		c.Latency = time.Since(start) // answered; the key's release or store follows
	}
	if ReleaseKey(o.status, o.answered, o.notSent) {
		// Synchronously, so that the caller's retry finds the key free.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), storeTimeout)
		if err := relay.Admission.Release(ctx, ch.ID, key, res.Token); err != nil && !errors.Is(err, idempotency.ErrNotOwner) {
			relay.logger().Warn("relay: releasing an idempotency key failed", zap.Error(err))
		}
		cancel()
	} else {
		// The answer goes to the caller now; storing it for replays is off the critical path.
		// Duplicates arriving meanwhile wait on the claim and are woken when it is stored.
		if !o.aborted {
			flushAnswer(w, r)
		}
		resp := o.stored
		relay.background(func() {
			ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
			defer cancel()
			if err := relay.Admission.Complete(ctx, ch.ID, key, res.Token, resp); err != nil {
				relay.logger().Warn("relay: storing a send's answer failed", zap.Error(err))
			}
		})
	}
	if o.aborted {
		panic(http.ErrAbortHandler)
	}
}

// flushAnswer sends the answer written so far to the caller at once, instead of when the
// handler returns (net/http holds up to 4 KiB until then), so that the bookkeeping after a send
// — the call log's record, storing the answer for replays, each waking a goroutine — is not
// part of the caller's wait. Only an answer of known length is flushed: flushing one without
// would make it chunked, a second write at the end. Only over HTTP/1: an HTTP/2 stream would
// end with a frame of its own after the flush, and its caller waits for that end anyway. A key
// released after the send is released before its answer is flushed (the caller's retry must
// find it free), so that path does not call it.
func flushAnswer(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 1 || w.Header().Get("Content-Length") == "" {
		return
	}
	_ = http.NewResponseController(w).Flush() // a failed flush is the caller gone; nothing to do
}

// forwarded is what came of forwarding one call.
type forwarded struct {
	// status is the status of the answer (the upstream's or the relay's; 0 if none).
	status int
	// answered: the answer is the upstream's own (passed on or rewritten).
	answered bool
	// notSent: the upstream provably did not act on the call (never reached, or it refused
	// the access token).
	notSent bool
	// cut: the upstream's answer was cut short after it began (whether it acted is unknown).
	cut bool
	// aborted: the answer was cut off while streaming (the caller must see it broken).
	aborted bool
	// stored is the answer to store for replays (forward with capture only).
	stored idempotency.Response
	// outcome is the call's outcome, as counted.
	outcome Outcome
	// wamid, errCode and errSubcode are what the call log keeps of the upstream's answer
	// (forward with facts only; see answerFacts).
	wamid               string
	errCode, errSubcode int
}

// forward sends the call upstream with the channel's access token and passes the answer on,
// inspecting it only where needed. With capture, the answer is also kept for replays. guard,
// if set, is the multipart body's: a body it refused is answered 400. With facts, the answer's
// wamid or error code is read for the call log (a passed-through answer is peeked at, up to
// maxPeek bytes).
func (relay *Relay) forward(w http.ResponseWriter, r *http.Request, ch *store.RelayChannel, up Upstream, capture bool, guard *formGuard, facts bool) forwarded {
	relayPath, upath := r.URL.Path, UpstreamPath(r.URL.Path)
	relay.prepare(r, ch, upath)
	a := newAnswer(w, r.Method, upath, ch, capture)
	a.relay, a.req, a.relayPath = relay, r, relayPath
	if facts && !capture {
		a.peek, a.copyLimit = true, maxPeek
	}
	defer a.free()
	start := time.Now()
	err, aborted := call(up, a, r)
	upErr := err
	if aborted {
		upErr = http.ErrAbortHandler
	}
	if ferr := a.finish(upErr); ferr != nil && a.written() {
		aborted = true // a body that could not be decoded or masked: the caller sees it broken
	}
	if relay.Metrics != nil {
		relay.Metrics.UpstreamLatency(time.Since(start))
	}
	var o forwarded
	switch {
	case guard != nil && guard.refused && !a.written():
		// The body was cut off before its access_token field: the upstream got no whole request.
		o = forwarded{status: http.StatusBadRequest, notSent: true, outcome: OutcomeInvalidRequest}
		relay.refuse(w, OutcomeInvalidRequest, http.StatusBadRequest, MsgFormAccessToken)
	case a.refused || a.undecodable:
		// Nothing of the answer was passed on: the relay answers in its place.
		o = forwarded{status: http.StatusBadGateway, stored: relayAnswer(http.StatusBadGateway, MsgUpstreamEncoding), outcome: OutcomeUpstreamError}
		relay.logger().Warn("relay: upstream answer in an encoding the relay cannot decode; refused")
		relay.refuse(w, OutcomeUpstreamError, http.StatusBadGateway, MsgUpstreamEncoding)
	case aborted || err != nil && a.written():
		// The answer was cut short after it began: whether the upstream acted is unknown.
		o = forwarded{status: a.status, aborted: aborted, cut: true, outcome: OutcomeUpstreamError}
		if capture {
			o.stored = relayAnswer(http.StatusBadGateway, MsgUpstreamDown)
		}
		relay.count(OutcomeUpstreamError)
	case err != nil:
		o = relay.upstreamFailed(w, r, err, capture)
	case a.state == inspecting:
		if facts {
			o.wamid, o.errCode, o.errSubcode = answerFacts(a.status, a.buf.Bytes())
		}
		o = relay.inspected(w, r, ch, relayPath, upath, a, capture, o)
	case a.state == undecided:
		// The upstream wrote nothing at all: no answer to pass on or to trust.
		o = forwarded{status: http.StatusBadGateway, stored: relayAnswer(http.StatusBadGateway, MsgUpstreamDown), outcome: OutcomeUpstreamError}
		relay.logger().Warn("relay: the upstream call ended without an answer")
		relay.refuse(w, OutcomeUpstreamError, http.StatusBadGateway, MsgUpstreamDown)
	default: // passed through
		o = forwarded{status: a.status, answered: true, outcome: outcomeOf(a.status)}
		if facts && !a.copyFailed {
			o.wamid, o.errCode, o.errSubcode = answerFacts(a.status, a.copy.Bytes())
		}
		if capture {
			if a.copyFailed {
				o.stored = relayAnswer(http.StatusBadGateway, MsgUpstreamDown)
			} else {
				o.stored = idempotency.Response{Status: a.status, Header: replayHeaders(a.hdr), Body: bytes.Clone(a.copy.Bytes())}
			}
		}
		relay.count(o.outcome)
	}
	return o
}

// prepare makes r a call of upath on the upstream with the channel's access token: the
// caller's credentials removed, any access_token query parameter dropped.
func (relay *Relay) prepare(r *http.Request, ch *store.RelayChannel, upath string) {
	r.Header.Set("Authorization", "Bearer "+ch.UpstreamToken)
	r.Header.Del("X-Api-Key")
	r.Header.Del("Cookie")
	if r.Method == http.MethodGet {
		// Reads can be large (template lists): the transport negotiates compression with the
		// upstream and decodes it itself.
		r.Header.Del("Accept-Encoding")
	} else {
		// Writes answer a few hundred bytes of JSON: compressing them costs both ends more than
		// it saves.
		r.Header.Set("Accept-Encoding", "identity")
	}
	r.URL.RawQuery, _ = cleanQuery(r.URL.RawQuery) // a query that does not parse is refused before; "" here
	r.URL.Path = relay.UpstreamBase + upath
	r.URL.RawPath = ""
}

// call runs up, turning reverse_proxy's abort of a stream into a flag.
func call(up Upstream, w http.ResponseWriter, r *http.Request) (err error, aborted bool) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			aborted = true
		}
	}()
	return up(w, r), false
}

// upstreamFailed answers a call whose upstream request failed before any answer: 504 for a
// timeout, else 502. A failure to connect means nothing was sent.
func (relay *Relay) upstreamFailed(w http.ResponseWriter, r *http.Request, err error, capture bool) forwarded {
	o := forwarded{status: http.StatusBadGateway, outcome: OutcomeUpstreamError}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		o.notSent = true
	}
	msg := MsgUpstreamDown
	if errors.Is(err, ErrUpstreamTimeout) || errors.Is(err, context.DeadlineExceeded) {
		o.status, msg = http.StatusGatewayTimeout, MsgUpstreamTimeout
	}
	if capture {
		o.stored = relayAnswer(o.status, msg)
	} else if r.Context().Err() != nil {
		return o // the caller went away
	}
	relay.logger().Warn("relay: upstream request failed", zap.Int("status", o.status), zap.Error(err))
	relay.refuse(w, OutcomeUpstreamError, o.status, msg)
	return o
}

// inspected finishes an answer that was buffered: a dead access token becomes 503
// CHANNEL_DISCONNECTED (the channel is marked), objects it hands to the channel are recorded,
// paging links are rewritten, and the result goes to the caller.
// o holds what the call log keeps of the answer, if anything.
func (relay *Relay) inspected(w http.ResponseWriter, r *http.Request, ch *store.RelayChannel, relayPath, upath string, a *answer, capture bool, o forwarded) forwarded {
	body, status := a.buf.Bytes(), a.status
	if TokenDead(status, body) {
		relay.disconnected(w, r, ch)
		o.status, o.notSent, o.outcome = http.StatusServiceUnavailable, true, OutcomeDisconnected
		return o
	}
	if kind, ids := Handed(ch, r.Method, upath, status, body); len(ids) > 0 {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), storeTimeout)
		err := Admit(ctx, relay.Objects, ch, kind, ids)
		cancel()
		if err != nil {
			relay.logger().Warn("relay: recording object ids failed", zap.Error(err))
		}
	}
	hdr := a.hdr
	out := RewriteLinks(body, a.base, ch.UpstreamToken)
	if r.Method == http.MethodGet && status/100 == 2 && !strings.Contains(strings.Trim(upath, "/"), "/") {
		// A media object: its url (on the media host, usable only with the upstream token)
		// becomes the relay's download URL of the medium.
		out = rewriteMediaURL(out, a.base+"/"+FirstSegment(upath)+"/"+mediaDownload)
	}
	if len(out) != len(body) || !bytes.Equal(out, body) {
		// A rewritten body is the relay's answer: the upstream's validators and authentication
		// challenge no longer describe it.
		body = out
		hdr.Del("Etag")
		hdr.Del("Www-Authenticate")
	}
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	hdr.Del("Content-Encoding")
	a.passHeader()
	w.WriteHeader(status)
	w.Write(body)
	o.status, o.answered, o.outcome = status, true, outcomeOf(status)
	relay.count(o.outcome)
	if capture {
		o.stored = idempotency.Response{Status: status, Header: replayHeaders(hdr), Body: bytes.Clone(body)}
	}
	return o
}

// disconnected answers 503 CHANNEL_DISCONNECTED for a channel whose access token the upstream
// rejected (code 190), and marks the channel.
func (relay *Relay) disconnected(w http.ResponseWriter, r *http.Request, ch *store.RelayChannel) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), storeTimeout)
	err := relay.Channels.MarkDisconnected(ctx, ch.ID)
	cancel()
	if err != nil {
		relay.logger().Error("relay: recording a dead upstream token failed", zap.Error(err))
	}
	relay.logger().Warn("relay: upstream rejected the channel's access token (code 190); channel disconnected",
		zap.String("channel_id", ch.ID.String()))
	relay.refuse(w, OutcomeDisconnected, http.StatusServiceUnavailable, MsgDisconnected)
}

// refuse writes the relay's own error answer, counts it and returns its status.
func (relay *Relay) refuse(w http.ResponseWriter, outcome Outcome, status int, msg string) int {
	httpx.WriteError(w, status, msg)
	relay.count(outcome)
	return status
}

func (relay *Relay) count(outcome Outcome) {
	if relay.Metrics != nil {
		relay.Metrics.Answered(outcome)
	}
}

func (relay *Relay) logger() *zap.Logger {
	if relay.Logger == nil {
		return zap.NewNop()
	}
	return relay.Logger
}

// background runs f, work left after a caller got its answer, in its own goroutine, tracked
// by relay.Pending; a panic of f is logged.
func (relay *Relay) background(f func()) {
	p := relay.Pending
	if p != nil {
		p.start()
	}
	go func() {
		if p != nil {
			defer p.finish()
		}
		defer func() {
			if v := recover(); v != nil {
				relay.logger().Error("relay: background work panicked", zap.Any("panic", v))
			}
		}()
		f()
	}()
}

func (relay *Relay) proxyBase(r *http.Request, relayPath string) string {
	if relay.ProxyBase != nil {
		return relay.ProxyBase(r, relayPath)
	}
	return httpx.Origin(r)
}

func outcomeOf(status int) Outcome {
	switch {
	case status < 400:
		return OutcomeOK
	case status < 500:
		return OutcomeUpstream4xx
	default:
		return OutcomeUpstream5xx
	}
}

// relayAnswer is the relay's own error answer, as written by httpx.WriteError and stored for
// replays.
func relayAnswer(status int, msg string) idempotency.Response {
	return idempotency.Response{Status: status, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"error":` + strconv.Quote(msg) + "}\n")}
}

// writeStored writes a stored answer. Its own headers are only those worth replaying.
func writeStored(w http.ResponseWriter, resp idempotency.Response) {
	h := w.Header()
	for name, vals := range resp.Header {
		h[name] = vals
	}
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	w.Write(resp.Body)
}

// replayHeaders picks the answer's headers worth replaying.
func replayHeaders(h http.Header) http.Header {
	out := make(http.Header, 4)
	for _, name := range []string{"Content-Type", "X-Fb-Trace-Id", "X-Fb-Request-Id", "Www-Authenticate"} {
		if v := h[name]; len(v) > 0 {
			out[name] = v
		}
	}
	return out
}

func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}
