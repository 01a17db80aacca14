// Package fakegraph is a faithful fake of the upstream Graph API (WhatsApp Cloud API) for tests,
// benchmarks and the local demo (cmd/fakegraph). The real upstream cannot be reached from test
// machines, so everything the service exchanges with graph.facebook.com is reproduced here with
// the JSON shapes, error envelopes, status codes and headers that Meta's WhatsApp Cloud API and
// Graph API documentation gives. Comments cite the topics as §n: §1 sending messages (§1.5
// response headers, §1.6 the error envelope, §1.7 codes and their HTTP statuses), §2 template
// listing, §3 webhooks (§3.3 incoming messages, §3.4 statuses), §4 Embedded Signup (§4.3 code
// lifetime, §4.4 code exchange, §4.5 subscribed_apps, §4.6 register, §4.7 reading a number),
// §5 versions and rate limits, §7.3 token states (valid, malformed, expired).
//
// A Server is an http.Handler. New returns it unstarted (mount it anywhere, or call ServeHTTP
// directly); Start runs it on 127.0.0.1:0 like httptest.NewServer and returns the base URL, for
// example "http://127.0.0.1:41234". Requests go to "<base>/<version>/...", version v26.0 unless
// WithVersion says otherwise.
//
// Typical use:
//
//	g := fakegraph.New()
//	base := g.Start()
//	defer g.Close()
//	g.AddNumber("106540352242922", "102290129340398", "+1 555-0100", "Lucky Shrub")
//	g.AddToken("EAAtoken", []string{"106540352242922"}, []string{"102290129340398"})
//	g.AddTemplates("102290129340398", fakegraph.Template{Name: "hello_world", Language: "en_US",
//		Status: "APPROVED", Category: "UTILITY"})
//	// ... point the code under test at base + "/v26.0" ...
//	g.FailNext("POST /106540352242922/messages", 1, 0, fakegraph.ErrRateLimitHit()) // 429, code 130429
//	g.RevokeToken("EAAtoken") // later calls: 401, code 190, WWW-Authenticate "invalid_token"
//	sent := g.RequestsTo("POST", "/messages")
//
// Endpoints (all under /<version>/):
//
//	POST   /{phone-number-id}/messages        text and template fully validated; other types minimally
//	GET    /{waba-id}/message_templates       fields, limit, after/before cursors, next/previous links
//	                                          embedding access_token, filters name/status/category/language
//	POST   /{waba-id}/message_templates       create (answers {"id","status":"PENDING","category"})
//	DELETE /{waba-id}/message_templates?name= delete by name
//	GET    /oauth/access_token                Embedded Signup code exchange (client_id, client_secret, code)
//	GET|POST|DELETE /{waba-id}/subscribed_apps
//	POST   /{phone-number-id}/register        6-digit pin; 133005 on PIN mismatch, 133016 after 10 calls
//	POST   /{phone-number-id}/deregister
//	GET    /{phone-number-id}                 fields=display_phone_number,verified_name,...
//	GET    /{waba-id}                         fields=id,name
//	GET    /{waba-id}/phone_numbers
//	GET    /{template-id}
//	POST   /{phone-number-id}/media           multipart upload → {"id"}
//	GET    /{media-id}, DELETE /{media-id}    media URL (served by the fake at /whatsapp_business/attachments/)
//	GET    /debug_token?input_token=          token introspection
//
// Tokens come from "Authorization: Bearer <t>" (or "OAuth <t>") or the access_token query
// parameter, as on the real Graph API. Checks run in Graph's order: version segment (else 400,
// code 2500 "Unknown path components: ..."), token (missing: 401 code 104; unknown: 401 code 190;
// revoked: 190/460; expired: 190/463), object (unknown: 400 code 100 subcode 33
// GraphMethodException "Unsupported <method> request. Object with ID ..."), permission (403,
// code 10 on messaging edges, code 200 elsewhere), then the parameters (400, code 100, or the
// WhatsApp codes 132000/132001/1330xx). Every error answer carries the envelope of §1.6 with
// fbtrace_id equal to the x-fb-request-id header, and WWW-Authenticate: OAuth "Facebook Platform"
// "<invalid_token|invalid_request|insufficient_scope|invalid_code>" "<message>".
//
// Demo endpoints outside the version segment (demo.go): GET /sdk.js and POST /_fake/signup
// (WithDemoSDK: a stand-in for Meta's JS SDK whose Embedded Signup connects a number made up for
// it), POST /_fake/inbound (WithCallback: an incoming message sent signed to the app's callback,
// also Emit and EmitMessage), POST /_fake/account_webhook (WithCallback: one of the four account
// webhooks that change a number's health, accountwebhooks.go, also EmitAccountUpdate), POST
// /_fake/script (upstream errors for the next sends to a recipient, script.go, also Script); with
// WithCallback every accepted message is followed by its "sent",
// "delivered" and "read" status webhooks, or by a "failed" one (131026) for an undeliverable
// recipient (statuses.go: WithStatusOrder, WithUndeliverable, WithStatusDelay).
//
// Bodies are written like Graph writes them: "/" escaped as "\/", non-ASCII as \uXXXX
// (WithPlainJSON turns that off), and gzipped when the request accepts gzip (WithoutGzip).
package fakegraph

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// DefaultVersion is the Graph API version the fake serves unless WithVersion says otherwise
// (§5: v26.0 is current).
const DefaultVersion = "v26.0"

// maxBody bounds what the fake reads from a request (media uploads are the large ones).
const maxBody = 100 << 20

// Option configures a Server.
type Option func(*Server)

// WithVersion sets the Graph API version segment the fake serves (default "v26.0"). Requests
// under any other first path segment get the Graph "Unknown path components" error (code 2500).
func WithVersion(v string) Option { return func(s *Server) { s.version = v } }

// WithExtraVersions makes the fake also accept these version segments (the real API serves every
// live version; the default is strict so tests catch a wrong prefix).
func WithExtraVersions(vs ...string) Option {
	return func(s *Server) {
		for _, v := range vs {
			s.extraVersions[v] = true
		}
	}
}

// WithAppID sets the app id that GET /oauth/access_token checks as client_id and that
// debug_token and subscribed_apps report. When unset, any client_id is accepted.
func WithAppID(id string) Option { return func(s *Server) { s.appID = id } }

// WithAppSecret sets the app secret that GET /oauth/access_token checks as client_secret.
// When unset, any client_secret is accepted.
func WithAppSecret(secret string) Option { return func(s *Server) { s.appSecret = secret } }

// WithMaxRecorded bounds the request record to the most recent n requests (0, the default, keeps
// all). Benchmarks and the long-running demo should set it.
func WithMaxRecorded(n int) Option { return func(s *Server) { s.maxRecorded = n } }

// WithPlainJSON turns off Graph's JSON string escaping. By default the bodies the fake generates
// are escaped the way graph.facebook.com (PHP json_encode) escapes them: "/" as "\/" (an error
// message's "https:\/\/developers.facebook.com\/docs\/graph-api", paging links, wamids) and
// non-ASCII characters as lower-case \uXXXX escapes; "&", "<", ">" are left as they are. Clients
// that rewrite bodies by plain string matching then fail here as they would against the real API.
func WithPlainJSON() Option { return func(s *Server) { s.plainJSON = true } }

// WithoutGzip turns off response compression. By default, like graph.facebook.com, the fake
// gzips its answers when the request says Accept-Encoding: gzip (Go's http.Transport adds that
// header itself and decompresses transparently, so plain Go clients never notice; a proxy that
// forwards the client's Accept-Encoding and rewrites bodies must decompress).
func WithoutGzip() Option { return func(s *Server) { s.noGzip = true } }

// WithLog writes one line per request (method, path, status, duration) to w.
func WithLog(w io.Writer) Option { return func(s *Server) { s.logw = w } }

// logf writes one line of a request log to w, when there is one. The log is for watching a
// demo or a test: a failed write loses that line and nothing else.
func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		_, _ = fmt.Fprintf(w, format, args...)
	}
}

// Template is a message template of a WhatsApp Business Account.
type Template struct {
	ID       string // generated when empty
	Name     string
	Status   string // APPROVED, PENDING, REJECTED, PAUSED, DISABLED, ...
	Category string // UTILITY, MARKETING, AUTHENTICATION
	Language string // e.g. en_US
	// Components as the template list returns them, e.g.
	// map[string]any{"type": "BODY", "text": "Hi {{1}}, your order {{2}} shipped"}.
	// The placeholders of the BODY component (and of a TEXT HEADER) define how many parameters a
	// send must supply (else error 132000).
	Components []any
	// ParameterFormat is POSITIONAL (default) or NAMED; listed when set.
	ParameterFormat string
}

// Request is one request the fake received.
type Request struct {
	Method   string
	Path     string // as received, including the version segment, e.g. "/v26.0/123/messages"
	RawQuery string
	Header   http.Header
	Body     []byte
	At       time.Time
}

// Server is a fake Graph API. It is safe for concurrent use.
type Server struct {
	version       string
	extraVersions map[string]bool
	appID         string
	appSecret     string
	maxRecorded   int
	logw          io.Writer
	plainJSON     bool
	noGzip        bool
	// unrecordedHealth: health reads are counted (HealthReads), not recorded (WithHealthReadsUnrecorded)
	unrecordedHealth bool

	// demo (demo.go)
	demoSDK         bool
	signupTTL       time.Duration
	signupTemplates []Template
	callback        string
	signupSeq       atomic.Uint64
	// status webhooks (statuses.go)
	undeliverable func(waID string) bool
	statusOrder   []string
	statusDelay   time.Duration
	bg            context.Context // status webhooks; cancelled by Close
	stopBG        context.CancelFunc

	mu        sync.RWMutex
	tokens    map[string]*tokenState
	numbers   map[string]*numberState
	wabas     map[string]*wabaState
	templates map[string]*tmpl // by template id
	codes     map[string]*codeState
	media     map[string]*mediaState
	// lastSignup is the phone number id of the last MintSignup whose code was exchanged.
	lastSignup string

	failMu sync.Mutex
	fails  []*failRule
	nfails atomic.Int32
	// scripts: upstream error codes still to answer, per recipient wa_id (script.go)
	scripts map[string][]int

	latency atomic.Int64

	recMu  sync.Mutex
	record []Request

	seq      atomic.Uint64 // wamid counter
	idSeq    atomic.Uint64 // object id counter
	salt     [3]byte
	debugHdr string

	srvMu sync.Mutex
	hs    *http.Server
	url   string
}

type tokenState struct {
	state    int // tokValid, tokRevoked, tokExpired
	all      bool
	pnids    map[string]bool
	wabas    map[string]bool
	issuedAt time.Time
	expired  time.Time
}

const (
	tokValid = iota
	tokRevoked
	tokExpired
)

type numberState struct {
	id, waba, display, verified string
	registered                  bool
	pin                         string
	registerErr                 int
	registerCalls               []time.Time
	health                      NumberHealth // SetNumberHealth (health.go)
	healthReads                 int
}

type wabaState struct {
	id          string
	name        string
	templates   []*tmpl
	subscribed  bool
	overrideURI string
	numbers     []string
}

type codeState struct {
	token   string
	expires time.Time
	used    bool
	pnid    string // the number a MintSignup code connects
}

type mediaState struct {
	id, pnid, mime, sha string
	data                []byte
}

// New returns an unstarted fake. Use it as an http.Handler or call Start.
func New(opts ...Option) *Server {
	s := &Server{
		version:       DefaultVersion,
		extraVersions: map[string]bool{},
		tokens:        map[string]*tokenState{},
		numbers:       map[string]*numberState{},
		wabas:         map[string]*wabaState{},
		templates:     map[string]*tmpl{},
		codes:         map[string]*codeState{},
		media:         map[string]*mediaState{},
		undeliverable: DefaultUndeliverable,
		statusOrder:   defaultStatusOrder,
	}
	for _, o := range opts {
		o(s)
	}
	s.bg, s.stopBG = context.WithCancel(context.Background())
	_, _ = rand.Read(s.salt[:])
	dbg := make([]byte, 66)
	_, _ = rand.Read(dbg)
	s.debugHdr = base64.StdEncoding.EncodeToString(dbg)
	s.idSeq.Store(uint64(1_000_000_000_000_000) + uint64(s.salt[0])<<20)
	return s
}

// ---- lifecycle ----

// Start serves the fake on 127.0.0.1 on a free port and returns its base URL
// ("http://127.0.0.1:PORT"). It panics if it cannot listen, like httptest.NewServer.
func (s *Server) Start() string {
	u, err := s.Listen("127.0.0.1:0")
	if err != nil {
		panic("fakegraph: " + err.Error())
	}
	return u
}

// Listen serves the fake on addr (host:port) and returns its base URL.
func (s *Server) Listen(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	s.srvMu.Lock()
	if s.hs != nil {
		s.srvMu.Unlock()
		_ = ln.Close() // never served
		return "", errors.New("fakegraph: already started")
	}
	s.hs = hs
	s.url = "http://" + ln.Addr().String()
	u := s.url
	s.srvMu.Unlock()
	go func() { _ = hs.Serve(ln) }()
	return u, nil
}

// URL returns the base URL after Start ("" before).
func (s *Server) URL() string {
	s.srvMu.Lock()
	defer s.srvMu.Unlock()
	return s.url
}

// Close stops the server and drops its connections (requests sleeping in SetLatency are released)
// and its status webhooks under way.
func (s *Server) Close() {
	s.stopBG()
	s.srvMu.Lock()
	hs := s.hs
	s.srvMu.Unlock()
	if hs != nil {
		_ = hs.Close()
	}
}

// Version returns the version segment the fake serves, e.g. "v26.0".
func (s *Server) Version() string { return s.version }

// ---- state set-up ----

// AddToken makes token a valid access token that may use the given phone number ids and WABA ids
// (a WABA grant covers that WABA's numbers too; "*" in either list grants everything). Adding a
// token again replaces its grants and makes it valid again after RevokeToken/ExpireToken. Ids
// named here that were never added become existing objects (numbers without a WABA).
func (s *Server) AddToken(token string, pnids []string, wabas []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := &tokenState{pnids: map[string]bool{}, wabas: map[string]bool{}, issuedAt: time.Now()}
	for _, p := range pnids {
		if p == "*" {
			t.all = true
			continue
		}
		t.pnids[p] = true
		if s.numbers[p] == nil {
			s.numbers[p] = &numberState{id: p, registered: true}
		}
	}
	for _, w := range wabas {
		if w == "*" {
			t.all = true
			continue
		}
		t.wabas[w] = true
		s.wabaLocked(w)
	}
	s.tokens[token] = t
}

// RevokeToken invalidates a token: later calls with it get OAuthException code 190, subcode 460
// ("Error validating access token: The session has been invalidated ..."), HTTP 401 with
// WWW-Authenticate: OAuth "Facebook Platform" "invalid_token" "...".
func (s *Server) RevokeToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.tokens[token]; t != nil {
		t.state = tokRevoked
	} else {
		s.tokens[token] = &tokenState{state: tokRevoked, pnids: map[string]bool{}, wabas: map[string]bool{}}
	}
}

// ExpireToken expires a token: later calls get code 190, subcode 463 ("Error validating access
// token: Session has expired on ..."), HTTP 401.
func (s *Server) ExpireToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tokens[token]
	if t == nil {
		t = &tokenState{pnids: map[string]bool{}, wabas: map[string]bool{}}
		s.tokens[token] = t
	}
	t.state = tokExpired
	t.expired = time.Now()
}

// AddNumber adds (or updates) a business phone number of a WABA. It is registered, with no
// two-step PIN yet (the first register call sets it).
func (s *Server) AddNumber(pnid, wabaID, displayPhone, verifiedName string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.numbers[pnid]
	if n == nil {
		n = &numberState{id: pnid, registered: true}
		s.numbers[pnid] = n
	}
	if n.waba != "" && n.waba != wabaID {
		if old := s.wabas[n.waba]; old != nil {
			old.numbers = removeString(old.numbers, pnid)
		}
	}
	n.waba, n.display, n.verified = wabaID, displayPhone, verifiedName
	if wabaID != "" {
		w := s.wabaLocked(wabaID)
		if !containsString(w.numbers, pnid) {
			w.numbers = append(w.numbers, pnid)
		}
	}
}

// SetRegistered marks a number registered or not; sends from an unregistered number fail with
// 133010 "Account not registered".
func (s *Server) SetRegistered(pnid string, registered bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.numbers[pnid]; n != nil {
		n.registered = registered
	}
}

// SetNumberPIN sets the number's current two-step PIN ("" clears it): register then requires it
// (else 133005).
func (s *Server) SetNumberPIN(pnid, pin string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.numbers[pnid]; n != nil {
		n.pin = pin
	}
}

// SetRegisterError makes every later register call for pnid fail with this WhatsApp error code
// (133005 PIN mismatch, 133016 rate limit, 133010, ...); 0 clears it.
func (s *Server) SetRegisterError(pnid string, code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.numbers[pnid]; n != nil {
		n.registerErr = code
	}
}

// NumberState reports what register did to a number.
func (s *Server) NumberState(pnid string) (registered bool, pin string, registerCalls int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := s.numbers[pnid]
	if n == nil {
		return false, "", 0
	}
	return n.registered, n.pin, len(n.registerCalls)
}

// Subscribed reports whether the app is subscribed to the WABA (POST subscribed_apps), and the
// override callback URI given with it.
func (s *Server) Subscribed(wabaID string) (subscribed bool, overrideCallbackURI string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	w := s.wabas[wabaID]
	if w == nil {
		return false, ""
	}
	return w.subscribed, w.overrideURI
}

// SetSubscribed sets the WABA's subscription state directly.
func (s *Server) SetSubscribed(wabaID string, subscribed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wabaLocked(wabaID).subscribed = subscribed
}

// AddTemplates adds message templates to a WABA (a template with the ID of an existing one
// replaces it). Listing order is insertion order.
func (s *Server) AddTemplates(wabaID string, templates ...Template) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.wabaLocked(wabaID)
	for _, t := range templates {
		nt := s.newTmpl(wabaID, t)
		replaced := false
		for i, old := range w.templates {
			if old.ID == nt.ID {
				w.templates[i] = nt
				replaced = true
				break
			}
		}
		if !replaced {
			w.templates = append(w.templates, nt)
		}
		s.templates[nt.ID] = nt
	}
}

// AddCode registers an Embedded Signup code that GET /oauth/access_token exchanges once for
// tokenToIssue within ttl (30 s when ttl is 0, §4.3; a negative ttl registers a code that has
// already expired). The issued token's grants come from AddToken (call it for tokenToIssue); if
// it was never added, the exchange makes it a valid token with no grants.
func (s *Server) AddCode(code, tokenToIssue string, ttl time.Duration) {
	if ttl == 0 {
		ttl = 30 * time.Second
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.codes[code] = &codeState{token: tokenToIssue, expires: time.Now().Add(ttl)}
}

// AddMedia stores a media object owned by pnid (as if uploaded or received), so GET /{media-id}
// and the download URL work.
func (s *Server) AddMedia(mediaID, pnid, mimeType string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.media[mediaID] = newMedia(mediaID, pnid, mimeType, data)
}

// ---- error injection and latency ----

type failRule struct {
	method, path string // "" = any; path may use * for one segment
	left         int
	status       int
	body         []byte
	code         int
	message      string
	traceID      string
	abort        bool
}

// FailNext makes the next n requests that match answer status with body instead of being served.
// match is "METHOD /path" with the path without the version segment ("POST /123/messages"),
// "/path" (any method), or "" (any request); a path segment "*" matches any one segment. body is
// marshalled as JSON ([]byte and json.RawMessage are sent verbatim); build real envelopes with
// GraphError or WhatsAppError. status 0 takes the documented status for the envelope's code
// (§1.7: 190→401, 4/80007/130429/131048/131056→429, 10/200→403, 132001→404, 131000→500,
// 131016→503, otherwise 400). status < 0 drops the connection without a response. Answers carry
// the usual Graph headers, and WWW-Authenticate for Graph error bodies. Rules are used in the
// order they were added; a request uses at most one.
func (s *Server) FailNext(match string, n int, status int, body any) {
	if n <= 0 {
		return
	}
	r := &failRule{left: n, status: status}
	match = strings.TrimSpace(match)
	if match != "" {
		if i := strings.IndexByte(match, ' '); i >= 0 {
			r.method = strings.ToUpper(match[:i])
			r.path = strings.TrimSpace(match[i+1:])
		} else if strings.HasPrefix(match, "/") {
			r.path = match
		} else {
			r.method = strings.ToUpper(match)
		}
	}
	if r.path != "" {
		r.path = "/" + strings.Trim(r.path, "/")
	}
	switch b := body.(type) {
	case nil:
	case []byte:
		r.body = b
	case json.RawMessage:
		r.body = b
	default:
		var err error
		r.body, err = json.Marshal(body)
		if err != nil {
			panic("fakegraph: FailNext body: " + err.Error())
		}
	}
	var env struct {
		Error *struct {
			Message   string `json:"message"`
			Code      int    `json:"code"`
			FBTraceID string `json:"fbtrace_id"`
		} `json:"error"`
	}
	if len(r.body) > 0 && json.Unmarshal(r.body, &env) == nil && env.Error != nil {
		r.code, r.message, r.traceID = env.Error.Code, env.Error.Message, env.Error.FBTraceID
	}
	if status < 0 {
		r.abort = true
	} else if status == 0 {
		if r.code != 0 {
			r.status = DocStatus(r.code)
		} else {
			r.status = http.StatusBadRequest
		}
	}
	s.failMu.Lock()
	s.fails = append(s.fails, r)
	s.nfails.Add(1)
	s.failMu.Unlock()
}

// ClearFailures drops all pending FailNext rules and scripted errors (Script).
func (s *Server) ClearFailures() {
	s.failMu.Lock()
	s.fails = nil
	s.scripts = nil
	s.nfails.Store(0)
	s.failMu.Unlock()
}

func (s *Server) takeFailure(method, path string) *failRule {
	if s.nfails.Load() == 0 {
		return nil
	}
	s.failMu.Lock()
	defer s.failMu.Unlock()
	for i, r := range s.fails {
		if r.method != "" && r.method != method {
			continue
		}
		if r.path != "" && !pathMatch(r.path, path) {
			continue
		}
		r.left--
		if r.left <= 0 {
			s.fails = append(s.fails[:i:i], s.fails[i+1:]...)
			s.nfails.Add(-1)
		}
		return r
	}
	return nil
}

func pathMatch(pattern, path string) bool {
	if pattern == path {
		return true
	}
	if !strings.Contains(pattern, "*") {
		return false
	}
	ps := strings.Split(strings.Trim(pattern, "/"), "/")
	xs := strings.Split(strings.Trim(path, "/"), "/")
	if len(ps) != len(xs) {
		return false
	}
	for i := range ps {
		if ps[i] != "*" && ps[i] != xs[i] {
			return false
		}
	}
	return true
}

// SetLatency delays every later response by d (0 disables). The delay is spent without holding
// any lock and ends early when the client goes away.
func (s *Server) SetLatency(d time.Duration) { s.latency.Store(int64(d)) }

// ---- request record ----

// Requests returns a copy of every request received since New or the last Reset (the most recent
// ones only, under WithMaxRecorded).
func (s *Server) Requests() []Request {
	s.recMu.Lock()
	defer s.recMu.Unlock()
	rec := s.record
	if s.maxRecorded > 0 && len(rec) > s.maxRecorded {
		rec = rec[len(rec)-s.maxRecorded:]
	}
	return append([]Request(nil), rec...)
}

// RequestsTo returns the recorded requests with this method ("" = any) whose path ends with
// pathSuffix (e.g. "/messages", or "/123/messages").
func (s *Server) RequestsTo(method, pathSuffix string) []Request {
	var out []Request
	for _, r := range s.Requests() {
		if (method == "" || strings.EqualFold(r.Method, method)) && strings.HasSuffix(r.Path, pathSuffix) {
			out = append(out, r)
		}
	}
	return out
}

// Reset clears the request record (not the state, nor pending FailNext rules).
func (s *Server) Reset() {
	s.recMu.Lock()
	s.record = nil
	s.recMu.Unlock()
}

func (s *Server) addRecord(r Request) {
	if s.unrecordedHealth && isHealthRead(r) {
		return
	}
	s.recMu.Lock()
	s.record = append(s.record, r)
	if s.maxRecorded > 0 && len(s.record) >= 2*s.maxRecorded {
		n := copy(s.record, s.record[len(s.record)-s.maxRecorded:])
		clear(s.record[n:])
		s.record = s.record[:n]
	}
	s.recMu.Unlock()
}

// ---- serving ----

// reqCtx carries what the handlers of one request need.
type reqCtx struct {
	w        http.ResponseWriter
	r        *http.Request
	body     []byte
	version  string
	token    string
	reqID    string // x-fb-request-id == fbtrace_id of errors
	traceID  string // x-fb-trace-id
	status   int
	usageKey string // WABA id for x-business-use-case-usage
	usageTyp string
}

// ServeHTTP serves one Graph API request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if (s.demoSDK || s.callback != "") && (r.URL.Path == "/sdk.js" || strings.HasPrefix(r.URL.Path, "/_fake/")) {
		sw := &statusWriter{ResponseWriter: w}
		if s.serveDemo(sw, r) {
			logf(s.logw, "%s %s %s %d %s\n", start.Format(time.RFC3339), r.Method, r.URL.RequestURI(), sw.status, time.Since(start).Round(time.Microsecond))
			return
		}
	}
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(io.LimitReader(r.Body, maxBody))
	}
	s.addRecord(Request{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
		Header: r.Header.Clone(), Body: body, At: start})

	rc := &reqCtx{w: w, r: r, body: body, reqID: randID(23), traceID: randID(11)}
	if s.logw != nil {
		defer func() {
			logf(s.logw, "%s %s %s %d %s\n", start.Format(time.RFC3339), r.Method, r.URL.RequestURI(), rc.status, time.Since(start).Round(time.Microsecond))
		}()
	}

	if d := time.Duration(s.latency.Load()); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			rc.status = -1
			return
		}
	}

	p := r.URL.Path
	if strings.HasPrefix(p, "/whatsapp_business/attachments") {
		s.handleMediaDownload(rc)
		return
	}
	trimmed := strings.Trim(p, "/")
	first, rest, _ := strings.Cut(trimmed, "/")
	if first != s.version && !s.extraVersions[first] {
		// §5 / [FIELD]: an unrecognised version segment is taken as a node id, so Graph answers
		// "Unknown path components: /<rest>" (OAuthException code 2500) before looking at the token.
		if rest == "" {
			s.fail(rc, errUnsupported(r.Method, first))
			return
		}
		s.fail(rc, &gerr{status: 400, code: 2500, typ: "OAuthException", msg: "Unknown path components: /" + rest})
		return
	}
	rc.version = first
	path := "/" + rest

	if f := s.takeFailure(r.Method, path); f != nil {
		s.injected(rc, f)
		return
	}
	s.route(rc, path)
}

func (s *Server) route(rc *reqCtx, path string) {
	r := rc.r
	segs := strings.Split(strings.Trim(path, "/"), "/")
	if segs[0] == "" {
		s.fail(rc, &gerr{status: 400, code: 100, typ: "GraphMethodException", msg: "Unsupported " + strings.ToLower(r.Method) + " request. Please read the Graph API documentation at https://developers.facebook.com/docs/graph-api"})
		return
	}
	if segs[0] == "oauth" && len(segs) == 2 && segs[1] == "access_token" {
		s.handleOAuth(rc)
		return
	}

	// Every other endpoint needs a valid access token (checked before the object, like Graph).
	tok, e := s.authenticate(rc)
	if e != nil {
		s.fail(rc, e)
		return
	}
	if segs[0] == "debug_token" && len(segs) == 1 {
		s.handleDebugToken(rc)
		return
	}
	if len(segs) > 2 {
		s.fail(rc, &gerr{status: 400, code: 2500, typ: "OAuthException", msg: "Unknown path components: /" + strings.Join(segs[2:], "/")})
		return
	}
	id := segs[0]
	edge := ""
	if len(segs) == 2 {
		edge = segs[1]
	}

	s.mu.RLock()
	n := s.numbers[id]
	var nwaba string
	if n != nil {
		nwaba = n.waba
	}
	w := s.wabas[id]
	t := s.templates[id]
	m := s.media[id]
	var mwaba string
	if m != nil {
		if mn := s.numbers[m.pnid]; mn != nil {
			mwaba = mn.waba
		}
	}
	s.mu.RUnlock()

	switch {
	case n != nil:
		if !tok.allowsNumber(id, nwaba) {
			s.fail(rc, permissionError(edge == "messages" || edge == "media"))
			return
		}
		rc.usageKey, rc.usageTyp = nwaba, "whatsapp"
		switch {
		case edge == "messages" && r.Method == http.MethodPost:
			s.handleMessages(rc, id)
		case edge == "register" && r.Method == http.MethodPost:
			s.handleRegister(rc, id, true)
		case edge == "deregister" && r.Method == http.MethodPost:
			s.handleRegister(rc, id, false)
		case edge == "media" && r.Method == http.MethodPost:
			s.handleMediaUpload(rc, id)
		case edge == "" && r.Method == http.MethodGet:
			rc.usageTyp = "whatsapp_business_management"
			s.handleNumber(rc, id)
		case edge == "" || r.Method != http.MethodGet || knownNumberEdge(edge):
			s.fail(rc, errUnsupported(r.Method, id))
		default:
			s.fail(rc, errNonexistingField(edge, "WhatsAppBusinessPhoneNumber"))
		}
	case w != nil:
		if !tok.allowsWABA(id) {
			s.fail(rc, permissionError(false))
			return
		}
		rc.usageKey, rc.usageTyp = id, "whatsapp_business_management"
		switch {
		case edge == "message_templates" && r.Method == http.MethodGet:
			s.handleTemplatesList(rc, id, tok)
		case edge == "message_templates" && r.Method == http.MethodPost:
			s.handleTemplateCreate(rc, id)
		case edge == "message_templates" && r.Method == http.MethodDelete:
			s.handleTemplateDelete(rc, id)
		case edge == "subscribed_apps":
			s.handleSubscribedApps(rc, id)
		case edge == "phone_numbers" && r.Method == http.MethodGet:
			s.handlePhoneNumbers(rc, id)
		case edge == "" && r.Method == http.MethodGet:
			s.handleWABA(rc, id)
		case edge == "" || r.Method != http.MethodGet || edge == "phone_numbers":
			s.fail(rc, errUnsupported(r.Method, id))
		default:
			s.fail(rc, errNonexistingField(edge, "WhatsAppBusinessAccount"))
		}
	case t != nil && edge == "" && r.Method == http.MethodGet:
		if !tok.allowsWABA(t.waba) {
			s.fail(rc, permissionError(false))
			return
		}
		rc.usageKey, rc.usageTyp = t.waba, "whatsapp_business_management"
		s.handleTemplateGet(rc, t)
	case m != nil && edge == "" && (r.Method == http.MethodGet || r.Method == http.MethodDelete):
		if !tok.allowsNumber(m.pnid, mwaba) {
			s.fail(rc, permissionError(true))
			return
		}
		rc.usageKey, rc.usageTyp = mwaba, "whatsapp"
		s.handleMediaNode(rc, id)
	default:
		s.fail(rc, errUnsupported(r.Method, id))
	}
}

func knownNumberEdge(e string) bool {
	switch e {
	case "messages", "register", "deregister", "media":
		return true
	}
	return false
}

// authenticate returns the caller's token state, or the Graph error for a missing, unknown,
// revoked or expired token.
func (s *Server) authenticate(rc *reqCtx) (*tokenState, *gerr) {
	tok, present := bearerToken(rc.r)
	if !present {
		return nil, errNoToken()
	}
	rc.token = tok
	s.mu.RLock()
	t := s.tokens[tok]
	s.mu.RUnlock()
	if t == nil {
		if tok != "" && s.isAppToken(tok) {
			return &tokenState{}, nil
		}
		return nil, errInvalidToken()
	}
	switch t.state {
	case tokRevoked:
		return nil, errRevokedToken()
	case tokExpired:
		return nil, errExpiredToken(t.expired)
	}
	return t, nil
}

func (s *Server) isAppToken(tok string) bool {
	id, secret, ok := strings.Cut(tok, "|")
	if !ok || id == "" || secret == "" {
		return false
	}
	return (s.appID == "" || id == s.appID) && (s.appSecret == "" || secret == s.appSecret)
}

func bearerToken(r *http.Request) (string, bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, _ := strings.Cut(strings.TrimSpace(h), " ")
		if strings.EqualFold(scheme, "Bearer") || strings.EqualFold(scheme, "OAuth") {
			return strings.TrimSpace(tok), true
		}
		return h, true // some other scheme: present but unparseable → 190
	}
	if r.URL.RawQuery != "" {
		if q := r.URL.Query(); q.Has("access_token") {
			return q.Get("access_token"), true
		}
	}
	return "", false
}

func (t *tokenState) allowsNumber(pnid, waba string) bool {
	return t.all || t.pnids[pnid] || (waba != "" && t.wabas[waba])
}

func (t *tokenState) allowsWABA(waba string) bool {
	return t.all || t.wabas[waba]
}

// ---- responses ----

var (
	hdrVary     = []string{"Origin"}
	hdrACAO     = []string{"*"}
	hdrHSTS     = []string{"max-age=15552000; preload"}
	hdrPragma   = []string{"no-cache"}
	hdrCache    = []string{"private, no-cache, no-store, must-revalidate"}
	hdrExpires  = []string{"Sat, 01 Jan 2000 00:00:00 GMT"}
	hdrRev      = []string{"1016949697"}
	hdrAppUsage = []string{`{"call_count":0,"total_cputime":0,"total_time":0}`}
	hdrJSONOK   = []string{"application/json; charset=UTF-8"}
	hdrJSONErr  = []string{"application/json"}
	hdrGzip     = []string{"gzip"}
)

// graphHeaders sets the headers Graph sends on every answer (§1.5).
func (s *Server) graphHeaders(rc *reqCtx) http.Header {
	h := rc.w.Header()
	h["Vary"] = hdrVary
	h["Access-Control-Allow-Origin"] = hdrACAO
	h["Facebook-Api-Version"] = []string{s.versionOf(rc)}
	h["Strict-Transport-Security"] = hdrHSTS
	h["Pragma"] = hdrPragma
	h["Cache-Control"] = hdrCache
	h["Expires"] = hdrExpires
	h["X-Fb-Request-Id"] = []string{rc.reqID}
	h["X-Fb-Trace-Id"] = []string{rc.traceID}
	h["X-Fb-Rev"] = hdrRev
	h["X-Fb-Debug"] = []string{s.debugHdr}
	h["X-App-Usage"] = hdrAppUsage
	if rc.usageKey != "" {
		h["X-Business-Use-Case-Usage"] = []string{`{"` + rc.usageKey + `":[{"type":"` + rc.usageTyp +
			`","call_count":1,"total_cputime":1,"total_time":1,"estimated_time_to_regain_access":0}]}`}
	}
	return h
}

func (s *Server) versionOf(rc *reqCtx) string {
	if rc.version != "" {
		return rc.version
	}
	return s.version
}

// ok writes a 200 JSON answer.
func (s *Server) ok(rc *reqCtx, body []byte) {
	s.write(rc, http.StatusOK, hdrJSONOK, body)
}

func (s *Server) okJSON(rc *reqCtx, v any) {
	s.ok(rc, marshal(v))
}

func (s *Server) write(rc *reqCtx, status int, ctype []string, body []byte) {
	if !s.plainJSON {
		body = graphEscape(body)
	}
	s.writeRaw(rc, status, ctype, body)
}

func (s *Server) writeRaw(rc *reqCtx, status int, ctype []string, body []byte) {
	h := s.graphHeaders(rc)
	if !s.noGzip && len(body) > 0 && acceptsGzip(rc.r) {
		body = gzipBytes(body)
		h["Content-Encoding"] = hdrGzip
	}
	h["Content-Type"] = ctype
	h["Content-Length"] = []string{itoa(len(body))}
	rc.status = status
	rc.w.WriteHeader(status)
	_, _ = rc.w.Write(body)
}

// fail writes a Graph error envelope with its status and WWW-Authenticate header.
func (s *Server) fail(rc *reqCtx, e *gerr) {
	body := e.render(rc.reqID)
	h := rc.w.Header()
	h["Www-Authenticate"] = []string{wwwAuthenticate(e.authKind(), e.msg)}
	s.write(rc, e.status, hdrJSONErr, body)
}

func (s *Server) injected(rc *reqCtx, f *failRule) {
	if f.abort {
		rc.status = -1
		panic(http.ErrAbortHandler)
	}
	if f.traceID != "" {
		rc.reqID = f.traceID
	}
	ctype := hdrJSONOK
	if f.code != 0 || f.message != "" {
		ctype = hdrJSONErr
		kind := "invalid_request"
		if f.code == 190 || f.code == 102 {
			kind = "invalid_token"
		}
		rc.w.Header()["Www-Authenticate"] = []string{wwwAuthenticate(kind, f.message)}
	}
	s.writeRaw(rc, f.status, ctype, f.body)
}

// ---- helpers ----

// marshal is json.Marshal without HTML escaping (Graph leaves "&", "<", ">" alone).
func marshal(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic("fakegraph: " + err.Error())
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})
}

// graphEscape rewrites JSON produced by marshal the way Graph's encoder writes it: "/" as "\/"
// and every non-ASCII character as \uXXXX (UTF-16, lower-case hex). Both only occur inside
// strings in JSON text, so a byte-level pass is safe.
func graphEscape(b []byte) []byte {
	i := 0
	for i < len(b) && b[i] != '/' && b[i] < utf8.RuneSelf {
		i++
	}
	if i == len(b) {
		return b
	}
	const hexd = "0123456789abcdef"
	out := make([]byte, 0, len(b)+len(b)/4+8)
	out = append(out, b[:i]...)
	u := func(r rune) {
		out = append(out, '\\', 'u', hexd[r>>12&15], hexd[r>>8&15], hexd[r>>4&15], hexd[r&15])
	}
	for i < len(b) {
		c := b[i]
		switch {
		case c == '/':
			out = append(out, '\\', '/')
			i++
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, size := utf8.DecodeRune(b[i:])
			i += size
			if r > 0xffff {
				r1, r2 := utf16.EncodeRune(r)
				u(r1)
				u(r2)
			} else {
				u(r)
			}
		}
	}
	return out
}

func acceptsGzip(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept-Encoding") {
		for part := range strings.SplitSeq(v, ",") {
			name, q, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.EqualFold(strings.TrimSpace(name), "gzip") {
				q = strings.ReplaceAll(q, " ", "")
				return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
			}
		}
	}
	return false
}

var gzipPool = sync.Pool{New: func() any { w, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed); return w }}

func gzipBytes(b []byte) []byte {
	var buf bytes.Buffer
	buf.Grow(len(b)/2 + 64)
	zw := gzipPool.Get().(*gzip.Writer)
	zw.Reset(&buf)
	_, _ = zw.Write(b)
	_ = zw.Close()
	gzipPool.Put(zw)
	return buf.Bytes()
}

const idAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

func randID(n int) string {
	var b [32]byte
	_, _ = rand.Read(b[:n])
	for i := range n {
		b[i] = idAlphabet[b[i]&63]
	}
	return string(b[:n])
}

func (s *Server) newObjectID() string {
	return itoa64(s.idSeq.Add(1))
}

func itoa(n int) string { return itoa64(uint64(n)) }

func itoa64(n uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return string(b[i:])
}

func (s *Server) wabaLocked(id string) *wabaState {
	w := s.wabas[id]
	if w == nil {
		w = &wabaState{id: id}
		s.wabas[id] = w
	}
	return w
}

func containsString(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func removeString(xs []string, x string) []string {
	out := xs[:0]
	for _, v := range xs {
		if v != x {
			out = append(out, v)
		}
	}
	return out
}

// baseURL is the absolute base used in links (paging, media URLs): the started server's URL, else
// the request's own host.
func (s *Server) baseURL(rc *reqCtx) string {
	if u := s.URL(); u != "" {
		return u
	}
	scheme := "http"
	if rc.r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + rc.r.Host
}

// decodeObject parses a JSON object body into its top-level members; an empty, malformed or
// non-object body yields an empty map (Graph then reports the missing required parameters).
func decodeObject(body []byte) map[string]json.RawMessage {
	m := map[string]json.RawMessage{}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return m
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return map[string]json.RawMessage{}
	}
	return m
}
