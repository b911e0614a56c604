// Package idemredact masks secrets in everything idem shows or stores: dead-letter errors and
// payloads, CLI output, logs and connection URLs. It depends on the standard library only, so
// every idem package (and a user's own code) can use it.
package idemredact

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Masked replaces every secret value a Redactor finds. It is one fixed string so that operators
// can tell a masked value from an empty one and tests can match it.
const Masked = "[REDACTED]"

// MaxErrorLenDefault is the bound, in runes, on a redacted error summary when
// Config.MaxErrorLen is not set; it keeps dead letters and log lines readable.
const MaxErrorLenDefault = 1024

// truncatedMarker is appended to a summary that Text cut to its maximum length.
const truncatedMarker = "…(truncated)"

// defaultSecretNames are masked by default. They are matched case-insensitively against header
// names, JSON field names and the names in key=value text, after normalising '-' and '_' away
// (so "X-Api-Key", "api_key" and "apiKey" all match "apikey").
var defaultSecretNames = []string{"authorization", "cookie", "set-cookie", "password", "passwd",
	"secret", "token", "api_key", "apikey", "access_token", "refresh_token", "client_secret",
	"card_number", "cvv", "private_key"}

// SecretNamesDefault returns a copy of the names masked when Config.Names is nil, so that a
// caller can extend or trim the list without touching the defaults.
func SecretNamesDefault() []string { return append([]string(nil), defaultSecretNames...) }

// authSchemes are the HTTP authentication schemes kept in front of a masked credential
// ("Authorization: Bearer [REDACTED]"), so the operator still sees which kind of credential it was.
var authSchemes = []string{"bearer", "basic", "digest", "negotiate", "ntlm", "token", "apikey", "dpop"}

// Config configures a Redactor. The zero value masks the default secret names and bounds
// error summaries to MaxErrorLenDefault runes.
type Config struct {
	// Names replaces SecretNamesDefault when non-nil (an empty, non-nil slice masks no names;
	// URL passwords and bearer tokens are still masked).
	Names []string
	// Extra adds names to Names or to the defaults.
	Extra []string
	// MaxErrorLen bounds the summaries returned by Text, in runes; zero or less means
	// MaxErrorLenDefault.
	MaxErrorLen int
	// MaxJSONDepth bounds the nesting JSON pretty-prints (default DefaultMaxJSONDepth): a deeper
	// document is shown as masked text, on one line, so that its indentation cannot grow with
	// the square of its size.
	MaxJSONDepth int
	// MaxOutputBytes bounds what JSON returns (default DefaultMaxOutputBytes); a longer
	// rendering is cut and marked "… (truncated, payload of N bytes)".
	MaxOutputBytes int
}

// Bounds on what JSON renders: a hostile payload must cost no more to show than a real one.
const (
	// DefaultMaxJSONDepth is Config.MaxJSONDepth when unset.
	DefaultMaxJSONDepth = 64
	// DefaultMaxOutputBytes is Config.MaxOutputBytes when unset.
	DefaultMaxOutputBytes = 64 << 10
)

// Redactor masks secrets in everything that leaves the process: dead-letter error summaries and
// payloads, CLI output and logs. It is immutable and safe for concurrent use; a nil *Redactor and
// the zero Redactor behave like New(Config{}), so callers can hold a zero config.
type Redactor struct {
	names    []string // normalised secret names, none empty
	maxLen   int      // bound on Text output, in runes, before the truncation marker
	maxDepth int      // bound on JSON nesting
	maxOut   int      // bound on JSON output, in bytes, before the truncation marker
	built    bool     // set by New; the zero Redactor falls back to the defaults
}

// defaultRedactor serves nil and zero Redactors.
var defaultRedactor = New(Config{})

// New returns a Redactor for cfg. Names are normalised once here, so matching a name later
// costs a lower-casing and a few substring searches.
func New(cfg Config) *Redactor {
	r := &Redactor{maxLen: cfg.MaxErrorLen, maxDepth: cfg.MaxJSONDepth, maxOut: cfg.MaxOutputBytes, built: true}
	if r.maxLen <= 0 {
		r.maxLen = MaxErrorLenDefault
	}
	if r.maxDepth <= 0 {
		r.maxDepth = DefaultMaxJSONDepth
	}
	if r.maxOut <= 0 {
		r.maxOut = DefaultMaxOutputBytes
	}
	base := defaultSecretNames
	if cfg.Names != nil {
		base = cfg.Names
	}
	seen := make(map[string]bool)
	for _, list := range [][]string{base, cfg.Extra} {
		for _, name := range list {
			n := normalizeName(name)
			if n == "" || seen[n] {
				continue // an empty name would match everything
			}
			seen[n] = true
			r.names = append(r.names, n)
		}
	}
	return r
}

// get returns r, or the default Redactor when r is nil or was not built by New.
func (r *Redactor) get() *Redactor {
	if r == nil || !r.built {
		return defaultRedactor
	}
	return r
}

// normalizeName lower-cases name and drops '-' and '_', so that spelling variants of one name
// ("X-Api-Key", "x_api_key", "xApiKey") compare equal.
func normalizeName(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '-' || r == '_':
			return -1
		case 'A' <= r && r <= 'Z':
			return r + ('a' - 'A')
		case r < utf8.RuneSelf:
			return r
		}
		return unicode.ToLower(r)
	}, name)
}

// IsSecret reports whether values named name must be masked: its normalised form contains one of
// the secret names, so "db_password", "X-Auth-Token" and "stripeSecret" are secret too. Erring
// towards masking is deliberate: a masked harmless value costs less than a leaked credential.
func (r *Redactor) IsSecret(name string) bool {
	r = r.get()
	n := normalizeName(name)
	if n == "" {
		return false
	}
	for _, s := range r.names {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// Headers returns a copy of h in which the values of secret headers are replaced by Masked and
// secrets embedded in the other values (URL passwords, key=value pairs, bearer tokens) are masked;
// h itself is not modified. A nil map stays nil.
func (r *Redactor) Headers(h map[string]string) map[string]string {
	if h == nil {
		return nil
	}
	r = r.get()
	out := make(map[string]string, len(h))
	for k, v := range h {
		if r.IsSecret(k) {
			out[k] = Masked
		} else {
			out[k] = r.mask(v)
		}
	}
	return out
}

// JSON returns payload ready to show to an operator. A JSON document comes back pretty-printed
// with a 2-space indent, keys in their original order, numbers as written, the value of every
// secret field (at any depth, arrays included) replaced by the string Masked and secrets embedded
// in other string values masked as in Text. A document nested deeper than MaxJSONDepth, and
// anything that is not JSON, comes back as a copy with the secret patterns of Text masked, not
// re-encoded. Either way the result is at most MaxOutputBytes long plus a marker
// "… (truncated, payload of N bytes)" when it was cut.
func (r *Redactor) JSON(payload []byte) []byte {
	out, _ := r.Render(payload)
	return out
}

// Render is JSON, and reports whether out is the pretty-printed JSON document (complete, within
// the bounds) rather than masked text: only then may a caller embed it in a JSON output as a
// value, since an encoder re-indents what it embeds.
func (r *Redactor) Render(payload []byte) (out []byte, pretty bool) {
	r = r.get()
	if json.Valid(payload) {
		buf := &limitedBuffer{max: r.maxOut}
		buf.Grow(min(len(payload)+len(payload)/4, r.maxOut+1))
		dec := json.NewDecoder(bytes.NewReader(payload))
		dec.UseNumber()
		enc := json.NewEncoder(buf)
		enc.SetEscapeHTML(false)
		err := r.writeJSONValue(dec, enc, buf, 0)
		switch {
		case err == nil && !buf.full():
			return buf.Bytes(), true
		case err == nil || errors.Is(err, errOutputFull):
			return r.cut(buf.Bytes(), len(payload)), false
		}
		// Too deep: fall through to text masking, which does not indent.
	}
	if payload == nil {
		return nil, false
	}
	return r.cut([]byte(r.mask(string(payload))), len(payload)), false
}

// errOutputFull and errTooDeep stop writeJSONValue.
var (
	errOutputFull = errors.New("idemredact: output bound reached")
	errTooDeep    = errors.New("idemredact: nesting bound reached")
)

// limitedBuffer is a bytes.Buffer that refuses to grow much past max.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) full() bool { return b.Len() > b.max }

// cut bounds out to maxOut bytes at a rune boundary, marking the cut with the payload's size.
func (r *Redactor) cut(out []byte, payloadLen int) []byte {
	if len(out) <= r.maxOut {
		return out
	}
	n := r.maxOut
	for n > 0 && !utf8.RuneStart(out[n]) {
		n--
	}
	return append(out[:n:n], fmt.Sprintf("\n… (truncated, payload of %d bytes)", payloadLen)...)
}

// writeJSONValue copies the next value of dec to buf, pretty-printed at nesting depth, masking
// secret fields. Walking tokens rather than decoding into maps keeps key order and number text.
func (r *Redactor) writeJSONValue(dec *json.Decoder, enc *json.Encoder, buf *limitedBuffer, depth int) error {
	if buf.full() {
		return errOutputFull
	}
	if depth > r.maxDepth {
		return errTooDeep
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		end := json.Delim('}')
		if t == '[' {
			end = ']'
		}
		buf.WriteByte(byte(t))
		n := 0
		for dec.More() {
			if n > 0 {
				buf.WriteByte(',')
			}
			n++
			newlineIndent(buf, depth+1)
			if t == '[' {
				if err := r.writeJSONValue(dec, enc, buf, depth+1); err != nil {
					return err
				}
				continue
			}
			keyTok, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := keyTok.(string)
			if err := writeJSONString(enc, buf, key); err != nil {
				return err
			}
			buf.WriteString(": ")
			if r.IsSecret(key) {
				var skipped json.RawMessage
				if err := dec.Decode(&skipped); err != nil {
					return err
				}
				if err := writeJSONString(enc, buf, Masked); err != nil {
					return err
				}
				continue
			}
			if err := r.writeJSONValue(dec, enc, buf, depth+1); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return err
		}
		if n > 0 {
			newlineIndent(buf, depth)
		}
		buf.WriteByte(byte(end))
	case string:
		return writeJSONString(enc, buf, r.mask(t))
	case json.Number:
		buf.WriteString(t.String())
	case bool:
		if t {
			buf.WriteString("true")
		} else {
			buf.WriteString("false")
		}
	case nil:
		buf.WriteString("null")
	}
	return nil
}

// writeJSONString appends s to buf as a JSON string, without the newline the encoder adds.
func writeJSONString(enc *json.Encoder, buf *limitedBuffer, s string) error {
	if err := enc.Encode(s); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - 1)
	return nil
}

// newlineIndent starts a new line indented for depth.
func newlineIndent(buf *limitedBuffer, depth int) {
	buf.WriteByte('\n')
	for range depth {
		buf.WriteString("  ")
	}
}

// Text masks the secrets in free text such as an error message and bounds it for storage: values
// after a secret name and '=' or ':' ("password=hunter2", `"api_key":"xyz"`,
// "Authorization: Bearer eyJ..."), bearer tokens anywhere and URL passwords
// ("postgres://user:[REDACTED]@host/db"). A name alone ("tokenizer failed") is left as it is.
// Invalid UTF-8 is replaced by U+FFFD, and text longer than MaxErrorLen runes is cut at a rune
// boundary and marked "…(truncated)". Masking runs before the cut, so a secret is never half shown.
func (r *Redactor) Text(s string) string {
	r = r.get()
	s = r.mask(strings.ToValidUTF8(s, "\uFFFD"))
	return truncateRunes(s, r.maxLen)
}

// mask applies every text pattern to s without bounding its length. The order matters: URL
// passwords first, then name-value pairs, then bearer tokens, so that each pass sees the
// structure the earlier ones left intact.
func (r *Redactor) mask(s string) string {
	s = maskUserinfo(s)
	s = r.maskPairs(s)
	return maskBearer(s)
}

// truncateRunes cuts s after max runes, appending truncatedMarker when anything was cut.
func truncateRunes(s string, max int) string {
	if len(s) <= max { // bytes bound runes
		return s
	}
	n := 0
	for i := range s {
		if n == max {
			return s[:i] + truncatedMarker
		}
		n++
	}
	return s
}

// URL masks the credentials of one connection URL or DSN so that it can be logged or printed:
// the password of "postgres://u:p@h/db" (up to the last '@', so a password with an unescaped '@',
// '#', '?' or '/' is masked whole), the whole user info of a URL whose scheme may carry a token
// ("nats://TOKEN@h", "tls://TOKEN@h", "amqp://u:p@h": every scheme but the few in which it is a
// user name and a password), and
// secret key=value pairs ("host=h password=p", "?password=p"). A "scheme://…" that url.Parse
// refuses comes back as its scheme only ("postgres://[REDACTED]"): the parser's reading of a
// malformed URL is no guide to where its secrets are. It returns raw unchanged when there is
// nothing to mask.
func URL(raw string) string {
	if strings.Contains(raw, ",") {
		// A list of URLs ("nats://h1:4222,nats://h2:4222"): each on its own.
		parts := strings.Split(raw, ",")
		list := true
		for _, p := range parts {
			scheme, _, ok := strings.Cut(p, "://")
			list = list && ok && validScheme(scheme)
		}
		if list && len(parts) > 1 {
			for i, p := range parts {
				parts[i] = URL(p)
			}
			return strings.Join(parts, ",")
		}
	}
	if scheme, _, ok := strings.Cut(raw, "://"); ok && validScheme(scheme) {
		// Masked is not valid in a URL's user info; text already masked is still a URL.
		if _, err := url.Parse(strings.ReplaceAll(raw, Masked, "x")); err != nil {
			return scheme + "://" + Masked
		}
	}
	return defaultRedactor.maskPairs(maskUserinfo(raw))
}

// validScheme reports whether s is a URL scheme (RFC 3986): a letter, then letters, digits, '+',
// '-' or '.'.
func validScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

// URLError describes why url.Parse refused a URL without repeating any of it: the parser quotes
// the part it could not read (`invalid port ":S3cret" after host`), which is often the password.
// Every quoted part is dropped, and a hint says how to write special characters.
func URLError(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		msg = ue.Err.Error()
	}
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		if msg[i] != '"' {
			b.WriteByte(msg[i])
			continue
		}
		for i++; i < len(msg) && msg[i] != '"'; i++ {
			if msg[i] == '\\' {
				i++
			}
		}
	}
	out := strings.Join(strings.Fields(strings.TrimPrefix(b.String(), "net/url: ")), " ")
	return out + " (write '@', ':', '/', '?', '#' and '%' in a user name or password as %XX)"
}

// userSchemes are URL schemes in which a user info without a password is a user name, shown as
// it is ("postgres://alice@host"). In every other scheme — NATS, TLS, AMQP, Redis, Kafka and the
// brokers to come — it may be a token and is masked whole.
var userSchemes = []string{"postgres", "postgresql", "mysql", "http", "https", "ftp", "sftp", "ssh", "git", "sqlite", "sqlite3", "file"}

// maskUserinfo masks the password of every "scheme://user:password@host" in s whose scheme is in
// userSchemes, and the whole user info of any other scheme: a broker's user info may be a token,
// "user:password" or "token:" alike, and a partial mask would show part of a token. The user info ends at the last '@' before the
// URL ends (at a blank, a quote or an angle bracket), not at the first '/', '?' or '#': a
// password may hold them unescaped, and url.Parse would then read part of it as the host, port
// or path. Erring towards masking is deliberate.
func maskUserinfo(s string) string {
	var b strings.Builder
	last := 0
	for i := 0; i < len(s); {
		k := strings.Index(s[i:], "://")
		if k < 0 {
			break
		}
		k += i
		i = k + 3
		start := k
		for start > last && isSchemeByte(s[start-1]) {
			start--
		}
		if start == k {
			continue
		}
		scheme := s[start:k]
		authStart := k + 3
		end := authStart
		for end < len(s) && !isURLEnd(s[end]) {
			end++
		}
		// A list of URLs is a run of URLs ("nats://a@h1,nats://b@h2"): ",scheme://" ends one.
		for n := authStart; ; n += 3 {
			m := strings.Index(s[n:end], "://")
			if m < 0 {
				break
			}
			n += m
			sch := n
			for sch > authStart && isSchemeByte(s[sch-1]) {
				sch--
			}
			if sch < n && sch > authStart && s[sch-1] == ',' {
				end = sch - 1
				break
			}
		}
		at := strings.LastIndexByte(s[authStart:end], '@')
		if at < 0 {
			continue
		}
		from, to := authStart, authStart+at
		if containsFold(userSchemes, scheme) {
			c := strings.IndexByte(s[from:to], ':')
			if c < 0 {
				continue // a user name only
			}
			from += c + 1
		}
		if from == to || s[from:to] == Masked {
			i = to
			continue
		}
		b.WriteString(s[last:from])
		b.WriteString(Masked)
		last, i = to, to
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// maskPairs masks the value after every secret name followed by '=' or ':' in s. Every separator is
// considered, including those inside the value of a non-secret name, so "user=password=x" is
// masked as well.
func (r *Redactor) maskPairs(s string) string {
	var b strings.Builder
	last := 0
	q := quoteMemo{}
	for i := 0; i < len(s); i++ {
		if s[i] != '=' && s[i] != ':' {
			continue
		}
		name := nameBefore(s, last, i)
		if name == "" || !r.IsSecret(name) {
			continue
		}
		j := i + 1
		for j < len(s) && (s[j] == ' ' || s[j] == '\t') {
			j++
		}
		start, end, ok := q.valueSpan(s, j, normalizeName(name))
		if !ok {
			continue
		}
		b.WriteString(s[last:start])
		b.WriteString(Masked)
		last = end
		i = end - 1
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// maskBearer masks the token after every "Bearer " in s, case-insensitively and wherever it
// appears, since a bearer token alone grants access.
func maskBearer(s string) string {
	const word = "bearer"
	var b strings.Builder
	last := 0
	q := quoteMemo{}
	for i := 0; i+len(word) < len(s); i++ {
		if s[i]|0x20 != 'b' || !strings.EqualFold(s[i:i+len(word)], word) {
			continue
		}
		if i > 0 && isWordByte(s[i-1]) {
			continue
		}
		j := i + len(word)
		if s[j] != ' ' && s[j] != '\t' {
			continue
		}
		for j < len(s) && (s[j] == ' ' || s[j] == '\t') {
			j++
		}
		start, end, ok := q.valueSpan(s, j, "")
		if !ok {
			continue
		}
		b.WriteString(s[last:start])
		b.WriteString(Masked)
		last = end
		i = end - 1
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// nameBefore returns the name that ends just before the separator at sep — identifier characters,
// optionally quoted (also with escaped quotes, as in JSON inside a string) and followed by blanks —
// looking no further back than lo.
func nameBefore(s string, lo, sep int) string {
	k := sep
	for k > lo && (s[k-1] == ' ' || s[k-1] == '\t') {
		k--
	}
	if k > lo && (s[k-1] == '"' || s[k-1] == '\'') {
		k--
		if k > lo && s[k-1] == '\\' {
			k--
		}
	}
	end := k
	for k > lo && isNameByte(s[k-1]) {
		k--
	}
	if k > lo && (s[k-1] == '/' || s[k-1] == '\\') {
		// The last part of a file path ("open /etc/passwd: file is not a database"), not a
		// name that a secret value follows.
		return ""
	}
	return s[k:end]
}

// quoteMemo remembers, per quote kind, a position from which no closing quote follows, so that
// many unterminated quotes in one text are scanned in linear rather than quadratic time.
type quoteMemo struct {
	none [4]int // position+1 from which no closing quote exists, 0 = unknown
}

// find returns the index of the closing quote q (kind indexes none) at or after from, or -1.
func (m *quoteMemo) find(s string, from int, q string, kind int) int {
	if m.none[kind] != 0 && from >= m.none[kind]-1 {
		return -1
	}
	for k := from; k < len(s); {
		idx := strings.Index(s[k:], q)
		if idx < 0 {
			break
		}
		idx += k
		if len(q) == 1 && escaped(s, from, idx) {
			k = idx + 1
			continue
		}
		return idx
	}
	if m.none[kind] == 0 || from+1 < m.none[kind] {
		m.none[kind] = from + 1
	}
	return -1
}

// escaped reports whether the byte at i is preceded by an odd number of backslashes after from.
func escaped(s string, from, i int) bool {
	n := 0
	for i-1-n >= from && s[i-1-n] == '\\' {
		n++
	}
	return n%2 == 1
}

// valueSpan returns the bytes to mask for the value starting at j: the inside of a quoted value
// (also of an escaped-quoted one, `\"x\"`), or a run up to a blank, quote or list delimiter, or for
// a cookie header the rest of the line. For an authorization header a leading authentication
// scheme is kept. ok is false when the value is empty or already masked.
func (m *quoteMemo) valueSpan(s string, j int, name string) (start, end int, ok bool) {
	if strings.HasSuffix(name, "authorization") {
		if n := authSchemeLen(s[j:]); n > 0 {
			k := j + n
			for k < len(s) && (s[k] == ' ' || s[k] == '\t') {
				k++
			}
			if k < len(s) && !isBlank(s[k]) {
				j = k
			}
		}
	}
	if j >= len(s) {
		return 0, 0, false
	}
	switch c := s[j]; {
	case c == '\\' && j+1 < len(s) && (s[j+1] == '"' || s[j+1] == '\''):
		kind := 2
		if s[j+1] == '\'' {
			kind = 3
		}
		start = j + 2
		if end = m.find(s, start, s[j:j+2], kind); end < 0 {
			end = unquotedEnd(s, start)
		}
	case c == '"' || c == '\'':
		kind := 0
		if c == '\'' {
			kind = 1
		}
		start = j + 1
		if end = m.find(s, start, s[j:j+1], kind); end < 0 {
			end = unquotedEnd(s, start)
		}
	default:
		start = j
		if strings.HasPrefix(s[start:], Masked) {
			return 0, 0, false
		}
		if strings.HasSuffix(name, "cookie") {
			// A cookie header holds several secrets separated by "; ": mask up to the line end.
			end = start
			for end < len(s) && s[end] != '\n' && s[end] != '\r' {
				end++
			}
		} else {
			end = unquotedEnd(s, start)
		}
	}
	if end <= start || strings.HasPrefix(s[start:end], Masked) {
		return 0, 0, false
	}
	return start, end, true
}

// authSchemeLen returns the length of the authentication scheme word that starts s and is
// followed by a blank, or 0.
func authSchemeLen(s string) int {
	n := 0
	for n < len(s) && isNameByte(s[n]) {
		n++
	}
	if n == len(s) || (s[n] != ' ' && s[n] != '\t') || !containsFold(authSchemes, s[:n]) {
		return 0
	}
	return n
}

// unquotedEnd returns where an unquoted value starting at i ends: at a blank, a quote or one of
// the delimiters that separate fields in logs, query strings and DSNs. A Masked inside the value
// is stepped over, so that masking masked text does not leave a stray bracket behind.
func unquotedEnd(s string, i int) int {
	for ; i < len(s); i++ {
		if s[i] == Masked[0] && strings.HasPrefix(s[i:], Masked) {
			i += len(Masked) - 1
			continue
		}
		switch s[i] {
		case ' ', '\t', '\n', '\r', '\v', '\f', '"', '\'', ',', ';', '&', ')', ']', '}':
			return i
		}
	}
	return i
}

func containsFold(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

func isBlank(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

func isWordByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

func isNameByte(c byte) bool { return isWordByte(c) || c == '-' || c == '.' }

func isSchemeByte(c byte) bool { return isWordByte(c) && c != '_' || c == '+' || c == '-' || c == '.' }

// isURLEnd reports whether c ends a URL written in text: a blank, a control character, a quote
// or an angle bracket.
func isURLEnd(c byte) bool {
	switch c {
	case '"', '\'', '<', '>', '`':
		return true
	}
	return c <= ' ' || c == 0x7f
}

// MaskText masks every secret pattern of Text in s (URL credentials, secret key=value pairs,
// bearer tokens) without bounding its length: for free text such as an error that may repeat a
// URL. Use URL for a string that is one URL.
func MaskText(s string) string { return defaultRedactor.mask(s) }
