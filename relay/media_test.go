package relay

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
)

// mediaMetrics records the media metrics.
type mediaMetrics struct {
	mu    sync.Mutex
	bytes map[string]int64
	first int
}

func (m *mediaMetrics) Answered(Outcome)              {}
func (m *mediaMetrics) UpstreamLatency(time.Duration) {}
func (m *mediaMetrics) MediaBytes(dir string, n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.bytes[dir] += n
}
func (m *mediaMetrics) MediaFirstByte(time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.first++
}

// mediaForm is an upload's multipart body (messaging_product, the file, its type) and its
// Content-Type.
func mediaForm(t *testing.T, filename string, data []byte, mime string) (*bytes.Buffer, string) {
	t.Helper()
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	if err := mw.WriteField("messaging_product", "whatsapp"); err != nil {
		t.Fatal(err)
	}
	part, err := mw.CreateFormFile("file", filename)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := part.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := mw.WriteField("type", mime); err != nil {
		t.Fatal(err)
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return &form, mw.FormDataContentType()
}

// serveReq runs r through the relay with the channel's token and the fake.
func (f *relayFixture) serveReq(r *http.Request) *httptest.ResponseRecorder {
	f.t.Helper()
	r.Header.Set("Authorization", "Bearer "+f.token)
	w := httptest.NewRecorder()
	f.relay.Serve(w, r, f.upstream)
	f.wait()
	return w
}

// TestRelayMediaRoundTrip: an upload through the relay enters the channel's scope; the media
// object's url becomes the relay's download URL (no upstream host, no token); the download
// streams the exact bytes with their type and length; a range gets 206 with exactly those
// bytes; the bytes are counted by direction.
func TestRelayMediaRoundTrip(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	m := &mediaMetrics{bytes: map[string]int64{}}
	f.relay.Metrics = m
	data := make([]byte, 300<<10)
	rand.Read(data)

	form, ctype := mediaForm(t, "photo.jpg", data, "image/jpeg")
	r := httptest.NewRequest("POST", "http://relay.example.com/"+tPNID+"/media", bytes.NewReader(form.Bytes()))
	r.Header.Set("Content-Type", ctype)
	w := f.serveReq(r)
	var up struct{ ID string }
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &up) != nil || up.ID == "" {
		t.Fatalf("upload: %d %s", w.Code, w.Body)
	}
	if got := m.bytes["upload"]; got != int64(form.Len()) {
		t.Fatalf("upload bytes counted %d, want %d", got, form.Len())
	}

	w = f.serve("GET", "/"+up.ID, "", nil)
	var raw map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &raw); err != nil {
		t.Fatalf("media object: %d %s: %v", w.Code, w.Body, err)
	}
	want := "https://relay.example.com/upstream-proxy/" + up.ID + "/download"
	if w.Code != 200 || raw["url"] != want || raw["mime_type"] != "image/jpeg" {
		t.Fatalf("media object: %d %s (url want %s)", w.Code, w.Body, want)
	}
	if strings.Contains(w.Body.String(), strings.TrimPrefix(f.fake.URL(), "http://")) || strings.Contains(w.Body.String(), tUpstream) {
		t.Fatalf("media object leaks the media host or the token: %s", w.Body)
	}

	w = f.serve("GET", "/"+up.ID+"/download", "", nil)
	if w.Code != 200 || !bytes.Equal(w.Body.Bytes(), data) || w.Header().Get("Content-Type") != "image/jpeg" ||
		w.Header().Get("Content-Length") != "307200" {
		t.Fatalf("download: %d, %d bytes, %v", w.Code, w.Body.Len(), w.Header())
	}
	r = httptest.NewRequest("GET", "http://relay.example.com/"+up.ID+"/download", nil)
	r.Header.Set("Range", "bytes=0-99")
	w = f.serveReq(r)
	if w.Code != http.StatusPartialContent || !bytes.Equal(w.Body.Bytes(), data[:100]) ||
		w.Header().Get("Content-Range") != "bytes 0-99/307200" {
		t.Fatalf("range: %d, %d bytes, %v", w.Code, w.Body.Len(), w.Header())
	}
	if got := m.bytes["download"]; got != int64(len(data))+100 || m.first != 2 {
		t.Fatalf("download bytes counted %d (first bytes %d), want %d", got, m.first, len(data)+100)
	}
	for _, req := range f.fake.Requests() {
		if strings.HasPrefix(req.Path, "/whatsapp_business/") && req.Header.Get("Authorization") != "Bearer "+tUpstream {
			t.Fatalf("the media host was asked without the channel's upstream token: %v", req.Header)
		}
	}
}

// TestRelayMediaMasksTheToken: a medium that holds the upstream token — at its start, its end
// and across the copy buffer's boundaries — is downloaded with every occurrence masked and
// its length kept (Content-Length holds); the other bytes are the medium's.
func TestRelayMediaMasksTheToken(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	data := make([]byte, 1<<20)
	rand.Read(data)
	at := []int{0, 5, 128<<10 - 1, 128<<10 - len(tUpstream)/2, 256 << 10, 300001, len(data) - len(tUpstream)}
	for _, i := range at {
		copy(data[i:], tUpstream)
	}
	form, ctype := mediaForm(t, "clip.mp4", data, "video/mp4")
	r := httptest.NewRequest("POST", "http://relay.example.com/"+tPNID+"/media", bytes.NewReader(form.Bytes()))
	r.Header.Set("Content-Type", ctype)
	w := f.serveReq(r)
	var up struct{ ID string }
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &up) != nil || up.ID == "" {
		t.Fatalf("upload: %d %s", w.Code, w.Body)
	}
	masked := bytes.ReplaceAll(data, []byte(tUpstream), bytes.Repeat([]byte("*"), len(tUpstream)))
	w = f.serve("GET", "/"+up.ID+"/download", "", nil)
	if w.Code != 200 || w.Header().Get("Content-Length") != "1048576" || bytes.Contains(w.Body.Bytes(), []byte(tUpstream)) ||
		!bytes.Equal(w.Body.Bytes(), masked) {
		t.Fatalf("download: %d, %d bytes, token there: %v, as masked: %v", w.Code, w.Body.Len(),
			bytes.Contains(w.Body.Bytes(), []byte(tUpstream)), bytes.Equal(w.Body.Bytes(), masked))
	}
}

// TestRelayMediaScope: a medium that is not the channel's is refused — object and download
// alike — without asking the upstream; a deleted one answers the upstream's own error.
func TestRelayMediaScope(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	f.fake.AddNumber("1002", tWABA, "+1 555 0101", "Other")
	f.fake.AddMedia("9090", "1002", "image/png", []byte("not yours"))
	never := func(http.ResponseWriter, *http.Request) error {
		t.Error("the upstream was asked")
		return nil
	}
	expectError(t, f.serve("GET", "/9090", "", never), 403, MsgPathNotAllowed)
	expectError(t, f.serve("GET", "/9090/download", "", never), 403, MsgPathNotAllowed)

	f.fake.AddMedia("7070", tPNID, "image/png", []byte("mine"))
	if _, err := f.store.AdmitChannelObjects(context.Background(), f.channel, "media", []string{"7070"}); err != nil {
		t.Fatal(err)
	}
	f.relay.Channels.(*Cache).Invalidate(f.channel)
	if w := f.serve("GET", "/7070/download", "", nil); w.Code != 200 || w.Body.String() != "mine" {
		t.Fatalf("own medium: %d %s", w.Code, w.Body)
	}
	if w := f.serve("GET", "/7070?phone_number_id="+tPNID, "", nil); w.Code != 200 || !strings.Contains(w.Body.String(), "/7070/download") {
		t.Fatalf("metadata with its number: %d %s", w.Code, w.Body)
	}
	if w := f.serve("GET", "/7070?phone_number_id=1002", "", nil); w.Code != 400 {
		t.Fatalf("metadata with another number: %d %s", w.Code, w.Body)
	}
	if w := f.serve("DELETE", "/7070", "", nil); w.Code != 200 {
		t.Fatalf("delete: %d %s", w.Code, w.Body)
	}
	if w := f.serve("GET", "/7070/download", "", nil); w.Code != 400 || !strings.Contains(w.Body.String(), `"code":100`) {
		t.Fatalf("deleted medium: %d %s", w.Code, w.Body)
	}
}

// TestRelayMediaDeadToken: a code 190 on the media object call is the relay's 503 and marks
// the channel, as everywhere else.
func TestRelayMediaDeadToken(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	f.fake.AddMedia("8080", tPNID, "image/png", []byte("x"))
	if _, err := f.store.AdmitChannelObjects(context.Background(), f.channel, "media", []string{"8080"}); err != nil {
		t.Fatal(err)
	}
	f.relay.Channels.(*Cache).Invalidate(f.channel)
	f.fake.FailNext("GET /8080", 1, 0, fakegraph.ErrInvalidToken())
	w := f.serve("GET", "/8080/download", "", nil)
	expectError(t, w, 503, MsgDisconnected)
	if w.Header().Get("Www-Authenticate") != "" {
		t.Fatal("the upstream's challenge leaked into the relay's answer")
	}
	if ch, err := f.store.RelayChannelByToken(context.Background(), f.token); err != nil || !ch.Disconnected {
		t.Fatalf("channel not marked: %+v %v", ch, err)
	}
}
