package idemkey

import (
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idem/wire"
)

// HeaderIdempotencyKey is the request header that carries the key.
const HeaderIdempotencyKey = wire.IdempotencyKey

// Bounds of what the middleware stores about a key.
const (
	// MaxKeyLen bounds a key, in bytes (Stripe's limit; a UUID needs 36).
	MaxKeyLen = 255
	// MaxPrincipalLen bounds the principal Config.Principal returns.
	MaxPrincipalLen = 256
	// MaxRouteLen bounds the route Config.Route returns.
	MaxRouteLen = 512
)

// Why ParseKey refuses a header.
var (
	// ErrKeyMissing: the request carries no Idempotency-Key.
	ErrKeyMissing = errors.New("idemkey: Idempotency-Key header is missing")
	// ErrKeyMalformed: the header is repeated, empty, too long or not a valid key.
	ErrKeyMalformed = errors.New("idemkey: Idempotency-Key header is malformed")
)

// ParseKey reads the key from the values of the Idempotency-Key header fields of a request. The
// IETF draft "The Idempotency-Key HTTP Header Field" makes the value a Structured Field String
// (RFC 8941: "…", printable ASCII, with \" and \\ escapes); Stripe and most clients send the
// key bare. ParseKey accepts both: a quoted value is decoded as an sf-string (parameters are
// not allowed), a bare one must be printable ASCII without spaces, quotes or backslashes. The
// key is 1 to MaxKeyLen bytes. Several header fields are refused, since a client sending two
// keys does not know which one it means.
func ParseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrKeyMissing
	case 1:
	default:
		return "", fmt.Errorf("%w: %d header fields, want one", ErrKeyMalformed, len(values))
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", fmt.Errorf("%w: the value is empty", ErrKeyMalformed)
	}
	if len(v) > 2*MaxKeyLen+2 {
		return "", fmt.Errorf("%w: longer than %d bytes", ErrKeyMalformed, MaxKeyLen)
	}
	var key string
	if v[0] == '"' {
		k, err := parseSFString(v)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrKeyMalformed, err)
		}
		key = k
	} else {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c <= 0x20 || c >= 0x7f || c == '"' || c == '\\' {
				return "", fmt.Errorf("%w: byte %d is %q (a bare key is printable ASCII without spaces, quotes or backslashes)", ErrKeyMalformed, i, rune(c))
			}
		}
		key = v
	}
	switch {
	case key == "":
		return "", fmt.Errorf("%w: the key is empty", ErrKeyMalformed)
	case len(key) > MaxKeyLen:
		return "", fmt.Errorf("%w: %d bytes, at most %d allowed", ErrKeyMalformed, len(key), MaxKeyLen)
	}
	return key, nil
}

// parseSFString decodes an RFC 8941 sf-string that makes up the whole of v.
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errors.New("a backslash escapes only \" or \\")
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", errors.New("text after the closing quote (parameters are not allowed)")
			}
			return b.String(), nil
		case c < 0x20 || c >= 0x7f:
			return "", fmt.Errorf("byte %d is %q (a string is printable ASCII)", i, rune(c))
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("no closing quote")
}
