package e2e

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/relay"
)

// leakBody is a template listing of about size bytes whose pad holds the upstream token every
// 256 KiB, placed across the 32 KiB write boundaries of leakUpstream, and whose paging link
// carries it like the real upstream's.
func leakBody(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"data":[{"id":"x","pad":"`)
	for b.Len() < size-300 {
		next := (b.Len()/(256<<10) + 1) * (256 << 10)
		if next-len(realToken)/2 > size-300 {
			b.WriteString(strings.Repeat("a", size-300-b.Len()))
			break
		}
		b.WriteString(strings.Repeat("a", next-len(realToken)/2-b.Len()))
		b.WriteString(realToken)
	}
	b.WriteString(`"}],"paging":{"cursors":{"after":"QVFI"},"next":"https://graph.facebook.com/v26.0/` + wabaID +
		`/message_templates?access_token=` + realToken + `&limit=2&after=QVFI"}}`)
	return b.Bytes()
}

// leakUpstream answers every call with leakBody(?size=), gzip-encoded when ?enc=gzip whatever
// the request asked, in flushed (chunked) writes of 32 KiB.
func leakUpstream(bodies map[int][]byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // read and dropped: the answer does not depend on it
		size, _ := strconv.Atoi(r.URL.Query().Get("size"))
		body := bodies[size]
		w.Header().Set("Content-Type", "application/json; charset=UTF-8")
		w.Header().Set("X-Fb-Trace-Id", "trace")
		if r.URL.Query().Get("enc") == "gzip" {
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(200)
			zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
			for rest := body; len(rest) > 0; {
				n := min(len(rest), 32<<10)
				// a write fails only when the client has gone: nothing is left to send
				if _, err := zw.Write(rest[:n]); err != nil {
					return
				}
				if err := zw.Flush(); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				rest = rest[n:]
			}
			_ = zw.Close() // the gzip trailer: an error means the client has gone, as above
			return
		}
		w.WriteHeader(200)
		for rest := body; len(rest) > 0; {
			n := min(len(rest), 32<<10)
			w.Write(rest[:n])
			w.(http.Flusher).Flush()
			rest = rest[n:]
		}
	})
}

// TestRelayTokenNeverLeaks: through Caddy, answers of 1 KiB, 9 MiB and 50 MiB — plain and
// gzip-encoded by the upstream on its own, chunked, the token across chunk boundaries and in
// the paging link — reach the caller decoded, without a byte sequence of the upstream token,
// their paging link pointing at the relay, with the relay's memory bounded (a 50 MiB answer is
// never held whole).
func TestRelayTokenNeverLeaks(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	sizes := []int{1 << 10, 9 << 20, 50 << 20}
	bodies := map[int][]byte{}
	for _, n := range sizes {
		bodies[n] = leakBody(n)
	}
	up := httptest.NewServer(leakUpstream(bodies))
	defer up.Close()
	// GOGC=25: the collector's slack over the streams' buffers stays well under a 50 MiB answer
	// (at the default it was seen up to 43 MiB under -race on a loaded machine).
	origin := e.caddySite("", "", up.URL, proxyRoute, "GOGC=25")
	base := origin + proxyPrefix
	pid := e.caddies[origin].PID()
	ch := e.channel(true)
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}} // the caller sees the bytes as sent

	fetch := func(method string, size int, enc string) {
		t.Helper()
		req, _ := http.NewRequest(method, fmt.Sprintf("%s/%s/message_templates?limit=2&size=%d&enc=%s", base, wabaID, size, enc), nil)
		req.Header.Set("Authorization", "Bearer "+ch.ChannelToken)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %d %s: %v", method, size, enc, err)
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s %d %s: reading: %v", method, size, enc, err)
		}
		if resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "" || !bytes.HasPrefix(got, []byte(`{"data":[{"id":"x"`)) {
			t.Fatalf("%s %d %s: %d %v %q", method, size, enc, resp.StatusCode, resp.Header, got[:min(len(got), 60)])
		}
		if bytes.Contains(got, []byte(realToken)) {
			t.Fatalf("%s %d %s: the upstream token reached the caller", method, size, enc)
		}
		if bytes.Contains(got, []byte("access_token="+realToken[:8])) {
			t.Fatalf("%s %d %s: a paging link carries the token's start", method, size, enc)
		}
		if cl := resp.Header.Get("Content-Length"); cl != "" && cl != strconv.Itoa(len(got)) {
			t.Fatalf("%s %d %s: Content-Length %s, %d bytes", method, size, enc, cl, len(got))
		}
		// The paging link points at the relay, at any size (over the inspection cap, rewritten
		// as the answer streams).
		if !bytes.HasSuffix(got, []byte(`"next":"`+base+`/`+wabaID+`/message_templates?limit=2&after=QVFI"}}`)) {
			t.Fatalf("%s %d %s: paging link not the relay's: %q", method, size, enc, got[max(0, len(got)-160):])
		}
		if len(got) < len(bodies[size])-400 {
			t.Fatalf("%s %d %s: %d bytes of %d", method, size, enc, len(got), len(bodies[size]))
		}
	}
	for _, size := range sizes[:2] {
		for _, enc := range []string{"", "gzip"} {
			for _, m := range []string{"GET", "POST"} {
				fetch(m, size, enc)
			}
		}
	}
	_, before := rss(t, pid)
	for _, enc := range []string{"", "gzip"} {
		for _, m := range []string{"GET", "POST"} {
			fetch(m, 50<<20, enc)
		}
	}
	// A 50 MiB answer held whole would raise the peak by at least 50 MiB; streamed, the growth is
	// the garbage collector's slack over the stream's buffers (at GOGC=25, see above), so the
	// bound sits between the two.
	if _, after := rss(t, pid); after-before > 42<<20 {
		t.Fatalf("Caddy's peak memory grew by %d MiB over four 50 MiB answers", (after-before)>>20)
	}
}

// TestRelayCallerCredentialsStripped: through Caddy, a caller's access_token never reaches the
// upstream (query, %-escaped query, form body, JSON send body; a multipart field is refused
// 400), a query that does not parse is refused 400 without an upstream call, and the same
// idempotency key and body with another query answers 422.
func TestRelayCallerCredentialsStripped(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	base := e.caddy("")
	ch := e.channel(true)

	expectRelayError(t, call(t, "GET", base+"/"+pnid+"?access_token=foo&x=%zz", ch.ChannelToken, ""), 400, relay.MsgBadQuery)
	expectRelayError(t, call(t, "GET", base+"/"+pnid+"?fields=a;access_token=foo", ch.ChannelToken, ""), 400, relay.MsgBadQuery)
	if n := len(e.fake.Requests()); n != 0 {
		t.Fatalf("refused queries reached the upstream %d times", n)
	}
	for _, q := range []string{"access_token=callers&fields=verified_name", "access%5Ftoken=callers&fields=verified_name"} {
		if r := call(t, "GET", base+"/"+pnid+"?"+q, ch.ChannelToken, ""); r.status != 200 {
			t.Fatalf("%s: %d %s", q, r.status, r.body)
		}
	}
	req, _ := http.NewRequest("POST", base+"/"+pnid+"/messages", strings.NewReader("messaging_product=whatsapp&to=15551234567&type=text&access_token=callers"))
	req.Header.Set("Authorization", "Bearer "+ch.ChannelToken)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	do(t, req)
	// a JSON send body's access_token: stripped, the send goes out without it
	if r := call(t, "POST", base+"/"+pnid+"/messages", ch.ChannelToken,
		`{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"hi"},"access_token":"callers"}`); r.status != 200 {
		t.Fatalf("JSON send with an access_token: %d %s", r.status, r.body)
	}
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if err := func() error {
		if err := mw.WriteField("messaging_product", "whatsapp"); err != nil {
			return err
		}
		fw, err := mw.CreateFormFile("file", "a.jpg")
		if err != nil {
			return err
		}
		if _, err := fw.Write(bytes.Repeat([]byte("\xff\xd8jpeg"), 1<<20)); err != nil {
			return err
		}
		if err := mw.WriteField("access_token", "callers"); err != nil {
			return err
		}
		return mw.Close()
	}(); err != nil {
		t.Fatalf("multipart body: %v", err)
	}
	req, _ = http.NewRequest("POST", base+"/"+pnid+"/media", &buf)
	req.Header.Set("Authorization", "Bearer "+ch.ChannelToken)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	expectRelayError(t, do(t, req), 400, relay.MsgFormAccessToken)
	for _, r := range e.fake.Requests() {
		if strings.Contains(r.RawQuery, "callers") || bytes.Contains(r.Body, []byte("callers")) || strings.Contains(r.RawQuery, "access") {
			t.Fatalf("the caller's access_token reached the upstream: %s %s?%s %q", r.Method, r.Path, r.RawQuery, r.Body[:min(len(r.Body), 200)])
		}
	}

	// the key covers the query
	body := `{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"q"},"idempotency_key":"query-1"}`
	if r := call(t, "POST", base+"/"+pnid+"/messages", ch.ChannelToken, body); r.status != 200 {
		t.Fatalf("first send: %d %s", r.status, r.body)
	}
	expectRelayError(t, call(t, "POST", base+"/"+pnid+"/messages?to=19999999999", ch.ChannelToken, body), 422, relay.MsgIdemMismatch)
	if n := len(e.fake.RequestsTo("POST", "/"+pnid+"/messages")); n != 3 {
		t.Fatalf("upstream sends = %d, want 3 (the form send, the JSON one and the first keyed one)", n)
	}
}
