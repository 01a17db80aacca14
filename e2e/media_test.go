package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
)

// maxGrowth is how much the Caddy process's resident set may grow while it relays a 20 MB
// medium: streamed, it needs a few buffers; buffered whole, at least the 20 MB.
const maxGrowth = 12 << 20

// TestRelayMedia: through a Caddy process and the fake upstream, a 20 MB upload streams
// through and its id enters the channel's scope; the media object's url is the relay's
// download URL; the download is byte-identical with its type and length; a range gets 206
// with exactly those bytes; Caddy's resident set grows by far less than the medium both ways;
// without a token 401, with another channel's token 403 on the object and the download; the
// upstream token appears in no answer, header or log line (the last checked at cleanup). It is
// one of make test's volume tests (VOLUME_TESTS in the Makefile), run without -race: under it,
// beside the suite, the 20 MB went through the in-process fake so slowly that the relay's 30 s
// wait for the upstream's answer ran out. TestRelayMediaRoundTrip (package relay) and the other
// TestRelayMedia* tests run the same paths under -race at small sizes.
func TestRelayMedia(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	base := e.caddy("")
	pid := e.caddies[strings.TrimSuffix(base, proxyPrefix)].PID()
	ch, other := e.channel(true), e.channelOn(true, pnid2)
	data := make([]byte, 20<<20)
	rand.Read(data)
	noToken := func(r relayResp) {
		t.Helper()
		if bytes.Contains(r.body, []byte(realToken)) || strings.Contains(strings.Join(flatten(r.header), " "), realToken) {
			t.Fatalf("the upstream token is in an answer: %v %s", r.header, r.body)
		}
	}

	// Upload, streamed from a pipe: the client holds no copy either.
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		// An error (the request gave up reading, say) ends the body with it, and the upload fails.
		pw.CloseWithError(func() error {
			if err := mw.WriteField("messaging_product", "whatsapp"); err != nil {
				return err
			}
			part, err := mw.CreateFormFile("file", "clip.mp4")
			if err != nil {
				return err
			}
			if _, err := part.Write(data); err != nil {
				return err
			}
			if err := mw.WriteField("type", "video/mp4"); err != nil {
				return err
			}
			return mw.Close()
		}())
	}()
	req, _ := http.NewRequest("POST", base+"/"+pnid+"/media", pr)
	req.Header.Set("Authorization", "Bearer "+ch.ChannelToken)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	before, _ := rss(t, pid)
	resetPeak(t, pid)
	up := do(t, req)
	_, peak := rss(t, pid)
	noToken(up)
	var created struct{ ID string }
	if up.status != 200 || json.Unmarshal(up.body, &created) != nil || created.ID == "" {
		t.Fatalf("upload: %d %s", up.status, up.body)
	}
	if peak-before > maxGrowth {
		t.Fatalf("Caddy's resident set grew by %d MB during a 20 MB upload", (peak-before)>>20)
	}

	obj := call(t, "GET", base+"/"+created.ID, ch.ChannelToken, "")
	noToken(obj)
	var m struct{ URL, MimeType string }
	if obj.status != 200 || json.Unmarshal(obj.body, &m) != nil || m.URL != base+"/"+created.ID+"/download" {
		t.Fatalf("media object: %d %s", obj.status, obj.body)
	}

	before, _ = rss(t, pid)
	resetPeak(t, pid)
	req, _ = http.NewRequest("GET", m.URL, nil)
	req.Header.Set("Authorization", "Bearer "+ch.ChannelToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.New()
	n, err := io.Copy(sum, resp.Body)
	resp.Body.Close()
	_, peak = rss(t, pid)
	want := sha256.Sum256(data)
	if err != nil || resp.StatusCode != 200 || n != int64(len(data)) || !bytes.Equal(sum.Sum(nil), want[:]) ||
		resp.Header.Get("Content-Type") != "video/mp4" || resp.ContentLength != int64(len(data)) {
		t.Fatalf("download: %d, %d bytes (%v), %v", resp.StatusCode, n, err, resp.Header)
	}
	noToken(relayResp{header: resp.Header})
	if peak-before > maxGrowth {
		t.Fatalf("Caddy's resident set grew by %d MB during a 20 MB download", (peak-before)>>20)
	}

	req, _ = http.NewRequest("GET", m.URL, nil)
	req.Header.Set("Authorization", "Bearer "+ch.ChannelToken)
	req.Header.Set("Range", "bytes=0-99")
	part := do(t, req)
	if part.status != 206 || !bytes.Equal(part.body, data[:100]) || part.header.Get("Content-Range") != "bytes 0-99/20971520" {
		t.Fatalf("range: %d, %d bytes, %v", part.status, len(part.body), part.header)
	}

	expectRelayError(t, call(t, "GET", m.URL, "", ""), 401, "Authorization header required")
	expectRelayError(t, call(t, "GET", base+"/"+created.ID, other.ChannelToken, ""), 403, "Path not allowed for this channel")
	expectRelayError(t, call(t, "GET", m.URL, other.ChannelToken, ""), 403, "Path not allowed for this channel")
}

func flatten(h http.Header) []string {
	var out []string
	for k, v := range h {
		out = append(out, k+": "+strings.Join(v, ","))
	}
	return out
}
