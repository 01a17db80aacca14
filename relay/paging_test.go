package relay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
)

const testBase = "https://relay.example.com/upstream-proxy"

// streamPaging runs body through a pagingRewriter in writes of the given sizes (the rest in a
// last write) and returns what it passed on.
func streamPaging(t testing.TB, body []byte, sizes ...int) []byte {
	t.Helper()
	var out bytes.Buffer
	var p pagingRewriter
	p.reset(&out, testBase)
	rest := body
	for _, n := range sizes {
		k := min(n, len(rest))
		if n, err := p.Write(rest[:k]); err != nil || n != k {
			t.Fatalf("Write = %d, %v", n, err)
		}
		if len(p.held) > maxPagingLink || len(p.key) > maxPagingKey {
			t.Fatalf("held %d bytes of link, %d of name", len(p.held), len(p.key))
		}
		rest = rest[k:]
	}
	if _, err := p.Write(rest); err != nil {
		t.Fatal(err)
	}
	if err := p.flush(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// pagingCases are valid JSON bodies for the rewriters: where links are, and where look-alikes
// are that must stay as they are.
var pagingCases = []string{
	`{"data":[{"id":"1","name":"hello"}],"paging":{"cursors":{"before":"B","after":"A"},` +
		`"next":"https://graph.facebook.com/v26.0/999/message_templates?fields=name&limit=1&access_token=EAAGsecret&after=A",` +
		`"previous":"https://graph.facebook.com/v26.0/999/message_templates?access_token=EAAGsecret&before=B"}}`,
	// paging first, white space everywhere, escapes in the links and names
	" \n{ \"paging\" :\t{ \"n\\u0065xt\" : \"https:\\/\\/graph.facebook.com\\/v26.0\\/9\\/x?access_token=T\\u0026after=A\\\"q\" ,\r\n" +
		` "previous":"https://graph.facebook.com/v26.0/9/x?before=\\\\"} , "data" : [ ] } `,
	`{"pag\u0069ng":{"previous":"https://graph.facebook.com/v26.0/9/x?access_token=T&before=B"}}`,
	// "paging" inside strings, in nested objects, after the first: none rewritten
	`{"note":"\"paging\":{\"next\":\"https://graph.facebook.com/v26.0/1/x?access_token=T\"}","data":[{"paging":{"next":"https://graph.facebook.com/v26.0/nested"}}],` +
		`"x":{"paging":{"next":"https://graph.facebook.com/v26.0/deep"}},"paging":{"next":"https://graph.facebook.com/v26.0/2/x?after=A"},"paging":{"next":"https://graph.facebook.com/v26.0/second"}}`,
	`{"next":"https://graph.facebook.com/v26.0/top","paging":{"cursors":{"next":"https://graph.facebook.com/v26.0/cursor"},"next":"https://graph.facebook.com/v26.0/3/x"}}`,
	// values that are no links
	`{"paging":{"next":1,"previous":null,"next":{"next":"https://graph.facebook.com/v26.0/obj"},"previous":["https://graph.facebook.com/v26.0/arr"],"next":""}}`,
	`{"paging":"https://graph.facebook.com/v26.0/str","next":"https://graph.facebook.com/v26.0/after"}`,
	`{"paging":[{"next":"https://graph.facebook.com/v26.0/arr"}],"paging":{"next":"https://graph.facebook.com/v26.0/second"}}`,
	`{"paging":{"next":"::not a url"}}`,
	`{"paging":{"next":"https://graph.facebook.com/v26.0/x?a=1","next":"https://graph.facebook.com/v26.0/y?b=2"}}`,
	// not an object at the top
	`[{"paging":{"next":"https://graph.facebook.com/v26.0/arr"}}]`,
	`"paging"`, `12`, `null`, `{}`, `{"paging":{}}`,
	`{"a":"\\","paging":{"next":"https://graph.facebook.com/v26.0/é/x?q=\u00e9"}}`,
}

// TestPagingRewriterMatchesBuffered: for valid JSON the streamed rewrite is the buffered one,
// byte for byte, whether the body comes whole, a byte at a time, or in two writes split at any
// byte.
func TestPagingRewriterMatchesBuffered(t *testing.T) {
	for _, c := range pagingCases {
		body := []byte(c)
		if !json.Valid(body) {
			t.Fatalf("not JSON: %s", c)
		}
		want := string(rewritePaging(body, testBase))
		if got := string(streamPaging(t, body)); got != want {
			t.Fatalf("whole:\n got %s\nwant %s", got, want)
		}
		ones := make([]int, len(body))
		for i := range ones {
			ones[i] = 1
		}
		if got := string(streamPaging(t, body, ones...)); got != want {
			t.Fatalf("a byte at a time:\n got %s\nwant %s", got, want)
		}
		for i := 0; i <= len(body); i++ {
			if got := string(streamPaging(t, body, i)); got != want {
				t.Fatalf("split at %d:\n got %s\nwant %s", i, got, want)
			}
		}
	}
	// the cases do rewrite what they should
	if got := string(streamPaging(t, []byte(pagingCases[3]))); !strings.Contains(got, `"paging":{"next":"`+testBase+`/2/x?after=A"}`) ||
		strings.Count(got, testBase) != 1 {
		t.Fatalf("look-alikes: %s", got)
	}
}

// randomJSON writes a random JSON value of the given depth to b, built to hold paging objects,
// links, escaped names and look-alikes in many places.
func randomJSON(r *rand.Rand, b *bytes.Buffer, depth int) {
	sp := func() {
		if r.IntN(4) == 0 {
			b.WriteString([]string{" ", "\n", "\t ", "\r\n  "}[r.IntN(4)])
		}
	}
	names := []string{`"paging"`, `"next"`, `"previous"`, `"data"`, `"cursors"`, `"pag\u0069ng"`, `"n\u0065xt"`, `"p\"x"`, `"x\\"`}
	links := []string{`"https://graph.facebook.com/v26.0/9/x?access_token=T&after=A"`, `"https:\/\/graph.facebook.com\/v26.0\/9\/x?a=\"b\"\\"`,
		`""`, `"::"`, `"https://graph.facebook.com/v26.0/9/x?q=\u00e9&access_token"`, `"{\"paging\":[\"next\"]}"`}
	sp()
	switch k := r.IntN(6); {
	case depth > 3 || k == 0:
		b.WriteString([]string{`1`, `-2.5e3`, `true`, `null`, `"s"`}[r.IntN(5)])
	case k == 1:
		b.WriteString(links[r.IntN(len(links))])
	case k == 2:
		b.WriteByte('[')
		for i, n := 0, r.IntN(3); i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			randomJSON(r, b, depth+1)
		}
		sp()
		b.WriteByte(']')
	default:
		b.WriteByte('{')
		for i, n := 0, r.IntN(5); i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			sp()
			b.WriteString(names[r.IntN(len(names))])
			sp()
			b.WriteByte(':')
			randomJSON(r, b, depth+1)
		}
		sp()
		b.WriteByte('}')
	}
	sp()
}

// TestPagingRewriterRandom: on thousands of random JSON documents split at random places, the
// streamed rewrite is the buffered one.
func TestPagingRewriterRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 1))
	rewritten := 0
	for n := 0; n < 5000; n++ {
		var b bytes.Buffer
		b.WriteByte('{') // mostly objects at the top, as answers are
		if r.IntN(10) == 0 {
			b.Reset()
			randomJSON(r, &b, 0)
		} else {
			for i, m := 0, r.IntN(4); i < m; i++ {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString([]string{`"paging"`, `"data"`, `"pag\u0069ng"`}[r.IntN(3)])
				b.WriteByte(':')
				if r.IntN(2) == 0 {
					randomJSON(r, &b, 1)
					continue
				}
				// a paging object of links and look-alikes
				b.WriteByte('{')
				for j, l := 0, r.IntN(4); j < l; j++ {
					if j > 0 {
						b.WriteByte(',')
					}
					b.WriteString([]string{`"next"`, `"previous"`, `"n\u0065xt"`, `"cursors"`, `"nex"`}[r.IntN(5)])
					b.WriteString([]string{":", " : "}[r.IntN(2)])
					if r.IntN(3) == 0 {
						randomJSON(r, &b, 2)
					} else {
						b.WriteString([]string{`"https://graph.facebook.com/v26.0/9/x?access_token=T&after=A"`, `"https:\/\/graph.facebook.com\/v26.0\/9\/x?a=\"b\"\\"`}[r.IntN(2)])
					}
				}
				b.WriteByte('}')
			}
			b.WriteByte('}')
		}
		body := b.Bytes()
		if !json.Valid(body) {
			t.Fatalf("generated invalid JSON: %s", body)
		}
		want := rewritePaging(body, testBase)
		if !bytes.Equal(want, body) {
			rewritten++
		}
		var sizes []int
		for i, m := 0, r.IntN(6); i < m; i++ {
			sizes = append(sizes, r.IntN(len(body)+1))
		}
		if got := streamPaging(t, body, sizes...); !bytes.Equal(got, want) {
			t.Fatalf("%s in writes of %v:\n got %s\nwant %s", body, sizes, got, want)
		}
	}
	if rewritten < 500 {
		t.Fatalf("only %d of the documents had a link rewritten: the generator misses the point", rewritten)
	}
}

// FuzzPagingRewriter: whatever the valid JSON and its writes, the streamed rewrite is the
// buffered one; whatever the bytes, it never holds more than its caps.
func FuzzPagingRewriter(f *testing.F) {
	for _, c := range pagingCases {
		f.Add([]byte(c), []byte{3, 0, 50})
	}
	for _, in := range hugeSeeds() {
		f.Add([]byte(in), []byte{255, 7})
	}
	f.Fuzz(func(t *testing.T, body, splits []byte) {
		sizes := make([]int, len(splits))
		for i, s := range splits {
			sizes[i] = int(s)
		}
		got := streamPaging(t, body, sizes...)
		// (A link longer than maxPagingLink passes on unrewritten, by design: only bodies
		// that cannot hold one are compared.)
		if len(body) <= maxPagingLink && json.Valid(body) {
			if want := rewritePaging(body, testBase); !bytes.Equal(got, want) {
				t.Fatalf("%q:\n got %q\nwant %q", body, got, want)
			}
		}
	})
}

// TestPagingRewriterLongLink: a link longer than maxPagingLink passes on as the upstream wrote
// it, never held whole; a link of maxPagingLink bytes is rewritten.
func TestPagingRewriterLongLink(t *testing.T) {
	link := func(n int) string { // a raw JSON string of n bytes, quotes included
		s := `"https://graph.facebook.com/v26.0/9/x?access_token=T&after=`
		return s + strings.Repeat("A", n-len(s)-1) + `"`
	}
	long := `{"paging":{"next":` + link(maxPagingLink+1) + `,"previous":"https://graph.facebook.com/v26.0/9/x?before=B"}}`
	got := string(streamPaging(t, []byte(long), 100, 4096, 30000, 40000))
	want := `{"paging":{"next":` + link(maxPagingLink+1) + `,"previous":"` + testBase + `/9/x?before=B"}}`
	if got != want {
		t.Fatalf("long link: got %d bytes, want %d (%.80s…)", len(got), len(want), got)
	}
	fits := `{"paging":{"next":` + link(maxPagingLink) + `}}`
	if got, want := streamPaging(t, []byte(fits), 100, 60000), rewritePaging([]byte(fits), testBase); !bytes.Equal(got, want) {
		t.Fatalf("a link of the cap: got %.80s…", got)
	}
}

// templatePage is a virtual template listing of about size bytes: head, then body repeated,
// then tail (built without holding the page: a 50 MiB page is never in memory).
type templatePage struct {
	head, unit, tail []byte
	units            int
}

// newTemplatePage returns the upstream's page (links to the upstream carrying token) and the
// page the caller must get (links to the relay, token masked), with paging first or last.
func newTemplatePage(size int, token string, pagingFirst bool) (up, want templatePage) {
	const after, before = "QVFIUmF3dGVtcGxhdGVfYWZ0ZXI", "QVFIUmJlZm9yZQ"
	upPaging := `"paging":{"cursors":{"before":"` + before + `","after":"` + after + `"},` +
		`"next":"https://graph.facebook.com/v26.0/` + tWABA + `/message_templates?access_token=` + token + `&limit=100000&after=` + after + `",` +
		`"previous":"https://graph.facebook.com/v26.0/` + tWABA + `/message_templates?access_token=` + token + `&limit=100000&before=` + before + `"}`
	wantPaging := `"paging":{"cursors":{"before":"` + before + `","after":"` + after + `"},` +
		`"next":"https://relay.example.com/upstream-proxy/` + tWABA + `/message_templates?limit=100000&after=` + after + `",` +
		`"previous":"https://relay.example.com/upstream-proxy/` + tWABA + `/message_templates?limit=100000&before=` + before + `"}`
	// A template whose text holds "paging" look-alikes and a nested paging object, none of
	// them the page's.
	unit := `{"name":"order_update","components":[{"type":"BODY","text":"Hi {{1}}, \"paging\":{\"next\":\"https://graph.facebook.com/v26.0/x\"} \u00e9"}],` +
		`"paging":{"next":"https://graph.facebook.com/v26.0/nested?after=N"},"language":"en_US","status":"APPROVED","category":"UTILITY","id":"1234567890"}`
	first := `{"name":"token_holder","note":"` + token + `","id":"1"}` // the token in the data: masked
	masked := `{"name":"token_holder","note":"` + strings.Repeat("*", len(token)) + `","id":"1"}`
	var upHead, wantHead, upTail, wantTail string
	if pagingFirst {
		upHead, wantHead = `{`+upPaging+`,"data":[`+first, `{`+wantPaging+`,"data":[`+masked
		upTail, wantTail = `]}`, `]}`
	} else {
		upHead, wantHead = `{"data":[`+first, `{"data":[`+masked
		upTail, wantTail = `],`+upPaging+`}`, `],`+wantPaging+`}`
	}
	n := max(0, (size-len(upHead)-len(upTail))/(len(unit)+1))
	up = templatePage{[]byte(upHead), []byte("," + unit), []byte(upTail), n}
	want = templatePage{[]byte(wantHead), []byte("," + unit), []byte(wantTail), n}
	return up, want
}

func (p templatePage) size() int { return len(p.head) + p.units*len(p.unit) + len(p.tail) }

// bytes builds the whole page (small pages only).
func (p templatePage) bytes() []byte {
	return append(append(append([]byte{}, p.head...), bytes.Repeat(p.unit, p.units)...), p.tail...)
}

// reader reads the page as it is built, from three fixed slices.
func (p templatePage) reader() io.Reader {
	parts := []io.Reader{bytes.NewReader(p.head)}
	for range p.units {
		parts = append(parts, bytes.NewReader(p.unit))
	}
	return io.MultiReader(append(parts, bytes.NewReader(p.tail))...)
}

// pageChecker is a ResponseWriter that compares what it gets with the page the caller must get,
// as it comes, keeping none of it.
type pageChecker struct {
	h       http.Header
	status  int
	want    io.Reader
	scratch []byte
	n       int   // bytes got
	diff    int   // offset of the first difference; -1 if none
	err     error // of reading want
}

func (c *pageChecker) Header() http.Header { return c.h }
func (c *pageChecker) WriteHeader(s int) {
	if c.status == 0 {
		c.status = s
	}
}

func (c *pageChecker) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = 200
	}
	n := len(p)
	for len(p) > 0 && c.diff < 0 {
		k := min(len(p), len(c.scratch))
		if _, err := io.ReadFull(c.want, c.scratch[:k]); err != nil {
			c.diff, c.err = c.n, err
			break
		}
		if i := firstDiff(c.scratch[:k], p[:k]); i >= 0 {
			c.diff = c.n + i
			break
		}
		c.n += k
		p = p[k:]
	}
	return n, nil
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestRelayRewritesPagingOfLargeAnswers: a template page too large to inspect (9 MiB and
// 50 MiB, paging last and first) reaches the caller through the relay's real path with its
// paging links pointing at {proxy_url} without access_token, the token masked in the data,
// every other byte the upstream's — and without the page being buffered: what the relay
// allocates while serving it does not grow with the page.
func TestRelayRewritesPagingOfLargeAnswers(t *testing.T) {
	f := newRelayFixture(t, 100, nil)
	// The small page: the links the big ones must get are the buffered rewrite's.
	up, want := newTemplatePage(4<<10, tUpstream, false)
	if !json.Valid(up.bytes()) || !json.Valid(want.bytes()) {
		t.Fatal("the page is no JSON")
	}
	if got := rewritePaging(up.bytes(), testBase); !bytes.Equal(bytes.ReplaceAll(got, []byte(tUpstream), []byte(strings.Repeat("*", len(tUpstream)))), want.bytes()) {
		t.Fatalf("the page the caller must get is not the buffered rewrite:\n%s\n%s", got, want.bytes())
	}
	var allocated [2]uint64
	for _, c := range []struct {
		size        int
		pagingFirst bool
	}{{9 << 20, false}, {9 << 20, true}, {50 << 20, false}, {50 << 20, true}} {
		t.Run(fmt.Sprintf("%dMiB/pagingFirst=%v", c.size>>20, c.pagingFirst), func(t *testing.T) {
			up, want := newTemplatePage(c.size, tUpstream, c.pagingFirst)
			if up.size() <= maxInspectBody {
				t.Fatalf("page of %d bytes: not over the inspection cap", up.size())
			}
			w := &pageChecker{h: http.Header{}, want: want.reader(), scratch: make([]byte, 64<<10), diff: -1}
			r := httptest.NewRequest("GET", "http://relay.example.com/"+tWABA+"/message_templates?limit=100000", nil)
			r.Header.Set("Authorization", "Bearer "+f.token)
			src, chunk := up.reader(), make([]byte, 32<<10)
			upstream := func(w http.ResponseWriter, r *http.Request) error {
				w.Header().Set("Content-Type", "application/json; charset=UTF-8")
				w.Header().Set("Content-Length", fmt.Sprint(up.size()))
				w.Header().Set("Etag", `"upstream"`)
				w.WriteHeader(200)
				_, err := io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{src}, chunk) // in writes of 32 KiB
				return err
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			f.relay.Serve(w, r, upstream)
			runtime.ReadMemStats(&after)
			f.wait()
			if w.status != 200 || w.diff >= 0 || w.n != want.size() {
				t.Fatalf("status %d, %d bytes of %d, first difference at %d (%v)", w.status, w.n, want.size(), w.diff, w.err)
			}
			if cl, et := w.h.Get("Content-Length"), w.h.Get("Etag"); cl != "" || et != "" {
				t.Fatalf("the upstream's Content-Length %q, ETag %q passed on with a rewritten body", cl, et)
			}
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("page %d bytes: the relay allocated %.1f MiB in %d allocations serving it (heap in use %+.1f MiB)",
				up.size(), float64(alloc)/(1<<20), after.Mallocs-before.Mallocs, (float64(after.HeapInuse)-float64(before.HeapInuse))/(1<<20))
			// The inspection buffer grows to the cap (8 MiB, and up to as much again allocated
			// on the way as it doubles, more under the race detector); beyond it nothing is kept
			// of the page.
			if alloc > 3*maxInspectBody {
				t.Fatalf("allocated %d bytes serving a %d-byte page: the page was buffered", alloc, up.size())
			}
			allocated[c.size>>20/50] = max(allocated[c.size>>20/50], alloc)
		})
	}
	// 41 MiB more of the page allocates nothing more: what varies (a few MiB, under the race
	// detector) is how the inspection buffer grew, not the page.
	if allocated[1] > allocated[0]+8<<20 {
		t.Fatalf("the 50 MiB page allocated %d bytes, the 9 MiB one %d: memory grows with the page", allocated[1], allocated[0])
	}
}

// TestPagingRewriterBoundedMemory: a 50 MiB page streamed through the rewriter and the redactor
// (the path of an answer past the inspection cap) allocates next to nothing: no byte of it is
// kept but a link being rewritten.
func TestPagingRewriterBoundedMemory(t *testing.T) {
	up, want := newTemplatePage(50<<20, tUpstream, false)
	chk := &pageChecker{h: http.Header{}, want: want.reader(), scratch: make([]byte, 64<<10), diff: -1}
	var red redactor
	var pg pagingRewriter
	red.reset(chk, tUpstream)
	pg.reset(&red, testBase)
	src, chunk := up.reader(), make([]byte, 32<<10)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for {
		n, err := src.Read(chunk)
		if _, werr := pg.Write(chunk[:n]); werr != nil {
			t.Fatal(werr)
		}
		if err == io.EOF {
			break
		}
	}
	if err := pg.flush(); err != nil {
		t.Fatal(err)
	}
	if err := red.flush(); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if chk.diff >= 0 || chk.n != want.size() {
		t.Fatalf("%d bytes of %d, first difference at %d (%v)", chk.n, want.size(), chk.diff, chk.err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("page %d bytes: rewriter and redactor allocated %d bytes in %d allocations", up.size(), alloc, after.Mallocs-before.Mallocs)
	if alloc > 1<<20 {
		t.Fatalf("allocated %d bytes streaming a %d-byte page", alloc, up.size())
	}
}
