package idemredact

import (
	"encoding/json"
	"fmt"
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

// FuzzRedactJSONBounded checks that rendering any payload stays within the output bound plus its
// marker, and that a pretty result is one valid JSON document.
func FuzzRedactJSONBounded(f *testing.F) {
	f.Add([]byte(strings.Repeat("[", 300)+strings.Repeat("]", 300)), 8, 256)
	f.Add([]byte(`{"password":"x","a":[1,{"b":"Bearer abc"}]}`), 2, 64)
	f.Add([]byte("not json \x1b[2J"), 64, 16)
	f.Add([]byte(`"`+strings.Repeat("é", 100)+`"`), 4, 17)
	f.Fuzz(func(t *testing.T, payload []byte, depth, max int) {
		depth, max = 1+abs(depth)%100, 1+abs(max)%4096
		r := New(Config{MaxJSONDepth: depth, MaxOutputBytes: max})
		out, pretty := r.Render(payload)
		marker := len(fmt.Sprintf("\n… (truncated, payload of %d bytes)", len(payload)))
		if len(out) > max+marker {
			t.Fatalf("Render(%q) is %d bytes, bound %d + marker %d", payload, len(out), max, marker)
		}
		if pretty && !json.Valid(out) {
			t.Fatalf("Render(%q) says pretty but %q is not JSON", payload, out)
		}
	})
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
