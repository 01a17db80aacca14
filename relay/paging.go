package relay

import (
	"encoding/json"
	"io"
)

// Caps of what a [pagingRewriter] holds.
const (
	// maxPagingLink caps a paging link held for its rewrite (its raw JSON string, quotes
	// included). A longer one passes on as the upstream wrote it — its token still masked by the
	// redactor after the rewriter — but not rewritten: the upstream's links are a few hundred
	// bytes, and holding one of any length would make the memory of a streamed answer unbounded.
	maxPagingLink = 64 << 10
	// maxPagingKey caps a member name held to be compared: "previous" written with a \uXXXX
	// escape for every letter is 50 bytes, so a longer raw name is none of those looked for.
	maxPagingKey = 64
)

// pagingLink returns what replaces the raw JSON string value raw (quotes included) of a
// paging.next or paging.previous member: its [ProxyLink] under proxyBase, as a JSON string.
// ok is false when it is no link to rewrite (not a string that decodes, or an empty one). It is
// the one rewrite of a link, for buffered answers ([rewritePaging]) and streamed ones
// ([pagingRewriter]) alike.
func pagingLink(raw []byte, proxyBase string) (repl []byte, ok bool) {
	var link string
	if json.Unmarshal(raw, &link) != nil || link == "" {
		return nil, false
	}
	return jsonString(ProxyLink(link, proxyBase)), true
}

// pagingRewriter rewrites, as they stream, the paging links of a JSON answer too large to be
// buffered: the string values of the top-level paging object's next and previous members become
// their [pagingLink]s, and every other byte passes on to w unchanged, in place. For a valid JSON
// body its output is [rewritePaging]'s, however the body is split into writes (the first
// top-level "paging" member only, its direct next/previous members only; "paging" inside a
// string or a nested object is left alone).
//
// Memory is bounded: it is a small tokenizer (nesting depth, inside a string or not, after an
// escape or not) that holds only a member name at the levels that matter (up to maxPagingKey
// bytes) and the link being rewritten (up to maxPagingLink bytes; a longer link passes on
// unrewritten). Everything else passes on at once, and once the paging object has ended (or the
// body turns out not to be an object) the rest passes straight through. The body is not
// validated — that would need all of it — so an invalid body may have links rewritten that
// [RewriteLinks] would leave (it rewrites only valid JSON); its bytes are the upstream's anyway.
type pagingRewriter struct {
	w    io.Writer
	base string // {proxy_url}

	done       bool // nothing left to rewrite: the rest passes straight through
	depth      int  // of the containers open
	inStr, esc bool // inside a string; after its backslash
	role       strRole
	expectKey  bool // at a level whose names matter, a string now is a member name
	awaitValue bool // after such a member's ':': the next byte but space starts its value
	member     memberKind
	inPaging   bool   // the open container at depth 2 is the top-level paging object
	key        []byte // the raw name being read (role keyName), up to maxPagingKey bytes
	keyLong    bool   // it was longer: no name looked for
	held       []byte // the raw link being read (role link), not yet passed on
}

// strRole is what the string being read is to a [pagingRewriter].
type strRole uint8

const (
	plainString strRole = iota // passes on
	keyName                    // a member name at a level that matters: passes on, and is kept to compare
	heldLink                   // a paging link: held until its end, then replaced
)

// memberKind is the name of the member whose value comes next.
type memberKind uint8

const (
	otherMember  memberKind = iota
	pagingMember            // "paging", at the top level
	linkMember              // "next" or "previous", in the paging object
)

// reset makes p a rewriter onto w of links to proxyBase, keeping its buffers.
func (p *pagingRewriter) reset(w io.Writer, proxyBase string) {
	*p = pagingRewriter{w: w, base: proxyBase, key: p.key[:0], held: p.held[:0]}
}

// ws reports JSON white space.
func ws(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// Write passes b on with the paging links rewritten. It reports len(b) written unless w failed.
func (p *pagingRewriter) Write(b []byte) (int, error) {
	if p.done {
		return p.w.Write(b)
	}
	from := 0 // b[from:i] is to pass on; -1 while a link is held
	if p.role == heldLink {
		from = -1
	}
	i := 0
	for i < len(b) && !p.done {
		if p.inStr {
			j := i
			if p.esc { // the escaped byte, whatever it is
				j++
				p.esc = false
			}
			for j < len(b) && b[j] != '"' && b[j] != '\\' {
				j++
			}
			end := j < len(b) && b[j] == '"'
			if j < len(b) {
				if b[j] == '\\' {
					p.esc = true
				}
				j++
			}
			switch p.role {
			case keyName:
				if len(p.key)+j-i > maxPagingKey {
					p.keyLong = true
				} else {
					p.key = append(p.key, b[i:j]...)
				}
			case heldLink:
				if len(p.held)+j-i > maxPagingLink {
					// Too long to hold: it passes on as it is (see maxPagingLink).
					if err := p.out(p.held); err != nil {
						return 0, err
					}
					p.held, p.role, from = p.held[:0], plainString, i
				} else {
					p.held = append(p.held, b[i:j]...)
				}
			}
			i = j
			if end {
				p.inStr = false
				if err := p.endString(); err != nil {
					return 0, err
				}
				if p.role == heldLink {
					p.role, from = plainString, i // the link's replacement went on
					p.held = p.held[:0]
				}
			}
			continue
		}
		c := b[i]
		if ws(c) {
			i++
			continue
		}
		if p.awaitValue { // c starts the value of the member named last
			p.awaitValue = false
			switch {
			case p.member == pagingMember && c != '{':
				p.done = true // the paging member is no object: no link anywhere
			case p.member == linkMember && c == '"':
				if err := p.out(b[from:i]); err != nil {
					return 0, err
				}
				p.held, p.role, p.inStr, from = append(p.held[:0], c), heldLink, true, -1
				i++
				continue
			}
		}
		names := p.depth == 1 || p.depth == 2 && p.inPaging // a level whose member names matter
		switch c {
		case '"':
			p.inStr, p.role = true, plainString
			if names && p.expectKey {
				p.role, p.key, p.keyLong = keyName, append(p.key[:0], c), false
			}
		case '{', '[':
			p.depth++
			switch {
			case p.depth == 1:
				p.expectKey = c == '{'
				p.done = c != '{' // a top-level array, say: no paging object
			case p.depth == 2 && p.member == pagingMember:
				p.inPaging, p.expectKey = true, true
			}
		case '}', ']':
			p.depth--
			// The paging object, or the top-level value, has ended: only the first paging
			// member is rewritten.
			p.done = p.depth == 0 || p.inPaging && p.depth == 1
		case ':':
			if names {
				p.expectKey, p.awaitValue = false, true
			}
		case ',':
			if names {
				p.expectKey, p.member = true, otherMember
			}
		default:
			if p.depth == 0 {
				p.done = true // a top-level scalar
			}
		}
		i++
	}
	if from >= 0 {
		if err := p.out(b[from:]); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

// endString acts on the end of a member name (which member's value comes next) or of a held
// link (its replacement, or the link itself, passes on).
func (p *pagingRewriter) endString() error {
	switch p.role {
	case keyName:
		p.member = otherMember
		switch {
		case p.keyLong:
		case p.depth == 1 && keyIs(p.key, "paging"):
			p.member = pagingMember
		case p.depth == 2 && p.inPaging && (keyIs(p.key, "next") || keyIs(p.key, "previous")):
			p.member = linkMember
		}
	case heldLink:
		if repl, ok := pagingLink(p.held, p.base); ok {
			return p.out(repl)
		}
		return p.out(p.held)
	}
	return nil
}

// flush passes on a link still held: the body ended inside it (it was no valid JSON).
func (p *pagingRewriter) flush() error {
	if p.role != heldLink || len(p.held) == 0 {
		return nil
	}
	err := p.out(p.held)
	p.held, p.role = p.held[:0], plainString
	return err
}

func (p *pagingRewriter) out(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := p.w.Write(b)
	return err
}
