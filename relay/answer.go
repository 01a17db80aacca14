package relay

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/wabarelay/wabarelay/store"
)

// answer is the http.ResponseWriter the upstream writes its answer to. It decides, when the
// status and headers arrive, whether the relay must see the body (inspect) before the caller
// does: if so, the body is buffered up to a cap (beyond it, the answer is passed on as it
// comes, uninspected but for its paging links, rewritten as they stream by a
// [pagingRewriter]); if not, it streams straight through. The upstream's headers are kept apart
// from the caller's until then, so that an answer the relay substitutes carries only the
// relay's own headers. A send with an idempotency key also keeps a copy of what was passed
// through (capture), up to a cap, to store it for replays.
//
// Every body byte bound for the caller passes the redactor (the upstream token masked) and
// every header value is masked too, whatever the answer's size, status or type. An answer in
// an encoding the relay did not ask for is decoded on the way (gzip, deflate; Content-Encoding
// and Content-Length dropped) or, in any other encoding, refused: nothing of it is passed and
// the relay answers 502 [MsgUpstreamEncoding].
type answer struct {
	w   http.ResponseWriter
	hdr http.Header // the upstream's headers
	// What is asked, for mustInspect.
	method, upath string
	ch            *store.RelayChannel
	// Where paging links point ({proxy_url}): base, worked out from the relay, the request and
	// its relay path when the answer is to be inspected. "" (no relay): links are not rewritten.
	relay     *Relay
	req       *http.Request
	relayPath string
	base      string
	status    int
	state     answerState
	buf       bytes.Buffer // the buffered body (inspecting)
	limit     int          // cap of buf

	capture    bool         // keep a copy of what is passed through
	peek       bool         // keep a copy too, for the call log only (a send without a key)
	copy       bytes.Buffer // that copy
	copyLimit  int
	copyFailed bool // the copy outgrew copyLimit and was dropped
	passErr    error

	red         redactor       // what goes to the caller passes it
	pg          pagingRewriter // an answer too large to inspect passes it first (rewriting)
	rewriting   bool           // pg is on
	dec         *decoder       // decodes an encoded answer, in a goroutine of its own; nil if none
	refused     bool           // an encoding the relay cannot decode: nothing is passed
	undecodable bool           // the encoded body could not be decoded (found before anything was passed)
}

// errRefusedEncoding stops the upstream's copy of an answer the relay refused.
var errRefusedEncoding = errors.New("relay: upstream answer in an encoding the relay cannot decode")

type answerState uint8

const (
	undecided answerState = iota
	passing
	inspecting
)

func (a *answer) Header() http.Header { return a.hdr }

func (a *answer) WriteHeader(status int) {
	if a.state != undecided {
		return
	}
	if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		// An informational answer (103 Early Hints): passed on, the final one follows.
		a.passHeader()
		a.w.WriteHeader(status)
		return
	}
	a.status = status
	switch ce := strings.ToLower(strings.TrimSpace(strings.Join(a.hdr.Values("Content-Encoding"), ","))); ce {
	case "", "identity":
	case "gzip", "x-gzip", "deflate":
		a.hdr.Del("Content-Encoding")
		a.hdr.Del("Content-Length")
		a.hdr.Del("Etag") // the validator of the encoded bytes
		a.dec = startDecoder(a, ce)
	default:
		a.refused = true
		return
	}
	if a.mustInspect() {
		a.state = inspecting
		if a.relay != nil {
			a.base = a.relay.proxyBase(a.req, a.relayPath)
		}
		return
	}
	a.pass()
}

// pass sends the upstream's status and headers to the caller; the body follows as it comes.
func (a *answer) pass() {
	a.state = passing
	a.passHeader()
	a.w.WriteHeader(a.status)
}

// passHeader copies the upstream's headers to the caller's, the upstream token masked.
func (a *answer) passHeader() {
	h := a.w.Header()
	for name, vals := range a.hdr {
		h[name] = vals
	}
	if a.ch != nil {
		redactHeader(h, a.ch.UpstreamToken)
	}
}

func (a *answer) Write(p []byte) (int, error) {
	// (a.dec first: while a decoder runs, a.state is its goroutine's; a decoder means decided.)
	if a.dec == nil && a.state == undecided && !a.refused {
		a.WriteHeader(http.StatusOK)
	}
	switch {
	case a.refused:
		return 0, errRefusedEncoding
	case a.dec != nil:
		return a.dec.pw.Write(p) // the decoder's goroutine passes it to sink
	}
	return a.sink(p)
}

// sink takes the (decoded) body: buffered while inspecting, else through the redactor to the
// caller.
func (a *answer) sink(p []byte) (int, error) {
	if a.state == inspecting {
		if need := a.buf.Len() + len(p); need <= a.limit {
			if need > a.buf.Cap() && 2*a.buf.Cap()+len(p) > a.limit/2 {
				// bytes.Buffer would grow to twice its size and more, past half the cap, then
				// maybe past the cap (an answer that turns out too large cost up to 48 MiB of
				// allocations for the 8 MiB held): grow to the cap instead, once.
				grown := make([]byte, a.buf.Len(), a.limit)
				copy(grown, a.buf.Bytes())
				a.buf = *bytes.NewBuffer(grown)
			}
			return a.buf.Write(p)
		}
		// Too large to inspect: what came so far and the rest go to the caller as they come,
		// the paging links rewritten and the token masked on the way.
		a.streamLinks(p)
		a.pass()
		if _, err := a.out(a.buf.Bytes()); err != nil {
			return 0, err
		}
		a.buf.Reset()
	}
	return a.out(p)
}

// out passes body bytes on to the caller: through the paging rewriter when it is on, then
// through the redactor, the last guard.
func (a *answer) out(p []byte) (int, error) {
	if a.rewriting {
		return a.pg.Write(p)
	}
	return a.red.Write(p)
}

// streamLinks turns the paging rewriter on for an answer that was being inspected and turns
// out too large (a.buf, then p, are its first bytes), before its headers pass: its links are
// rewritten as it streams, as [RewriteLinks] would have done had it been buffered. Its length
// may then change, so the upstream's Content-Length and ETag (which describe its bytes) are
// dropped: the caller gets it chunked. Not so for an answer whose first byte is not '{' (no
// top-level paging object, nothing rewritten) or a partial one (Content-Range counts the
// upstream's bytes).
func (a *answer) streamLinks(p []byte) {
	first := firstByte(a.buf.Bytes())
	if first == 0 {
		first = firstByte(p)
	}
	if a.base == "" || first != '{' && first != 0 || a.hdr.Get("Content-Range") != "" {
		return
	}
	a.hdr.Del("Content-Length")
	a.hdr.Del("Etag")
	a.pg.reset(&a.red, a.base)
	a.rewriting = true
}

// firstByte returns the first byte of b that is not JSON white space, or 0 if none.
func firstByte(b []byte) byte {
	for _, c := range b {
		if !ws(c) {
			return c
		}
	}
	return 0
}

// finish ends the answer once the upstream call has returned (upErr is its error, or
// http.ErrAbortHandler for an aborted copy): the
// decoder, if any, reads to the end, and what the redactor held back is passed on. It
// reports a body that could not be decoded or masked; the answer is then broken.
func (a *answer) finish(upErr error) error {
	var err error
	if d := a.dec; d != nil {
		if upErr != nil {
			d.pw.CloseWithError(upErr)
		} else {
			_ = d.pw.Close() // a pipe's Close returns nil
		}
		<-d.done
		a.dec = nil
		// A decoding error of its own (not the upstream's failure passed through the pipe)
		// found before anything was passed: the relay answers in its place.
		if err = d.err; err != nil && a.state == inspecting && (upErr == nil || !errors.Is(err, upErr)) {
			a.undecodable = true
		}
	}
	if a.state == passing {
		// A failed write is the caller's hang-up, seen as such already.
		if a.rewriting {
			_ = a.pg.flush()
		}
		_ = a.red.flush()
	}
	return err
}

// toCaller is the redactor's destination: [answer.write].
type toCaller answer

func (c *toCaller) Write(p []byte) (int, error) { return (*answer)(c).write(p) }

// write passes p to the caller and to the copy. When a copy is kept (a send), a caller that
// went away does not stop the answer: it is read to its end, so that it can be stored and
// replayed to the caller's retry.
func (a *answer) write(p []byte) (int, error) {
	if (a.capture || a.peek) && !a.copyFailed {
		if a.copy.Len()+len(p) > a.copyLimit {
			a.copyFailed = true
			a.copy.Reset()
		} else {
			a.copy.Write(p)
		}
	}
	if a.passErr != nil {
		return len(p), nil // capturing for a caller that is gone
	}
	n, err := a.w.Write(p)
	if err != nil {
		a.passErr = err
		if a.capture {
			return len(p), nil
		}
	}
	return n, err
}

// ReadFrom keeps io.Copy from bypassing Write.
func (a *answer) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{a}, r)
}

// Flush passes a flush on once the answer streams (reverse_proxy flushes streamed answers).
// A decoded answer is written by its decoder's goroutine: it is flushed when it ends. (a.dec is
// tested first: while a decoder runs, a.state is its goroutine's to change.)
func (a *answer) Flush() {
	if a.dec == nil && a.state == passing {
		// Flush has no error to give: a failed flush is the caller gone, which the next
		// write reports (FlushError passes it on).
		_ = http.NewResponseController(a.w).Flush()
	}
}

// FlushError is Flush for http.ResponseController.
func (a *answer) FlushError() error {
	if a.dec == nil && a.state == passing {
		return http.NewResponseController(a.w).Flush()
	}
	return nil
}

// written reports whether anything (status, headers) went to the caller.
func (a *answer) written() bool { return a.state == passing }

// mustInspect says whether the relay must see the answer before the caller does: JSON errors
// (a dead token, code 190; and the last guard against the upstream token appearing in an
// answer), and JSON successes of reads (paging links) and of calls that hand objects to the
// channel. Every other answer — a successful send above all — streams straight through.
func (a *answer) mustInspect() bool {
	switch {
	case a.status >= 400:
	case a.status >= 200 && a.status < 300 && (a.method == http.MethodGet || handsObjects(a.ch, a.method, a.upath) != ""):
	default:
		return false
	}
	return isJSON(a.hdr.Get("Content-Type"))
}

// isJSON reports a JSON media type (application/json, */*+json) or the text/javascript the
// upstream has used for JSON.
func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "application/json" || strings.HasSuffix(mt, "+json") || mt == "text/javascript"
}

// answers recycles answer writers; their buffers are kept when small.
var answers = sync.Pool{New: func() any { return new(answer) }}

// newAnswer returns a writer for the answer to a call to upath by ch, passed on to w.
func newAnswer(w http.ResponseWriter, method, upath string, ch *store.RelayChannel, capture bool) *answer {
	a := answers.Get().(*answer)
	a.w, a.hdr, a.method, a.upath, a.ch = w, make(http.Header, 8), method, upath, ch
	a.limit, a.capture, a.copyLimit = maxInspectBody, capture, maxStoredBody
	secret := ""
	if ch != nil {
		secret = ch.UpstreamToken
	}
	a.red.reset((*toCaller)(a), secret)
	return a
}

// free returns a to the pool; nothing of it may be used afterwards.
func (a *answer) free() {
	const keep = 64 << 10
	if a.dec != nil { // an answer left unfinished: its decoder must not outlive it
		_ = a.finish(errRefusedEncoding) // abandoned: no one is left to answer
	}
	buf, cp, red, pg := a.buf, a.copy, a.red, a.pg
	*a = answer{}
	if cap(red.held)+cap(red.work) <= keep {
		a.red.held, a.red.work = red.held[:0], red.work[:0]
	}
	if cap(pg.held) <= keep {
		a.pg.key, a.pg.held = pg.key[:0], pg.held[:0]
	}
	if buf.Cap() <= keep {
		buf.Reset()
		a.buf = buf
	}
	if cp.Cap() <= keep {
		cp.Reset()
		a.copy = cp
	}
	answers.Put(a)
}

// decoder decodes an encoded answer body as the upstream writes it: the upstream's writes go
// into a pipe, a goroutine reads the decoded bytes and hands them to the answer's sink (which
// is then used by that goroutine alone until [answer.finish] waits for it).
type decoder struct {
	pw   *io.PipeWriter
	done chan struct{}
	err  error // set before done closes
}

func startDecoder(a *answer, encoding string) *decoder {
	pr, pw := io.Pipe()
	d := &decoder{pw: pw, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		d.err = decode(pr, encoding, a)
		if d.err != nil {
			pr.CloseWithError(d.err) // the upstream's writes fail from now on
		} else {
			// Trailing bytes after the encoded stream; an error here is the upstream's own,
			// which the caller of the upstream sees.
			_, _ = io.Copy(io.Discard, pr)
		}
	}()
	return d
}

// decode copies the decoded body of r to a's sink. An empty body (HEAD, 204, 304) is no error.
func decode(r io.Reader, encoding string, a *answer) error {
	cr := &countingReader{r: io.NopCloser(r)}
	var dr io.ReadCloser
	var err error
	if encoding == "deflate" {
		dr, err = zlib.NewReader(cr)
	} else {
		dr, err = gzip.NewReader(cr)
	}
	if err != nil {
		if err == io.EOF && cr.n == 0 {
			return nil
		}
		return err
	}
	defer dr.Close()
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	_, err = io.CopyBuffer(sinkWriter{a}, dr, *buf)
	return err
}

// sinkWriter hands decoded bytes to the answer's sink (io.CopyBuffer uses the buffer given).
type sinkWriter struct{ a *answer }

func (s sinkWriter) Write(p []byte) (int, error) { return s.a.sink(p) }
