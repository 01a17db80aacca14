package relay

import (
	"bytes"
	"fmt"
	"io"
	"math/rand"
	"strings"
	"testing"
)

// redactAll runs s through a redactor of secret in writes of the given sizes (0 = an empty
// write; the rest of s goes in one last write) and returns what came out.
func redactAll(t testing.TB, s, secret string, sizes ...int) string {
	var out bytes.Buffer
	var r redactor
	r.reset(&out, secret)
	for _, n := range sizes {
		n = min(n, len(s))
		if k, err := r.Write([]byte(s[:n])); err != nil || k != n {
			t.Fatalf("Write = %d, %v", k, err)
		}
		s = s[n:]
	}
	if _, err := r.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := r.flush(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// want is the redactor's expected output: every occurrence, left to right, masked.
func want(s, secret string) string {
	if secret == "" {
		return s
	}
	c, _ := maskByte([]byte(secret))
	return strings.ReplaceAll(s, secret, strings.Repeat(string(c), len(secret)))
}

var redactCases = []struct{ s, secret string }{
	{"", "tok"},
	{"tok", "tok"},
	{"xtokx", "tok"},
	{"tokentoktok", "tok"},
	{"aaab", "aab"}, // overlapping prefixes
	{"aaaab aab aaab", "aab"},
	{"abababab", "abab"},
	{"abababa", "aba"},
	{"no secret at all here", "EAAGsecret"},
	{`{"paging":{"next":"https://graph.facebook.com/v26.0/2001/message_templates?access_token=EAAGsecret&after=QVFI"}}`, "EAAGsecret"},
	{"EAAGsecretEAAGsecretEAAGsecre", "EAAGsecret"}, // ends in a prefix
	{"EAAGEAAGsecretEAAG", "EAAGsecret"},
	{"t", "tok"},
	{"to", "tok"},
	{"a*b a*b", "a*b"}, // the secret holds the usual mask byte
	{"x", "x"},
	{"xxxx", "x"},
	{"short", "a much longer secret than any write"},
	{"..a much longer secret than any write..a much longer", "a much longer secret than any write"},
}

// TestRedactorEveryBoundary: whatever the writes look like — the secret split at every
// possible point, across three writes, byte by byte, with empty writes between — the output
// is the input with every occurrence masked, of the same length, and never holds the secret.
func TestRedactorEveryBoundary(t *testing.T) {
	for _, c := range redactCases {
		w := want(c.s, c.secret)
		if len(w) != len(c.s) || c.secret != "" && strings.Contains(w, c.secret) {
			t.Fatalf("reference wrong for %q", c.s)
		}
		check := func(got string, how string) {
			t.Helper()
			if got != w {
				t.Fatalf("%q / %q in writes %s: got %q, want %q", c.s, c.secret, how, got, w)
			}
		}
		check(redactAll(t, c.s, c.secret), "[all]")
		for i := 0; i <= len(c.s); i++ {
			check(redactAll(t, c.s, c.secret, i), "[i]")
			check(redactAll(t, c.s, c.secret, 0, i, 0), "[0 i 0]")
			for j := 0; j <= len(c.s)-i; j++ {
				check(redactAll(t, c.s, c.secret, i, j), "[i j]")
			}
		}
		ones := make([]int, 2*len(c.s))
		for i := range ones {
			ones[i] = i % 2 // byte, empty, byte, ...
		}
		check(redactAll(t, c.s, c.secret, ones...), "[1 0 1 0 ...]")
	}
}

// TestRedactorPassesAtOnce: bytes that cannot start the secret are passed on by the write that
// brought them (a streamed answer is not held back); only a tail that may start it waits.
func TestRedactorPassesAtOnce(t *testing.T) {
	var out bytes.Buffer
	var r redactor
	r.reset(&out, "EAAGsecret")
	write := func(s string) {
		t.Helper()
		if _, err := r.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"messaging_product":"whatsapp",`)
	if out.String() != `{"messaging_product":"whatsapp",` {
		t.Fatalf("held back: %q", out.String())
	}
	write(`"x":"EAAG`)
	if out.String() != `{"messaging_product":"whatsapp","x":"` {
		t.Fatalf("a possible start not held back: %q", out.String())
	}
	if len(r.held) != len("EAAG") {
		t.Fatalf("held %d bytes", len(r.held))
	}
	write(`secret"}`)
	if err := r.flush(); err != nil {
		t.Fatal(err)
	}
	if out.String() != `{"messaging_product":"whatsapp","x":"**********"}` {
		t.Fatalf("got %q", out.String())
	}
}

// TestRedactorManyOccurrencesBoundedMemory: a long stream with many occurrences, many at chunk
// boundaries, keeps at most len(secret)-1 bytes back.
func TestRedactorManyOccurrencesBoundedMemory(t *testing.T) {
	secret := "EAAGrealUpstreamToken1234567890"
	unit := "0123456789abcdefghij" + secret + "klmnop"
	s := strings.Repeat(unit, 4000)
	var out bytes.Buffer
	var r redactor
	r.reset(&out, secret)
	for rest, n := s, 1; rest != ""; n = n%61 + 1 {
		n = min(n, len(rest))
		if _, err := r.Write([]byte(rest[:n])); err != nil {
			t.Fatal(err)
		}
		if len(r.held) >= len(secret) {
			t.Fatalf("held %d bytes", len(r.held))
		}
		rest = rest[n:]
	}
	if err := r.flush(); err != nil {
		t.Fatal(err)
	}
	if out.String() != want(s, secret) {
		t.Fatal("output differs")
	}
}

func TestRedactString(t *testing.T) {
	if got := redactString("Bearer EAAGx; EAAGx", "EAAGx"); got != "Bearer *****; *****" {
		t.Fatalf("got %q", got)
	}
	h := map[string][]string{"Link": {"<https://x/?access_token=EAAGx>", "b"}, "X": {"y"}}
	orig := h["Link"]
	redactHeader(h, "EAAGx")
	if h["Link"][0] != "<https://x/?access_token=*****>" || h["Link"][1] != "b" || orig[0] != "<https://x/?access_token=EAAGx>" {
		t.Fatalf("headers %v (original %v)", h, orig)
	}
}

// BenchmarkRedactorBinary passes random bytes (a medium) through a redactor in 32 KiB writes,
// as the media download does, for a short secret (the bench's) and a real token's length.
func BenchmarkRedactorBinary(b *testing.B) {
	data := make([]byte, 1<<20)
	rand.New(rand.NewSource(1)).Read(data)
	for _, secret := range []string{
		"EAAGbenchMediaUpstreamToken0123456789",
		"EAAG" + strings.Repeat("ZCZBq0aXb1Yc2Wd3Ve4Uf5Tg6Sh7Ri8Qj9PkOlNmMnLoKpJqIrHsGtFuEvDwCxByAz", 3),
	} {
		b.Run(fmt.Sprintf("secret%d", len(secret)), func(b *testing.B) {
			var r redactor
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				r.reset(io.Discard, secret)
				for p := data; len(p) > 0; p = p[min(len(p), 32<<10):] {
					if _, err := r.Write(p[:min(len(p), 32<<10)]); err != nil {
						b.Fatal(err)
					}
				}
				if err := r.flush(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestFinderMatchesBytesIndex: the sampled search finds what bytes.Index finds — the first
// occurrence or none — in large data: binary bytes and text of a few letters (many partial
// matches), with the pattern at every offset around the sampled positions, at the start and at
// the end, overlapping itself, and cut short by the end of the data.
func TestFinderMatchesBytesIndex(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	random := func(n int, alphabet string) []byte {
		b := make([]byte, n)
		rng.Read(b)
		if alphabet != "" {
			for i := range b {
				b[i] = alphabet[int(b[i])%len(alphabet)]
			}
		}
		return b
	}
	pats := []string{
		"EAAGbenchMediaUpstreamToken0123456789",
		"EAAG" + strings.Repeat("ZCZBq0aXb1Yc2Wd3Ve4Uf5Tg6Sh7Ri8Qj9PkOlNmMnLoKpJqIrHsGtFuEvDwCxByAz", 3),
		"abababab", // overlaps itself
		"aaaaaaaaab",
		"--boundary4a6b0c",
		"1234567", // below minSampledPattern: bytes.Index
	}
	var f finder
	check := func(data []byte, pat string) {
		t.Helper()
		f.pat = []byte(pat)
		if got, want := f.index(data), bytes.Index(data, f.pat); got != want {
			t.Fatalf("index(%d bytes, %q) = %d, want %d", len(data), pat, got, want)
		}
	}
	for _, pat := range pats {
		m := len(pat)
		for _, alphabet := range []string{"", "ab", "abE", pat[:3]} {
			for _, n := range []int{minSampledData - 1, minSampledData, minSampledData + 1, 3*minSampledData + 17} {
				base := random(n, alphabet)
				check(base, pat)
				// every offset in the first few sample periods, and the last ones
				offsets := []int{}
				for s := 0; s < 3*m && s+m <= n; s++ {
					offsets = append(offsets, s)
				}
				for s := max(0, n-3*m); s+m <= n; s++ {
					offsets = append(offsets, s)
				}
				for _, s := range offsets {
					data := append([]byte(nil), base...)
					copy(data[s:], pat)
					check(data, pat)
					// a second occurrence later, and the pattern cut short at the end
					if s+2*m+5 <= n {
						copy(data[s+m+5:], pat)
						check(data, pat)
					}
					cut := append([]byte(nil), base...)
					copy(cut[n-m+1:], pat)
					check(cut, pat)
				}
			}
		}
	}
	// A finder moved to another pattern forgets the first one's pairs.
	data := random(2*minSampledData, "")
	copy(data[1000:], "EAAGfirstTokenXYZ")
	f.pat = []byte("EAAGfirstTokenXYZ")
	if f.index(data) != 1000 {
		t.Fatal("first pattern not found")
	}
	f.pat = []byte("QQQQsecondToken12")
	if f.index(data) != -1 {
		t.Fatal("found a pattern that is not there")
	}
	copy(data[5000:], f.pat)
	if f.index(data) != 5000 {
		t.Fatal("second pattern not found")
	}
}

// TestRedactorLargeWrites: media-sized writes (the sampled search) mask every occurrence —
// however the writes cut it — and keep the length.
func TestRedactorLargeWrites(t *testing.T) {
	secret := "EAAGbenchMediaUpstreamToken0123456789"
	rng := rand.New(rand.NewSource(3))
	data := make([]byte, 256<<10)
	rng.Read(data)
	for _, s := range []int{0, 1, 35, 36, 37, 4095, 4096 - 20, 32<<10 - 1, 32<<10 - 36, 32 << 10, 100000, len(data) - len(secret)} {
		copy(data[s:], secret)
	}
	w := want(string(data), secret)
	for _, size := range []int{32 << 10, 128 << 10, 5000, 4096, 4095} {
		sizes := make([]int, len(data)/size)
		for i := range sizes {
			sizes[i] = size
		}
		if got := redactAll(t, string(data), secret, sizes...); got != w {
			t.Fatalf("writes of %d: output differs", size)
		}
	}
}

// FuzzFinder: whatever the data and the pattern, the sampled search of large data finds what
// bytes.Index finds (the data is repeated past the sampling threshold; the pattern is planted
// at an offset the fuzzer picks).
func FuzzFinder(f *testing.F) {
	f.Add([]byte("xyz"), "EAAGsecretToken", uint16(100))
	f.Add([]byte("ab"), "abababab", uint16(4095))
	f.Add([]byte{0, 1, 2, 3}, "\x00\x01\x02\x03\x00\x01\x02\x04", uint16(9))
	f.Fuzz(func(t *testing.T, unit []byte, pat string, at uint16) {
		if len(unit) == 0 || pat == "" {
			return
		}
		data := bytes.Repeat(unit, minSampledData/len(unit)+1)
		if int(at)+len(pat) <= len(data) {
			copy(data[at:], pat)
		}
		fd := finder{pat: []byte(pat)}
		if got, want := fd.index(data), bytes.Index(data, []byte(pat)); got != want {
			t.Fatalf("index(%q × %d, %q) = %d, want %d", unit, len(data)/len(unit), pat, got, want)
		}
	})
}
