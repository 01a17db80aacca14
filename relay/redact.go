package relay

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"unsafe"
)

// errUnredactable is returned by a redactor whose secret holds every byte value, so that no
// mask byte is left that could never be part of it (no real token is such a string).
var errUnredactable = errors.New("relay: the upstream token cannot be masked")

// redactor is the last guard between the upstream and the caller: a writer that passes bytes on
// to w with every occurrence of secret (the channel's upstream token) replaced by as many mask
// bytes — a byte that does not occur in secret, '*' for any real token — so that the length of
// what passes is unchanged (Content-Length, Content-Range and byte offsets stay true) and no
// occurrence can form again across a mask. Memory is bounded: a write passes on at once all of
// its bytes but the shortest tail that could still start an occurrence (a proper prefix of
// secret ending the bytes seen so far, at most len(secret)-1 bytes), held back until the next
// write or [redactor.flush] tells. An empty secret passes everything through.
//
// Occurrences are looked for by a [finder]: quickly in large writes (media bytes).
type redactor struct {
	w      io.Writer
	secret []byte // read only: it shares the token string's bytes
	held   []byte // bytes not yet passed on: a proper prefix of secret
	work   []byte // held + the current write, when something was held
	mask   []byte // len(secret) mask bytes, made at the first occurrence
	find   finder // of secret
}

// reset makes r a redactor of secret onto w, keeping its buffers.
func (r *redactor) reset(w io.Writer, secret string) {
	r.w, r.secret, r.held, r.work, r.mask = w, unsafe.Slice(unsafe.StringData(secret), len(secret)), r.held[:0], r.work[:0], r.mask[:0]
	r.find.pat = r.secret
}

// finder looks for a byte string (pat) in data as bytes.Index does, in fewer steps on large
// data of any kind: an occurrence at s (len(pat) = m) holds the byte pairs starting at s …
// s+m-2, m-1 consecutive positions, one of which is a multiple of m-1; so only the pairs at
// multiples of m-1 are looked up in the set of pat's pairs, and around a pair that is one of
// them (at p) the window data[p-m+2 : p+m], which holds every occurrence holding that pair
// there, is searched with bytes.Index. An earlier occurrence would have held an earlier sampled
// pair, so the first found is the first. In bytes that are not text (media), a sampled pair is
// one of pat's about once in 65,536/m: the search reads two bytes in m-1, where bytes.Index
// stops at every byte equal to pat's first (one in 256). Small data and short patterns go to
// bytes.Index. The zero finder is ready: its pair set is made at the first large search and
// kept (remade only for another pattern).
type finder struct {
	pat      []byte   // read only
	pairs    *pairSet // the byte pairs of pairsFor
	pairsFor []byte   // the pattern pairs was made for (nil: none yet)
}

// pairSet is a set of byte pairs (a<<8 | b): 65,536 bits.
type pairSet [1 << 10]uint64

func (t *pairSet) has(a, b byte) bool {
	v := uint(a)<<8 | uint(b)
	return t[v>>6]&(1<<(v&63)) != 0
}

// Sampled search thresholds: data shorter than minSampledData, and patterns shorter than
// minSampledPattern, are searched with bytes.Index (sampling would not pay for itself there).
const (
	minSampledData    = 4 << 10
	minSampledPattern = 8
)

// index returns the index of the first occurrence of f.pat in data, or -1.
func (f *finder) index(data []byte) int {
	m := len(f.pat)
	if m < minSampledPattern || len(data) < minSampledData {
		return bytes.Index(data, f.pat)
	}
	t := f.pairSet()
	for p := 0; p < len(data)-1; p += m - 1 {
		if !t.has(data[p], data[p+1]) {
			continue
		}
		lo, hi := max(0, p-m+2), min(len(data), p+m)
		if i := bytes.Index(data[lo:hi], f.pat); i >= 0 {
			return lo + i
		}
	}
	return -1
}

// pairSet returns the set of the byte pairs of f.pat, made (or remade, for another pattern) on
// first use.
func (f *finder) pairSet() *pairSet {
	if f.pairs != nil && bytes.Equal(f.pairsFor, f.pat) {
		return f.pairs
	}
	if f.pairs == nil {
		f.pairs = new(pairSet)
	} else {
		for i := 0; i+1 < len(f.pairsFor); i++ { // only the words the last pattern set
			v := uint(f.pairsFor[i])<<8 | uint(f.pairsFor[i+1])
			f.pairs[v>>6] = 0
		}
	}
	for i := 0; i+1 < len(f.pat); i++ {
		v := uint(f.pat[i])<<8 | uint(f.pat[i+1])
		f.pairs[v>>6] |= 1 << (v & 63)
	}
	f.pairsFor = f.pat
	return f.pairs
}

// Write passes p on with the secret masked. It reports len(p) written unless w failed.
func (r *redactor) Write(p []byte) (int, error) {
	if len(r.secret) == 0 {
		return r.w.Write(p)
	}
	data := p
	if len(r.held) > 0 {
		r.work = append(append(r.work[:0], r.held...), p...)
		data = r.work
		r.held = r.held[:0]
	}
	if err := r.pass(data); err != nil {
		return 0, err
	}
	return len(p), nil
}

// pass writes data on, masking complete occurrences and keeping back the tail that may start
// one.
func (r *redactor) pass(data []byte) error {
	pos := 0
	for {
		i := r.find.index(data[pos:])
		if i < 0 {
			break
		}
		i += pos
		if err := r.out(data[pos:i]); err != nil {
			return err
		}
		if len(r.mask) == 0 {
			c, ok := maskByte(r.secret)
			if !ok {
				return errUnredactable
			}
			r.mask = bytes.Repeat([]byte{c}, len(r.secret))
		}
		if err := r.out(r.mask); err != nil {
			return err
		}
		pos = i + len(r.secret)
	}
	h := holdFrom(data, pos, r.secret)
	if err := r.out(data[pos:h]); err != nil {
		return err
	}
	r.held = append(r.held, data[h:]...)
	return nil
}

func (r *redactor) out(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := r.w.Write(b)
	return err
}

// flush passes on what was held back: the stream has ended, so it is no occurrence.
func (r *redactor) flush() error {
	if len(r.held) == 0 {
		return nil
	}
	err := r.out(r.held)
	r.held = r.held[:0]
	return err
}

// holdFrom returns the start of the longest tail of data[from:] that is a proper prefix of
// secret (len(data) when there is none): the bytes that may begin an occurrence completed by
// the next write.
func holdFrom(data []byte, from int, secret []byte) int {
	start := max(from, len(data)-len(secret)+1)
	first := secret[0]
	for i := start; i < len(data); i++ {
		j := bytes.IndexByte(data[i:], first)
		if j < 0 {
			break
		}
		i += j
		if bytes.HasPrefix(secret, data[i:]) {
			return i
		}
	}
	return len(data)
}

// maskByte picks the byte that replaces the secret's: '*' when the secret has none (every
// real token), else the first byte value it lacks.
func maskByte(secret []byte) (byte, bool) {
	if bytes.IndexByte(secret, '*') < 0 {
		return '*', true
	}
	var seen [256]bool
	for i := 0; i < len(secret); i++ {
		seen[secret[i]] = true
	}
	for c := 0; c < 256; c++ {
		if !seen[c] {
			return byte(c), true
		}
	}
	return 0, false
}

// redactString masks every occurrence of secret in s as a redactor would.
func redactString(s, secret string) string {
	if secret == "" || !strings.Contains(s, secret) {
		return s
	}
	c, ok := maskByte([]byte(secret))
	if !ok {
		return ""
	}
	return strings.ReplaceAll(s, secret, strings.Repeat(string(c), len(secret)))
}

// redactHeader masks the secret in every header value of h (a header named by it is dropped).
// Values are replaced, never written to: they may be shared with the upstream's answer.
func redactHeader(h http.Header, secret string) {
	if secret == "" {
		return
	}
	for name, vals := range h {
		if strings.Contains(name, secret) {
			delete(h, name)
			continue
		}
		for _, v := range vals {
			if strings.Contains(v, secret) {
				out := make([]string, len(vals))
				for j, v := range vals {
					out[j] = redactString(v, secret)
				}
				h[name] = out
				break
			}
		}
	}
}
