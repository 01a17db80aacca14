package relay

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
)

// Caller credentials in a request other than its Authorization header: an access_token in the
// query, in a form body or as a multipart field would reach the upstream next to (and possibly
// instead of) the channel's token. The relay strips them from the query and from
// application/x-www-form-urlencoded bodies, and refuses a multipart body carrying one (an upload
// streams through unbuffered; the relay does not rewrite it). A query or form that does not
// parse unambiguously is refused: the relay could not tell what it carries.

// accessTokenParam is the parameter the upstream takes an access token from.
const accessTokenParam = "access_token"

// cleanQuery returns the query q without access_token parameters, and false when q does not
// parse (a bad %-escape, a ';' separator that servers read differently). A query without '%',
// ';' or "access_token" is returned as it is, unparsed.
func cleanQuery(q string) (string, bool) {
	if !strings.ContainsAny(q, "%;") && !strings.Contains(q, accessTokenParam) {
		return q, true
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return "", false
	}
	if _, ok := vals[accessTokenParam]; !ok {
		return q, true // kept byte for byte
	}
	vals.Del(accessTokenParam)
	return vals.Encode(), true
}

// errFormAccessToken fails the read of a multipart body that carries an access_token field.
var errFormAccessToken = errors.New("relay: access_token field in a multipart body")

// errFormHeader fails the read of a multipart body with a part header block too large to check.
var errFormHeader = errors.New("relay: multipart part header too large")

// cleanRequest removes the caller's access_token from the query and a form body, answering 400
// (413 for a form body too large) itself and returning that status when either does not parse;
// 0 when the call goes on. A multipart body is wrapped in a [formGuard], returned for the
// caller to tell its refusal.
func (relay *Relay) cleanRequest(w http.ResponseWriter, r *http.Request) (*formGuard, int) {
	if r.URL.RawQuery != "" {
		q, ok := cleanQuery(r.URL.RawQuery)
		if !ok {
			return nil, relay.refuse(w, OutcomeInvalidRequest, http.StatusBadRequest, MsgBadQuery)
		}
		r.URL.RawQuery = q
	}
	r.URL.ForceQuery = false
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mt {
	case "application/x-www-form-urlencoded":
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxSendBody))
		if err != nil {
			if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
				return nil, relay.refuse(w, OutcomeInvalidRequest, http.StatusRequestEntityTooLarge, MsgBodyTooLarge)
			}
			return nil, relay.refuse(w, OutcomeInvalidRequest, http.StatusBadRequest, MsgBodyUnreadable)
		}
		q, ok := cleanQuery(string(body))
		if !ok {
			return nil, relay.refuse(w, OutcomeInvalidRequest, http.StatusBadRequest, MsgBadForm)
		}
		if len(q) != len(body) || q != string(body) {
			body = []byte(q)
		}
		setBody(r, body)
	case "multipart/form-data":
		if b := params["boundary"]; b != "" {
			g := &formGuard{r: r.Body, delim: []byte("--" + b), block: -1}
			r.Body = g
			return g, 0
		}
	}
	return nil, 0
}

// maxPartHeader caps the header block of one multipart part the guard reads whole.
const maxPartHeader = 16 << 10

// formGuard streams a multipart body through and fails it (errFormAccessToken) before the
// header block of a part naming access_token — or the bytes after it — is passed on. It holds
// back only what may start a boundary and, at a boundary, the part's header block (at most
// maxPartHeader): memory stays bounded whatever the upload's size. A part whose header names
// access_token anywhere (its name, or a filename containing it; plain or %-escaped, any case)
// is refused: the check errs on the safe side.
type formGuard struct {
	r     io.ReadCloser
	delim []byte // "--" + boundary
	store []byte // pend's array
	pend  []byte // read, not yet returned
	out   int    // pend[:out] may be returned
	scan  int    // where the next boundary is looked for
	block int    // start of the boundary whose part header is being collected, or -1
	eof   bool
	err   error
	// refused: the body carried an access_token field (the read failed with
	// errFormAccessToken).
	refused bool
}

func (g *formGuard) Read(p []byte) (int, error) {
	for g.out == 0 {
		if g.err != nil {
			return 0, g.err
		}
		if g.eof {
			return 0, io.EOF
		}
		if cap(g.pend)-len(g.pend) < 32<<10 { // move pend to the front of its array, or a larger one
			if len(g.pend)+32<<10 > cap(g.store) {
				g.store = make([]byte, len(g.pend)+64<<10)
			}
			g.pend = g.store[:copy(g.store, g.pend)]
		}
		n, err := g.r.Read(g.pend[len(g.pend):cap(g.pend)])
		g.pend = g.pend[:len(g.pend)+n]
		switch {
		case err == io.EOF:
			g.eof = true
		case err != nil:
			g.err = err
		}
		g.advance()
	}
	n := copy(p, g.pend[:g.out])
	g.pend = g.pend[n:]
	g.out -= n
	g.scan -= n
	if g.block >= 0 {
		g.block -= n
	}
	return n, nil
}

// advance moves out (and scan) as far as the bytes read allow.
func (g *formGuard) advance() {
	for {
		if g.block >= 0 {
			end := bytes.Index(g.pend[g.block:], []byte("\r\n\r\n"))
			if end < 0 && !g.eof {
				if len(g.pend)-g.block > maxPartHeader {
					g.fail(errFormHeader)
				}
				return
			}
			if end < 0 {
				end = len(g.pend) - g.block
			}
			if namesAccessToken(g.pend[g.block : g.block+end]) {
				g.fail(errFormAccessToken)
				return
			}
			g.scan = min(len(g.pend), g.block+end+4)
			g.out, g.block = g.scan, -1
		}
		i := bytes.Index(g.pend[g.scan:], g.delim)
		if i < 0 {
			h := holdFrom(g.pend, g.scan, g.delim)
			if g.eof {
				h = len(g.pend)
			}
			g.out, g.scan = h, h
			return
		}
		g.block = g.scan + i
		g.out = g.block
	}
}

func (g *formGuard) fail(err error) {
	g.err, g.out = err, 0
	g.refused = err == errFormAccessToken
}

func (g *formGuard) Close() error { return g.r.Close() }

// namesAccessToken reports a part header block that mentions access_token.
func namesAccessToken(hdr []byte) bool {
	l := bytes.ToLower(hdr)
	return bytes.Contains(l, []byte(accessTokenParam)) || bytes.Contains(l, []byte("access%5ftoken"))
}
