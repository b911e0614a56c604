package idemredact

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzRedactText checks the promises Text makes to dead letters and logs for any input: it does
// not panic, returns valid UTF-8 within its length bound, and masks a password planted in
// arbitrary surrounding text.
func FuzzRedactText(f *testing.F) {
	f.Add("", "hunter2", "")
	f.Add("login failed: ", "s3cretPass", " for user bob")
	f.Add("dial postgres://app:", "pw1234", "@db/ledger")
	f.Add(`{"user":"bob","`, "abcd", `"}`)
	f.Add("Authorization: Bearer ", "eyJhbGciOi", "\n")
	f.Add("token=\"", "zzzz", "\" \xff\xfe")
	f.Add(strings.Repeat("日本", 700), "longsecret", strings.Repeat("é", 700))

	redactors := []*Redactor{nil, New(Config{MaxErrorLen: 16})}
	f.Fuzz(func(t *testing.T, prefix, secret, suffix string) {
		// The planted value: the ASCII letters and digits of secret.
		tok := strings.Map(func(r rune) rune {
			if r < utf8.RuneSelf && isWordByte(byte(r)) && r != '_' {
				return r
			}
			return -1
		}, secret)
		planted := prefix + "password=" + tok + suffix
		for _, r := range redactors {
			maxLen := r.get().maxLen
			for _, in := range []string{prefix + secret + suffix, planted} {
				out := r.Text(in)
				if !utf8.ValidString(out) {
					t.Fatalf("Text(%q) = %q: not valid UTF-8", in, out)
				}
				if n := utf8.RuneCountInString(out); n > maxLen+len(truncatedMarker) {
					t.Fatalf("Text(%q) has %d runes, more than %d + marker", in, n, maxLen)
				}
			}
			// The token must not survive, unless it also occurs elsewhere in the input or in the
			// text Text adds itself (then seeing it proves nothing).
			if len(tok) < 4 || strings.Count(planted, tok) != 1 ||
				strings.Contains(Masked+truncatedMarker, tok) {
				continue
			}
			if out := r.Text(planted); strings.Contains(out, tok) {
				t.Fatalf("Text(%q) = %q leaks the planted password %q", planted, out, tok)
			}
		}
	})
}
