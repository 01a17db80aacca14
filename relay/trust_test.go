package relay

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// chunked writes body to w in writes of n bytes.
func chunked(w http.ResponseWriter, body []byte, n int) {
	for len(body) > 0 {
		k := min(n, len(body))
		w.Write(body[:k])
		body = body[k:]
	}
}

// gzipped and deflated compress b in memory, where writing cannot fail: they panic if it does.
func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err != nil {
		panic(err)
	}
	return compressed(&buf, zw, b)
}

func deflated(b []byte) []byte {
	var buf bytes.Buffer
	return compressed(&buf, zlib.NewWriter(&buf), b)
}

func compressed(buf *bytes.Buffer, zw io.WriteCloser, b []byte) []byte {
	if _, err := zw.Write(b); err != nil {
		panic(err)
	}
	if err := zw.Close(); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// TestRelayNeverPassesTheToken: whatever the answer — larger than the inspection cap, not
// JSON, a successful send, an error, encoded without being asked — no byte sequence of the
// upstream token reaches the caller, in the body or a header; encoded answers reach it decoded,
// and an encoding the relay cannot decode is refused whole.
func TestRelayNeverPassesTheToken(t *testing.T) {
	f := newRelayFixture(t, 1000, nil)
	upLink := `https://graph.facebook.com/v26.0/` + tWABA + `/message_templates?access_token=` + tUpstream + `&after=QVFI`
	relayLink := `https://relay.example.com/upstream-proxy/` + tWABA + `/message_templates?after=QVFI`
	link := `"paging":{"next":"` + upLink + `"}`
	big := []byte(`{"data":[{"id":"x","pad":"` + strings.Repeat("a", maxInspectBody) + `"}],` + link + `}`)
	small := []byte(`{"data":[{"id":"t1"}],"note":"` + tUpstream + `",` + link + `}`)
	for _, c := range []struct {
		name, method, path, ctype, encoding string
		status                              int
		body                                []byte
		chunk                               int
	}{
		{"over the cap", "GET", "/" + tWABA + "/message_templates?limit=2", "application/json", "", 200, big, 32 << 10},
		{"over the cap, token across writes", "GET", "/" + tWABA + "/message_templates", "application/json", "", 200, big, len(big) - len(tUpstream) - 40},
		{"not JSON", "GET", "/" + tWABA + "/message_templates", "text/plain", "", 200, []byte("token " + tUpstream + " end"), 9},
		{"send answer", "POST", "/" + tPNID + "/messages", "application/json", "", 200, []byte(`{"messages":[{"id":"` + tUpstream + `"}]}`), 7},
		{"error", "POST", "/" + tPNID + "/messages", "text/html", "", 500, []byte("<p>" + tUpstream + "</p>"), 5},
		{"gzip unasked", "POST", "/" + tPNID + "/messages", "application/json", "gzip", 200, gzipped([]byte(`{"id":"` + tUpstream + `"}`)), 3},
		{"deflate unasked", "POST", "/" + tPNID + "/messages", "application/json", "deflate", 200, deflated([]byte(`{"id":"` + tUpstream + `"}`)), 3},
		{"gzip read", "GET", "/" + tWABA + "/message_templates", "application/json", "gzip", 200, gzipped(small), 11},
		{"gzip over the cap", "GET", "/" + tWABA + "/message_templates", "application/json", "gzip", 200, gzipped(big), 4096},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := f.serve(c.method, c.path, "", func(w http.ResponseWriter, r *http.Request) error {
				h := w.Header()
				h.Set("Content-Type", c.ctype)
				h.Set("Content-Length", strconv.Itoa(len(c.body)))
				h.Set("X-Debug", "token="+tUpstream)
				if c.encoding != "" {
					h.Set("Content-Encoding", c.encoding)
				}
				w.WriteHeader(c.status)
				chunked(w, c.body, c.chunk)
				return nil
			})
			got := w.Body.Bytes()
			if w.Code != c.status || bytes.Contains(got, []byte(tUpstream)) || strings.Contains(strings.Join(w.Header().Values("X-Debug"), ""), tUpstream) {
				t.Fatalf("%d, token passed (%d bytes, header %q)", w.Code, len(got), w.Header().Get("X-Debug"))
			}
			if w.Header().Get("Content-Encoding") != "" {
				t.Fatalf("Content-Encoding %q passed on", w.Header().Get("Content-Encoding"))
			}
			if cl := w.Header().Get("Content-Length"); cl != "" && cl != strconv.Itoa(len(got)) {
				t.Fatalf("Content-Length %s for %d bytes", cl, len(got))
			}
			// Over the cap, the answer streams whole with its paging link rewritten as it goes
			// (the link alone changes the length; the mask does not).
			if c.encoding == "" && c.body[0] == '{' && len(c.body) > maxInspectBody &&
				!bytes.Equal(got, bytes.Replace(c.body, []byte(upLink), []byte(relayLink), 1)) {
				t.Fatalf("%d bytes of %d, link rewritten: %v", len(got), len(c.body), bytes.Contains(got, []byte(relayLink)))
			}
			if c.name == "gzip over the cap" && !bytes.Contains(got, []byte(`"next":"`+relayLink+`"`)) {
				t.Fatal("the decoded answer over the cap kept its upstream paging link")
			}
			if c.encoding != "" && !bytes.Contains(got, []byte(`"`)) {
				t.Fatalf("not decoded: %q", got[:min(len(got), 40)])
			}
		})
	}

	// encodings the relay cannot decode, and a corrupt gzip body: 502, nothing passed
	for _, c := range []struct{ encoding, body string }{{"br", "\x0b\x02\x80" + tUpstream}, {"gzip, br", "x"}, {"gzip", "not gzip " + tUpstream}} {
		w := f.serve("GET", "/"+tWABA+"/message_templates", "", func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", c.encoding)
			w.WriteHeader(200)
			w.Write([]byte(c.body))
			return nil
		})
		expectError(t, w, http.StatusBadGateway, MsgUpstreamEncoding)
		if w.Header().Get("Content-Encoding") != "" {
			t.Fatalf("%s: Content-Encoding passed on", c.encoding)
		}
	}

	// a keyed send: the stored copy, replayed, is the masked one
	up := func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		chunked(w, []byte(`{"messages":[{"id":"wamid.`+tUpstream+`"}]}`), 13)
		return nil
	}
	first := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "masked-1"), up)
	replay := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "masked-1"), up)
	if first.Code != 200 || replay.Header().Get("Idempotent-Replayed") != "true" || replay.Body.String() != first.Body.String() ||
		strings.Contains(first.Body.String(), tUpstream) {
		t.Fatalf("first %d %q, replay %q", first.Code, first.Body, replay.Body)
	}
}

// upstreamRecord is an in-process upstream that records what it was sent and answers 200.
type upstreamRecord struct {
	mu     sync.Mutex
	calls  []*http.Request
	bodies [][]byte
}

func (u *upstreamRecord) serve(w http.ResponseWriter, r *http.Request) error {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return err // the relay cut the body off
	}
	u.mu.Lock()
	u.calls, u.bodies = append(u.calls, r.Clone(r.Context())), append(u.bodies, b)
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(200)
	w.Write([]byte(`{"id":"m1"}`))
	return nil
}

// TestRelaySendBodyAccessToken: a caller's access_token in a JSON send body (any value, any
// position, an escaped name, beside an idempotency key) never reaches the upstream; the rest of
// the body does, byte for byte, and a retry with the same key (with or without the token)
// replays the first answer.
func TestRelaySendBodyAccessToken(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	var u upstreamRecord
	send := "/" + tPNID + "/messages"
	for _, c := range []struct{ in, out string }{
		{`{"messaging_product":"whatsapp","to":"15551234567","access_token":"callers"}`, `{"messaging_product":"whatsapp","to":"15551234567"}`},
		{`{"access_token":{"token":"callers"},"to":"15551234567"}`, `{"to":"15551234567"}`},
		{`{"to":"15551234567","access\u005ftoken":"callers"}`, `{"to":"15551234567"}`},
		{`{"to":"15551234567","text":{"body":"my access_token"}}`, `{"to":"15551234567","text":{"body":"my access_token"}}`},
		{`{"to":"15551234567","access_token":"callers","idempotency_key":"k1"}`, `{"to":"15551234567"}`},
	} {
		n := len(u.bodies)
		if w := f.serve("POST", send, c.in, u.serve); w.Code != 200 {
			t.Fatalf("%s: %d %s", c.in, w.Code, w.Body)
		}
		if len(u.bodies) != n+1 || string(u.bodies[n]) != c.out {
			t.Fatalf("%s: the upstream got %q, want %q", c.in, u.bodies[n:], c.out)
		}
	}
	w := f.serve("POST", send, `{"to":"15551234567","idempotency_key":"k1"}`, u.serve)
	if w.Code != 200 || w.Header().Get("Idempotent-Replayed") != "true" || len(u.bodies) != 5 {
		t.Fatalf("the same send without the token: %d %s (replayed %q), %d upstream calls", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"), len(u.bodies))
	}
}

// TestRelayCallerAccessToken: a caller's access_token never reaches the upstream — not in the
// query (also %-escaped), not in a form body, not as a multipart field (refused 400) — and a
// query that does not parse is refused 400 before any upstream call or rate-limit count.
func TestRelayCallerAccessToken(t *testing.T) {
	f := newRelayFixture(t, 3, nil)
	var u upstreamRecord
	for _, q := range []string{"access_token=foo&x=%zz", "x=1;access_token=foo", "a=%"} {
		expectError(t, f.serve("GET", "/"+tPNID+"?"+q, "", u.serve), http.StatusBadRequest, MsgBadQuery)
	}
	if len(u.calls) != 0 {
		t.Fatalf("refused queries reached the upstream %d times", len(u.calls))
	}
	// not counted: three calls are still allowed (limit 3)
	for _, q := range []string{"access_token=foo&fields=name", "access%5Ftoken=foo&fields=name", "fields=name&access_token"} {
		if w := f.serve("GET", "/"+tPNID+"?"+q, "", u.serve); w.Code != 200 {
			t.Fatalf("%s: %d %s", q, w.Code, w.Body)
		}
	}
	for _, r := range u.calls {
		if r.URL.RawQuery != "fields=name" {
			t.Fatalf("upstream query %q", r.URL.RawQuery)
		}
	}

	f = newRelayFixture(t, 100, nil)
	u = upstreamRecord{}
	form := func(ctype, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "http://relay.example.com/"+tPNID+"/media", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+f.token)
		r.Header.Set("Content-Type", ctype)
		w := httptest.NewRecorder()
		f.relay.Serve(w, r, u.serve)
		return w
	}
	if w := form("application/x-www-form-urlencoded", "messaging_product=whatsapp&access_token=foo&access%5Ftoken=bar"); w.Code != 200 {
		t.Fatalf("form: %d %s", w.Code, w.Body)
	}
	if got := string(u.bodies[0]); got != "messaging_product=whatsapp" {
		t.Fatalf("upstream form body %q", got)
	}
	if w := form("application/x-www-form-urlencoded", "messaging_product=whatsapp&type=image"); w.Code != 200 || string(u.bodies[1]) != "messaging_product=whatsapp&type=image" {
		t.Fatalf("a form without a token was changed: %q", u.bodies[1])
	}
	expectError(t, form("application/x-www-form-urlencoded", "a=%zz"), http.StatusBadRequest, MsgBadForm)

	// multipart: an upload streams through; one with an access_token field is refused, also
	// when the field comes after megabytes of file
	mp := func(fields ...string) (string, string) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		for i := 0; i < len(fields); i += 2 {
			if fields[i] == "file" {
				fw, err := mw.CreateFormFile("file", "a.jpg")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := fw.Write([]byte(fields[i+1])); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := mw.WriteField(fields[i], fields[i+1]); err != nil {
				t.Fatal(err)
			}
		}
		if err := mw.Close(); err != nil {
			t.Fatal(err)
		}
		return mw.FormDataContentType(), buf.String()
	}
	n := len(u.bodies)
	ct, body := mp("messaging_product", "whatsapp", "file", strings.Repeat("\xff\xd8jpeg", 1<<20))
	if w := form(ct, body); w.Code != 200 || len(u.bodies) != n+1 || string(u.bodies[n]) != body {
		t.Fatalf("upload: %d, upstream got the body intact: %v", w.Code, len(u.bodies) == n+1 && string(u.bodies[n]) == body)
	}
	for _, fields := range [][]string{
		{"access_token", "foo", "file", "x"},
		{"messaging_product", "whatsapp", "file", strings.Repeat("\xff\xd8jpeg", 1<<20), "ACCESS_TOKEN", "foo"},
	} {
		ct, body := mp(fields...)
		expectError(t, form(ct, body), http.StatusBadRequest, MsgFormAccessToken)
	}
	if len(u.bodies) != n+1 {
		t.Fatalf("a refused upload reached the upstream whole")
	}
}

// TestRelayKeyCoversTheQuery: the same key and body with another query is another request:
// 422, not a replay.
func TestRelayKeyCoversTheQuery(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	if w := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "q-1"), nil); w.Code != 200 {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	expectError(t, f.serve("POST", "/"+tPNID+"/messages?to=19999999999", sendBody("hi", "q-1"), nil), http.StatusUnprocessableEntity, MsgIdemMismatch)
	if w := f.serve("POST", "/"+tPNID+"/messages", sendBody("hi", "q-1"), nil); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the same request again: %d %v", w.Code, w.Header())
	}
	if n := f.sends.Load(); n != 1 {
		t.Fatalf("upstream sends = %d", n)
	}
}

// TestRelayCorruptEncodingLikeReverseProxy: an upstream copy that aborts when its write fails
// (as reverse_proxy does) still gets the relay's 502 for a corrupt gzip body, not a broken
// answer.
func TestRelayCorruptEncodingLikeReverseProxy(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	w := f.serve("GET", "/"+tWABA+"/message_templates", "", func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(200)
		body := []byte("\x1f\x8b not really gzip " + strings.Repeat(tUpstream, 4096))
		for len(body) > 0 {
			n := min(len(body), 1024)
			if _, err := w.Write(body[:n]); err != nil {
				panic(http.ErrAbortHandler)
			}
			body = body[n:]
		}
		return nil
	})
	expectError(t, w, http.StatusBadGateway, MsgUpstreamEncoding)
}
