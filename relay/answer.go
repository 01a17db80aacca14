package relay

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/wabarelay/wabarelay/store"
)

// answer is the http.ResponseWriter the upstream writes its answer to. It decides, when the
// status and headers arrive, whether the relay must see the body (inspect) before the caller
// does: if so, the body is buffered up to a cap (beyond it, the answer is passed on as it is,
// uninspected); if not, it streams straight through. The upstream's headers are kept apart
// from the caller's until then, so that an answer the relay substitutes carries only the
// relay's own headers. A send with an idempotency key also keeps a copy of what was passed
// through (capture), up to a cap, to store it for replays.
type answer struct {
	w   http.ResponseWriter
	hdr http.Header // the upstream's headers
	// What is asked, for mustInspect.
	method, upath string
	ch            *store.RelayChannel
	status        int
	state         answerState
	buf           bytes.Buffer // the buffered body (inspecting)
	limit         int          // cap of buf

	capture    bool         // keep a copy of what is passed through
	copy       bytes.Buffer // that copy
	copyLimit  int
	copyFailed bool // the copy outgrew copyLimit and was dropped
	passErr    error
}

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
	if a.mustInspect() {
		a.state = inspecting
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

func (a *answer) passHeader() {
	h := a.w.Header()
	for name, vals := range a.hdr {
		h[name] = vals
	}
}

func (a *answer) Write(p []byte) (int, error) {
	if a.state == undecided {
		a.WriteHeader(http.StatusOK)
	}
	if a.state == inspecting {
		if a.buf.Len()+len(p) <= a.limit {
			return a.buf.Write(p)
		}
		// Too large to inspect: what came so far and the rest go to the caller untouched.
		a.pass()
		if _, err := a.write(a.buf.Bytes()); err != nil {
			return 0, err
		}
		a.buf.Reset()
	}
	return a.write(p)
}

// write passes p to the caller and to the copy. When a copy is kept (a send), a caller that
// went away does not stop the answer: it is read to its end, so that it can be stored and
// replayed to the caller's retry.
func (a *answer) write(p []byte) (int, error) {
	if a.capture && !a.copyFailed {
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
func (a *answer) Flush() {
	if a.state == passing {
		http.NewResponseController(a.w).Flush()
	}
}

// FlushError is Flush for http.ResponseController.
func (a *answer) FlushError() error {
	if a.state == passing {
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
	return a
}

// free returns a to the pool; nothing of it may be used afterwards.
func (a *answer) free() {
	const keep = 64 << 10
	buf, cp := a.buf, a.copy
	*a = answer{}
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
