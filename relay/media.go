package relay

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/store"
)

// mediaDownload is the relay's own edge of a medium: GET {proxy_url}/<media_id>/download
// streams its bytes. The upstream's media object answers name it as their url.
const mediaDownload = "download"

// downloadOf reports whether a call is a download of a medium, and the medium's id.
func downloadOf(method, upath string) (id string, ok bool) {
	id, edge, _ := strings.Cut(strings.TrimPrefix(upath, "/"), "/")
	return id, method == http.MethodGet && edge == mediaDownload && id != ""
}

// rewriteMediaURL replaces the string value of the top-level "url" member of a media object
// answer (one that also has "mime_type") with link, in place. Other answers are returned as
// they are.
func rewriteMediaURL(body []byte, link string) []byte {
	if !bytes.Contains(body, []byte(`"mime_type"`)) || !json.Valid(body) {
		return body
	}
	var start, end int
	media := false
	eachMember(body, skipWS(body, 0), func(key []byte, vs, ve int) bool {
		switch {
		case keyIs(key, "url") && body[vs] == '"':
			start, end = vs, ve
		case keyIs(key, "mime_type"):
			media = true
		}
		return true
	})
	if !media || end == 0 {
		return body
	}
	out := make([]byte, 0, len(body)+len(link))
	out = append(append(out, body[:start]...), jsonString(link)...)
	return append(out, body[end:]...)
}

// mediaHeaders are the media host's answer headers passed on to the caller.
var mediaHeaders = []string{"Content-Type", "Content-Length", "Content-Range", "Accept-Ranges",
	"Content-Disposition", "Etag", "Last-Modified", "Cache-Control"}

// mediaRequestHeaders are the caller's headers passed on to the media host (ranges and
// validators).
var mediaRequestHeaders = []string{"Range", "If-Range", "If-None-Match", "If-Modified-Since"}

// defaultMediaClient fetches media when Relay.MediaClient is nil.
var defaultMediaClient = &http.Client{Transport: &http.Transport{
	Proxy:                 http.ProxyFromEnvironment,
	DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	TLSHandshakeTimeout:   10 * time.Second,
	ResponseHeaderTimeout: 30 * time.Second,
	MaxIdleConnsPerHost:   32,
	IdleConnTimeout:       90 * time.Second,
}}

// copyBufs are the buffers media bytes are streamed through: 128 KiB, four times Caddy's
// reverse_proxy's, for fewer read and write system calls per byte relayed.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 128<<10); return &b }}

// mediaRedactors are the redactors media bytes pass (kept for their pair sets).
var mediaRedactors = sync.Pool{New: func() any { return new(redactor) }}

// download streams the bytes of medium id to the caller. The URL it fetches comes from the
// upstream's own media object, asked for with the channel's token — never from the caller, so
// the relay is no open proxy — and is fetched with the channel's token too; neither URL nor
// token ever reaches the caller or a log line. Ranges and validators pass through (206, 304,
// 416); nothing is buffered whole.
func (relay *Relay) download(w http.ResponseWriter, r *http.Request, ch *store.RelayChannel, id string, up Upstream) {
	start := time.Now()
	// 1. The media object.
	obj := r.Clone(r.Context())
	obj.Method, obj.Body, obj.ContentLength, obj.GetBody = http.MethodGet, http.NoBody, 0, nil
	for _, h := range mediaRequestHeaders {
		obj.Header.Del(h)
	}
	obj.URL.RawQuery = ""
	relay.prepare(obj, ch, "/"+id)
	a := newAnswer(discard{}, http.MethodGet, "/"+id, ch, false)
	defer a.free()
	a.limit = 1 << 20
	err, aborted := call(up, a, obj)
	upErr := err
	if aborted && upErr == nil {
		upErr = http.ErrAbortHandler
	}
	// What finish reports is seen below: a.undecodable, the upstream's err, or an answer
	// that was not inspected.
	_ = a.finish(upErr)
	switch {
	case a.refused || a.undecodable:
		relay.refuse(w, OutcomeUpstreamError, http.StatusBadGateway, MsgUpstreamEncoding)
		return
	case err != nil:
		relay.upstreamFailed(w, r, err, false)
		return
	case a.state != inspecting:
		// Not a JSON answer we could read (too large, or not JSON): not a media object.
		relay.refuse(w, OutcomeUpstreamError, http.StatusBadGateway, MsgUpstreamDown)
		return
	}
	body := a.buf.Bytes()
	if TokenDead(a.status, body) {
		relay.disconnected(w, r, ch)
		return
	}
	if a.status != http.StatusOK {
		// The upstream's own refusal (the medium is gone, or not this number's): passed on.
		out := RewriteLinks(body, "", ch.UpstreamToken)
		h := w.Header()
		h.Set("Content-Type", a.hdr.Get("Content-Type"))
		h.Set("Content-Length", strconv.Itoa(len(out)))
		w.WriteHeader(a.status)
		w.Write(out)
		relay.count(outcomeOf(a.status))
		return
	}
	var media struct {
		URL string `json:"url"`
	}
	if json.Unmarshal(body, &media) != nil || media.URL == "" {
		relay.logger().Warn("relay: media object without a url", zap.String("media_id", id))
		relay.refuse(w, OutcomeUpstreamError, http.StatusBadGateway, MsgUpstreamDown)
		return
	}
	u, perr := url.Parse(media.URL)
	if perr != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		relay.logger().Warn("relay: media object with an unusable url", zap.String("media_id", id))
		relay.refuse(w, OutcomeUpstreamError, http.StatusBadGateway, MsgUpstreamDown)
		return
	}

	// 2. The bytes, from the media host.
	req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, u.String(), nil)
	req.Header.Set("Authorization", "Bearer "+ch.UpstreamToken)
	req.Header.Set("Accept-Encoding", "identity") // the bytes as they are, with their length
	req.Header.Set("User-Agent", "wabarelay")
	for _, h := range mediaRequestHeaders {
		if v := r.Header.Values(h); len(v) > 0 {
			req.Header[h] = v
		}
	}
	client := relay.MediaClient
	if client == nil {
		client = defaultMediaClient
	}
	resp, err := client.Do(req)
	if err != nil {
		if r.Context().Err() != nil {
			return // the caller went away
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL
		}
		relay.upstreamFailed(w, r, err, false)
		return
	}
	defer resp.Body.Close()
	if relay.Metrics != nil {
		relay.Metrics.MediaFirstByte(time.Since(start))
	}
	if resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnauthorized {
		// Perhaps a dead token (code 190): a small error answer, read to tell.
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if TokenDead(resp.StatusCode, b) {
			relay.disconnected(w, r, ch)
			return
		}
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), resp.Body))
	}
	// The bytes as they are, unless the media host encoded them anyway: gzip and deflate are
	// decoded (their length is then unknown), anything else is refused — the token could not
	// be looked for in it.
	src, length := io.Reader(resp.Body), resp.ContentLength
	switch ce := strings.ToLower(strings.TrimSpace(strings.Join(resp.Header.Values("Content-Encoding"), ","))); ce {
	case "", "identity":
	case "gzip", "x-gzip", "deflate":
		if src, err = decodingReader(resp.Body, ce); err != nil {
			relay.refuse(w, OutcomeUpstreamError, http.StatusBadGateway, MsgUpstreamEncoding)
			return
		}
		length = -1
		resp.Header.Del("Etag")
		resp.Header.Del("Content-Range")
	default:
		relay.refuse(w, OutcomeUpstreamError, http.StatusBadGateway, MsgUpstreamEncoding)
		return
	}
	h := w.Header()
	for _, name := range mediaHeaders {
		if v := resp.Header.Values(name); len(v) > 0 && name != "Content-Length" {
			h[name] = v
		}
	}
	redactHeader(h, ch.UpstreamToken)
	if length >= 0 {
		h.Set("Content-Length", strconv.FormatInt(length, 10))
	}
	w.WriteHeader(resp.StatusCode)
	// Media bytes pass the redactor too (a medium never names the token, but an error answer
	// of the media host could): masks keep their length, so Content-Length and ranges hold.
	red := mediaRedactors.Get().(*redactor)
	red.reset(onlyWriter{w}, ch.UpstreamToken)
	buf := copyBufs.Get().(*[]byte)
	n, cerr := io.CopyBuffer(red, src, *buf)
	copyBufs.Put(buf)
	if cerr == nil {
		_ = red.flush() // a failed write is the caller's hang-up: the status is sent and counted
	}
	red.reset(nil, "")
	mediaRedactors.Put(red)
	if relay.Metrics != nil {
		relay.Metrics.MediaBytes("download", n)
	}
	relay.count(outcomeOf(resp.StatusCode))
}

// onlyWriter hides every method but Write (io.CopyBuffer then uses the buffer given).
type onlyWriter struct{ io.Writer }

// discard is a ResponseWriter that keeps nothing (the answer writer buffers what it needs).
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) WriteHeader(int)             {}
func (discard) Write(p []byte) (int, error) { return len(p), nil }

// countingReader counts the bytes read through it (upload metrics, decoded answers).
type countingReader struct {
	r io.ReadCloser
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

// decodingReader decodes a gzip or deflate body as it is read.
func decodingReader(r io.Reader, encoding string) (io.Reader, error) {
	if encoding == "deflate" {
		return zlib.NewReader(r)
	}
	return gzip.NewReader(r)
}
