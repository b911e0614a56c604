// Package canonjson produces a canonical byte form of a JSON document for fingerprinting.
//
// The same event is often delivered more than once, and not always as the same bytes: a
// retry may come from another producer, another library version or a proxy that re-encodes
// the payload, reordering object keys, changing whitespace or escaping characters differently
// ("\u0041" instead of "A", "\/" instead of "/"). A fingerprint over the raw bytes would then
// report key reuse for what is really a duplicate. Canonicalize removes those accidental
// differences while keeping every difference that can carry meaning, and rejects documents
// whose meaning is ambiguous rather than fingerprinting them.
//
// # Canonical form
//
// Object members are sorted by the byte order of their UTF-8 names (which is code point
// order) and arrays keep their order. There is no insignificant whitespace. Numbers are kept
// exactly as written: 1, 1.0 and 1e0 stay different, and big or long numbers are never
// rounded. Strings are decoded and re-encoded one fixed way: \" and \\, \b \f \n \r \t for
// those control characters, \u00xx (lower-case hex) for the other characters below U+0020,
// and every other character as raw UTF-8 (no escaping of <, >, &, U+2028 or U+2029).
//
// Duplicate member names, invalid UTF-8 and lone UTF-16 surrogate escapes are errors, as are
// nesting deeper than Options.MaxDepth and anything after the value but whitespace.
//
// # Selecting fields
//
// Options.Include and Options.Exclude take dotted paths of member names ("order.id"); a path
// cannot address a name that itself contains a dot. Where a path meets an array, it continues
// into every element (at any level of nesting), so "items.sku" addresses "sku" in every object
// of the array "items".
//
// With Include, the result holds only the values found at the included paths plus the objects
// and arrays needed to hold them, so that it depends on nothing else: a path that does not
// exist contributes nothing, an object or array that ends up holding nothing is left out, and
// inside an array an element that holds nothing becomes null so that later elements keep
// their positions (trailing ones are dropped). If nothing at all is selected the result is {}
// for an object document, [] for an array and null for a scalar.
//
// Exclude removes the members at its paths wherever they occur; the objects that held them
// stay, even if empty. With both, Include selects first and Exclude then removes from the
// selection: below a path that Include keeps whole, emptied objects stay as with Exclude
// alone, while on a path that Include follows deeper, whatever is left holding nothing is left
// out as described above.
//
// Excluded and unselected parts are still checked, so (paths being valid) a document is
// accepted or rejected alike whatever the options.
package canonjson

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// DefaultMaxDepth is the nesting limit used when Options.MaxDepth is zero or negative.
const DefaultMaxDepth = 64

// maxDepthLimit caps Options.MaxDepth so that the recursive parser can never exhaust the stack.
const maxDepthLimit = 10000

// ErrInvalid is returned (wrapped, with the offset and path) for input that is not a single
// valid JSON value, including invalid UTF-8 and lone UTF-16 surrogate escapes inside strings.
var ErrInvalid = errors.New("canonjson: invalid JSON")

// ErrTooDeep is returned (wrapped, with the offset and path) when objects and arrays are
// nested more deeply than Options.MaxDepth.
var ErrTooDeep = errors.New("canonjson: nesting too deep")

// ErrDuplicateKey is returned (wrapped, with the key, offset and path) when one object holds
// the same member name twice, which makes the document ambiguous.
var ErrDuplicateKey = errors.New("canonjson: duplicate key")

// ErrInvalidPath is returned (wrapped, naming the path) when Options.Include or Options.Exclude
// holds a malformed path, such as an empty one or one with an empty segment ("a..b").
var ErrInvalidPath = errors.New("canonjson: invalid path")

// Options selects which parts of a document take part in the canonical form; the zero value
// keeps the whole document (see "Selecting fields" in the package documentation).
type Options struct {
	// Include, when non-empty, keeps only these dotted paths ("order.id", "amount").
	Include []string
	// Exclude removes these dotted paths (volatile fields: "meta.delivered_at", "trace").
	Exclude []string
	// MaxDepth limits the nesting of objects and arrays; zero or negative means
	// DefaultMaxDepth and values above 10000 are treated as 10000.
	MaxDepth int
}

// Canonicalize returns the canonical form of one JSON document, restricted as opts says, in a
// new slice; errors wrap ErrInvalid, ErrTooDeep, ErrDuplicateKey or ErrInvalidPath.
func Canonicalize(data []byte, opts Options) ([]byte, error) {
	p := parserPool.Get().(*parser)
	defer p.release()
	if err := p.reset(data, opts); err != nil {
		return nil, err
	}
	p.skipWS()
	if p.pos >= len(p.data) {
		return nil, p.errorf(ErrInvalid, p.pos, "empty input")
	}
	if _, err := p.value(0, p.incRoot, p.excRoot, true); err != nil {
		return nil, err
	}
	p.skipWS()
	if p.pos < len(p.data) {
		return nil, p.errorf(ErrInvalid, p.pos, "unexpected data after the JSON value")
	}
	if len(p.tape) == 0 {
		// Only a scalar document under Include leaves nothing on the tape.
		return []byte("null"), nil
	}
	out := p.write(make([]byte, 0, len(data)), 0)
	return out, nil
}

// noNode marks the absence of a path node: no Include restriction, or nothing to Exclude.
const noNode = -1

// pathNode is one segment of the Include or Exclude path tree, stored in parser.nodes and
// linked by index to keep building the tree free of allocations.
type pathNode struct {
	name        string
	first, next int32 // first child, next sibling; noNode when absent
	terminal    bool  // a path ends here: the whole value below is addressed
}

// A document is parsed into a tape of value nodes in document order (each node followed by
// the nodes of its children), and the output is written from the tape in one final pass.
// Sorting object members therefore only permutes indices, never bytes, which keeps the work
// linear in the size of the input whatever the nesting.
const (
	kindRaw    uint8 = iota // scalar copied from parser.data[start:end]
	kindText                // string re-encoded into parser.text[start:end]
	kindNull                // placeholder for an array element that holds nothing
	kindArray               // start elements follow on the tape
	kindObject              // members are the tape nodes listed in parser.order[start:end]
)

type tapeNode struct {
	kind             uint8
	keyInText        bool // the encoded member name is in parser.text, else in parser.data
	keyStart, keyEnd int  // encoded member name including its quotes, for object members
	start, end       int  // meaning depends on kind
	size             int  // number of tape nodes in this subtree, this one included
}

// tapeMark records the lengths of the output buffers so that a value that holds nothing can
// be taken back.
type tapeMark struct{ tape, text, order int }

// member is one object member while its object is being parsed.
type member struct {
	keyStart, keyEnd int  // decoded name, in parser.data when raw, else in parser.keys
	raw              bool // the name has no escapes
	srcOff           int  // offset of the name in the input, for errors
	node             int  // tape index of the value, or -1 when the member is not written
}

// pathElem is one step of the current position, kept for error messages.
type pathElem struct {
	start, end int // member name as in member, or the array index in end when index is set
	raw, index bool
}

type parser struct {
	data     []byte
	pos      int
	maxDepth int

	nodes            []pathNode
	incRoot, excRoot int32

	tape  []tapeNode
	text  []byte // re-encoded strings and member names
	order []int  // tape indices of object members in sorted order

	keys    []byte // decoded escaped names of the members of all open objects
	members []member
	path    []pathElem
	str     []byte // decoding strings that contain escapes
}

var parserPool = sync.Pool{New: func() any { return new(parser) }}

// maxPooledBuf keeps an unusually large document from pinning its buffers in the pool.
const maxPooledBuf = 64 << 10

func (p *parser) release() {
	p.data = nil
	for i := range p.nodes {
		p.nodes[i].name = ""
	}
	if cap(p.tape) > maxPooledBuf/32 || cap(p.text) > maxPooledBuf || cap(p.order) > maxPooledBuf/8 ||
		cap(p.keys) > maxPooledBuf || cap(p.members) > maxPooledBuf/32 || cap(p.path) > maxPooledBuf/32 ||
		cap(p.str) > maxPooledBuf || cap(p.nodes) > maxPooledBuf/32 {
		return
	}
	parserPool.Put(p)
}

func (p *parser) reset(data []byte, opts Options) error {
	p.data, p.pos = data, 0
	p.maxDepth = opts.MaxDepth
	if p.maxDepth <= 0 {
		p.maxDepth = DefaultMaxDepth
	} else if p.maxDepth > maxDepthLimit {
		p.maxDepth = maxDepthLimit
	}
	p.tape, p.text, p.order = p.tape[:0], p.text[:0], p.order[:0]
	p.keys, p.members, p.path = p.keys[:0], p.members[:0], p.path[:0]
	p.nodes = p.nodes[:0]
	p.incRoot, p.excRoot = noNode, noNode
	var err error
	if len(opts.Include) > 0 {
		if p.incRoot, err = p.buildTree("include", opts.Include); err != nil {
			return err
		}
	}
	if len(opts.Exclude) > 0 {
		if p.excRoot, err = p.buildTree("exclude", opts.Exclude); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) newNode(name string) int32 {
	p.nodes = append(p.nodes, pathNode{name: name, first: noNode, next: noNode})
	return int32(len(p.nodes) - 1)
}

func (p *parser) buildTree(kind string, paths []string) (int32, error) {
	root := p.newNode("")
	for _, path := range paths {
		if path == "" || path[0] == '.' || path[len(path)-1] == '.' || strings.Contains(path, "..") {
			return noNode, fmt.Errorf("%w: %s path %q: empty segment", ErrInvalidPath, kind, path)
		}
		n := root
		for rest := path; ; {
			seg, tail, more := strings.Cut(rest, ".")
			c := p.child(n, seg)
			if c == noNode {
				c = p.newNode(seg)
				p.nodes[c].next = p.nodes[n].first
				p.nodes[n].first = c
			}
			n = c
			if !more {
				break
			}
			rest = tail
		}
		p.nodes[n].terminal = true
	}
	return root, nil
}

// child returns the child of node n named name, or noNode.
func (p *parser) child(n int32, name string) int32 {
	for c := p.nodes[n].first; c != noNode; c = p.nodes[c].next {
		if p.nodes[c].name == name {
			return c
		}
	}
	return noNode
}

// childBytes is child for a name held as bytes; the conversion in the comparison does not
// allocate.
func (p *parser) childBytes(n int32, name []byte) int32 {
	for c := p.nodes[n].first; c != noNode; c = p.nodes[c].next {
		if p.nodes[c].name == string(name) {
			return c
		}
	}
	return noNode
}

func (p *parser) skipWS() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) mark() tapeMark { return tapeMark{len(p.tape), len(p.text), len(p.order)} }

func (p *parser) truncate(m tapeMark) {
	p.tape, p.text, p.order = p.tape[:m.tape], p.text[:m.text], p.order[:m.order]
}

// value parses the value at p.pos. inc is the Include node that applies here (noNode: keep
// everything) and exc the Exclude node (noNode: remove nothing). With emit false the value is
// only validated; otherwise it is added to the tape. It reports whether the value holds
// anything selected by Include; the caller takes back a value that holds nothing.
func (p *parser) value(depth int, inc, exc int32, emit bool) (bool, error) {
	if p.pos >= len(p.data) {
		return false, p.errorf(ErrInvalid, p.pos, "unexpected end of input")
	}
	start := p.pos
	switch c := p.data[p.pos]; c {
	case '{':
		return p.object(depth+1, inc, exc, emit)
	case '[':
		return p.array(depth+1, inc, exc, emit)
	case '"':
		end, esc, err := p.scanString(p.pos)
		if err != nil {
			return false, err
		}
		p.pos = end
		if emit && inc == noNode && esc {
			p.str = decodeString(p.str[:0], p.data[start:end])
			textStart := len(p.text)
			p.text = appendString(p.text, p.str)
			p.tape = append(p.tape, tapeNode{kind: kindText, start: textStart, end: len(p.text), size: 1})
			return true, nil
		}
	case 't', 'f', 'n':
		lit := "null"
		if c == 't' {
			lit = "true"
		} else if c == 'f' {
			lit = "false"
		}
		if len(p.data)-p.pos < len(lit) || string(p.data[p.pos:p.pos+len(lit)]) != lit {
			return false, p.errorf(ErrInvalid, p.pos, "invalid literal")
		}
		p.pos += len(lit)
	default:
		if c != '-' && (c < '0' || c > '9') {
			return false, p.errorf(ErrInvalid, p.pos, "unexpected character %q", c)
		}
		i := skipNumber(p.data, p.pos)
		if i < 0 {
			return false, p.errorf(ErrInvalid, p.pos, "invalid number")
		}
		p.pos = i
	}
	if emit && inc == noNode {
		p.tape = append(p.tape, tapeNode{kind: kindRaw, start: start, end: p.pos, size: 1})
	}
	return inc == noNode, nil
}

func (p *parser) array(depth int, inc, exc int32, emit bool) (bool, error) {
	if depth > p.maxDepth {
		return false, p.errorf(ErrTooDeep, p.pos, "more than %d nested objects and arrays", p.maxDepth)
	}
	p.pos++
	idx := len(p.tape)
	if emit {
		p.tape = append(p.tape, tapeNode{kind: kindArray})
	}
	present := inc == noNode
	count := 0
	last, lastCount := p.mark(), 0 // after the last element that holds something
	p.path = append(p.path, pathElem{index: true})
	level := len(p.path) - 1
	p.skipWS()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
	} else {
		for {
			p.path[level].end = count
			m := p.mark()
			held, err := p.value(depth, inc, exc, emit)
			if err != nil {
				return false, err
			}
			count++
			if held {
				present = true
				last, lastCount = p.mark(), count
			} else if emit {
				p.truncate(m)
				p.tape = append(p.tape, tapeNode{kind: kindNull, size: 1})
			}
			p.skipWS()
			if p.pos >= len(p.data) {
				return false, p.errorf(ErrInvalid, p.pos, "unexpected end of input in array")
			}
			if c := p.data[p.pos]; c == ']' {
				p.pos++
				break
			} else if c != ',' {
				return false, p.errorf(ErrInvalid, p.pos, "expected ',' or ']' after array element, found %q", c)
			}
			p.pos++
			p.skipWS()
		}
	}
	p.path = p.path[:level]
	if emit {
		// Elements after the last one that holds something are dropped (a no-op without
		// Include, where every element holds something).
		p.truncate(last)
		p.tape[idx].start = lastCount
		p.tape[idx].size = len(p.tape) - idx
	}
	return present, nil
}

// key returns the decoded name of m.
func (p *parser) key(m *member) []byte {
	if m.raw {
		return p.data[m.keyStart:m.keyEnd]
	}
	return p.keys[m.keyStart:m.keyEnd]
}

func (p *parser) object(depth int, inc, exc int32, emit bool) (bool, error) {
	if depth > p.maxDepth {
		return false, p.errorf(ErrTooDeep, p.pos, "more than %d nested objects and arrays", p.maxDepth)
	}
	p.pos++
	idx := len(p.tape)
	if emit {
		p.tape = append(p.tape, tapeNode{kind: kindObject})
	}
	base, keyBase := len(p.members), len(p.keys)
	present := inc == noNode
	sorted := true
	p.path = append(p.path, pathElem{})
	level := len(p.path) - 1
	p.skipWS()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
	} else {
		for {
			if p.pos >= len(p.data) {
				return false, p.errorf(ErrInvalid, p.pos, "unexpected end of input in object")
			}
			if c := p.data[p.pos]; c != '"' {
				return false, p.errorf(ErrInvalid, p.pos, "expected a string for a member name, found %q", c)
			}
			srcOff := p.pos
			end, esc, err := p.scanString(p.pos)
			if err != nil {
				return false, err
			}
			m := member{keyStart: srcOff + 1, keyEnd: end - 1, raw: !esc, srcOff: srcOff, node: -1}
			if esc {
				m.keyStart = len(p.keys)
				p.keys = decodeString(p.keys, p.data[srcOff:end])
				m.keyEnd = len(p.keys)
			}
			key := p.key(&m)
			p.pos = end
			p.path[level] = pathElem{start: m.keyStart, end: m.keyEnd, raw: m.raw}
			if sorted && len(p.members) > base {
				sorted = bytes.Compare(p.key(&p.members[len(p.members)-1]), key) < 0
			}
			p.skipWS()
			if p.pos >= len(p.data) || p.data[p.pos] != ':' {
				return false, p.errorf(ErrInvalid, p.pos, "expected ':' after member name")
			}
			p.pos++
			p.skipWS()

			keep := emit
			cinc, cexc := int32(noNode), int32(noNode)
			if inc != noNode {
				if c := p.childBytes(inc, key); c == noNode {
					keep = false
				} else if !p.nodes[c].terminal {
					cinc = c
				}
			}
			if exc != noNode {
				if c := p.childBytes(exc, key); c != noNode {
					if p.nodes[c].terminal {
						keep = false
					} else {
						cexc = c
					}
				}
			}
			if !keep {
				if _, err := p.value(depth, noNode, noNode, false); err != nil {
					return false, err
				}
			} else {
				mk := p.mark()
				held, err := p.value(depth, cinc, cexc, true)
				if err != nil {
					return false, err
				}
				if held {
					present = true
					m.node = mk.tape
					n := &p.tape[m.node]
					if esc {
						n.keyInText, n.keyStart = true, len(p.text)
						p.text = appendString(p.text, p.keys[m.keyStart:m.keyEnd])
						n.keyEnd = len(p.text)
					} else {
						n.keyStart, n.keyEnd = srcOff, end
					}
				} else {
					p.truncate(mk)
				}
			}
			p.members = append(p.members, m)

			p.skipWS()
			if p.pos >= len(p.data) {
				return false, p.errorf(ErrInvalid, p.pos, "unexpected end of input in object")
			}
			if c := p.data[p.pos]; c == '}' {
				p.pos++
				break
			} else if c != ',' {
				return false, p.errorf(ErrInvalid, p.pos, "expected ',' or '}' after object member, found %q", c)
			}
			p.pos++
			p.skipWS()
		}
	}
	p.path = p.path[:level]
	ms := p.members[base:]
	if !sorted {
		p.sortMembers(ms)
		for i := 1; i < len(ms); i++ {
			if bytes.Equal(p.key(&ms[i-1]), p.key(&ms[i])) {
				return false, p.errorf(ErrDuplicateKey, max(ms[i-1].srcOff, ms[i].srcOff), "%q", p.key(&ms[i]))
			}
		}
	}
	if emit {
		n := &p.tape[idx]
		n.start = len(p.order)
		for i := range ms {
			if ms[i].node >= 0 {
				p.order = append(p.order, ms[i].node)
			}
		}
		n.end = len(p.order)
		n.size = len(p.tape) - idx
	}
	p.members = p.members[:base]
	p.keys = p.keys[:keyBase]
	return present, nil
}

// sortMembers sorts ms by name. Typical objects are small and an insertion sort over them is
// several times faster than the generic sort; large ones keep the O(n log n) bound.
func (p *parser) sortMembers(ms []member) {
	if len(ms) > 12 {
		slices.SortFunc(ms, func(a, b member) int { return bytes.Compare(p.key(&a), p.key(&b)) })
		return
	}
	for i := 1; i < len(ms); i++ {
		m := ms[i]
		key := p.key(&m)
		j := i
		for ; j > 0 && bytes.Compare(p.key(&ms[j-1]), key) > 0; j-- {
			ms[j] = ms[j-1]
		}
		ms[j] = m
	}
}

// write appends the canonical form of tape node i to out.
func (p *parser) write(out []byte, i int) []byte {
	n := &p.tape[i]
	switch n.kind {
	case kindRaw:
		return append(out, p.data[n.start:n.end]...)
	case kindText:
		return append(out, p.text[n.start:n.end]...)
	case kindNull:
		return append(out, "null"...)
	case kindArray:
		out = append(out, '[')
		c := i + 1
		for k := 0; k < n.start; k++ {
			if k > 0 {
				out = append(out, ',')
			}
			out = p.write(out, c)
			c += p.tape[c].size
		}
		return append(out, ']')
	default: // kindObject
		out = append(out, '{')
		for k, c := range p.order[n.start:n.end] {
			if k > 0 {
				out = append(out, ',')
			}
			m := &p.tape[c]
			if m.keyInText {
				out = append(out, p.text[m.keyStart:m.keyEnd]...)
			} else {
				out = append(out, p.data[m.keyStart:m.keyEnd]...)
			}
			out = append(out, ':')
			out = p.write(out, c)
		}
		return append(out, '}')
	}
}

// scanString validates the string starting with the quote at data[i] and returns the offset
// just past its closing quote and whether it contains escapes.
func (p *parser) scanString(i int) (end int, esc bool, err error) {
	d := p.data
	start := i
	i++
	for {
		if i >= len(d) {
			return 0, false, p.errorf(ErrInvalid, start, "unterminated string")
		}
		c := d[i]
		switch {
		case c == '"':
			return i + 1, esc, nil
		case c == '\\':
			esc = true
			if i+1 >= len(d) {
				return 0, false, p.errorf(ErrInvalid, start, "unterminated string")
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				r, ok := hex4(d, i+2)
				if !ok {
					return 0, false, p.errorf(ErrInvalid, i, "invalid \\u escape")
				}
				i += 6
				if utf16.IsSurrogate(r) {
					if r < 0xDC00 && i+1 < len(d) && d[i] == '\\' && d[i+1] == 'u' {
						if r2, ok := hex4(d, i+2); ok && r2 >= 0xDC00 && r2 <= 0xDFFF {
							i += 6
							continue
						}
					}
					return 0, false, p.errorf(ErrInvalid, i-6, "lone UTF-16 surrogate escape")
				}
			default:
				return 0, false, p.errorf(ErrInvalid, i, "invalid escape")
			}
		case c < 0x20:
			return 0, false, p.errorf(ErrInvalid, i, "control character in string")
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && size == 1 {
				return 0, false, p.errorf(ErrInvalid, i, "invalid UTF-8 in string")
			}
			i += size
		}
	}
}

// hex4 decodes the four hex digits at d[i:i+4].
func hex4(d []byte, i int) (rune, bool) {
	if i+4 > len(d) {
		return 0, false
	}
	var r rune
	for _, c := range d[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// decodeString appends the decoded content of the quoted string s, already validated by
// scanString, to dst.
func decodeString(dst, s []byte) []byte {
	s = s[1 : len(s)-1]
	for len(s) > 0 {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i]...)
		switch e := s[i+1]; e {
		case 'u':
			r, _ := hex4(s, i+2)
			s = s[i+6:]
			if utf16.IsSurrogate(r) {
				r2, _ := hex4(s, 2)
				r = utf16.DecodeRune(r, r2)
				s = s[6:]
			}
			dst = utf8.AppendRune(dst, r)
			continue
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		default: // '"', '\\', '/'
			dst = append(dst, e)
		}
		s = s[i+2:]
	}
	return dst
}

// appendString appends s, valid UTF-8, as a JSON string with only the mandatory escapes.
func appendString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i, c := range s {
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

func (p *parser) errorf(kind error, off int, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if path := p.pathString(); path != "" {
		return fmt.Errorf("%w: %s at offset %d (path %s)", kind, msg, off, path)
	}
	return fmt.Errorf("%w: %s at offset %d", kind, msg, off)
}

// pathString formats the current position as "order.items[2].sku".
func (p *parser) pathString() string {
	var b strings.Builder
	for _, e := range p.path {
		if e.index {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(e.end))
			b.WriteByte(']')
			continue
		}
		m := member{keyStart: e.start, keyEnd: e.end, raw: e.raw}
		name := string(p.key(&m))
		if q := strconv.Quote(name); name == "" || strings.ContainsAny(name, ".[]") || q[1:len(q)-1] != name {
			b.WriteByte('[')
			b.WriteString(q)
			b.WriteByte(']')
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(name)
	}
	return b.String()
}
