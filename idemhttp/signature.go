package idemhttp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// ToleranceDefault is the replay window Verify applies when it is given no tolerance: a signed
// request older (or further in the future) than this is refused. Five minutes absorbs clock skew
// and a slow network without keeping captured requests replayable for long.
const ToleranceDefault = 5 * time.Minute

// maxSignatureHeaderLen bounds the header Verify parses, so an attacker cannot make it work hard.
const maxSignatureHeaderLen = 4096

// Sign returns the signature header value for body signed with secret at t:
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<unix seconds>.<body>">". Signing the timestamp with
// the body is what lets a receiver refuse a captured request replayed later. The sink adds the
// key id ("t=…,kid=…,v1=…"); Verify accepts both forms.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

// signHeader is Sign with the key id in the middle, the form the sink sends.
func signHeader(secret []byte, keyID string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	sig := hex.EncodeToString(mac(secret, ts, body))
	if keyID == "" {
		return "t=" + ts + ",v1=" + sig
	}
	return "t=" + ts + ",kid=" + keyID + ",v1=" + sig
}

// mac is HMAC-SHA256 over "<ts>.<body>".
func mac(secret []byte, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Verify checks a signature header made by Sign (or sent by the sink) against body and secret.
// It refuses, with an error wrapping idem.ErrUnauthenticated: an empty secret, a malformed
// header, a timestamp further than tolerance from now in either direction (a replayed or
// pre-dated request; tolerance <= 0 means ToleranceDefault), and a header none of whose v1
// signatures matches. Several v1 fields are allowed so that a sender can sign with an old and a
// new key during rotation; kid and unknown fields are ignored. Signatures are compared in
// constant time.
func Verify(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	if len(secret) == 0 {
		return fmt.Errorf("%w: idemhttp: verify signature: secret is empty", idem.ErrUnauthenticated)
	}
	if tolerance <= 0 {
		tolerance = ToleranceDefault
	}
	sig, err := parseHeader(header)
	if err != nil {
		return fmt.Errorf("%w: idemhttp: verify signature: %w", idem.ErrUnauthenticated, err)
	}
	signedAt := time.Unix(sig.unix, 0)
	if d := now.Sub(signedAt); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: idemhttp: verify signature: timestamp %s is %s away from now, beyond the tolerance of %s (replayed or pre-dated request)",
			idem.ErrUnauthenticated, signedAt.UTC().Format(time.RFC3339), d.Round(time.Second), tolerance)
	}
	want := mac(secret, sig.ts, body)
	for _, v := range sig.v1 {
		if hmac.Equal(v, want) {
			return nil
		}
	}
	return fmt.Errorf("%w: idemhttp: verify signature: no v1 signature matches the body", idem.ErrUnauthenticated)
}

// SignatureKeyID returns the kid field of a signature header ("" when absent), so that a receiver
// holding several keys can pick the secret to pass to Verify. The value is unverified until
// Verify succeeds.
func SignatureKeyID(header string) string {
	for _, f := range strings.Split(header, ",") {
		if k, v, ok := strings.Cut(strings.TrimSpace(f), "="); ok && k == "kid" {
			return v
		}
	}
	return ""
}

// parsedSignature is a parsed signature header.
type parsedSignature struct {
	ts   string // the timestamp exactly as signed
	unix int64
	v1   [][]byte
}

// parseHeader splits "t=…,kid=…,v1=…" into its fields. Exactly one t (decimal digits only, so
// that "+1" and "01" cannot sign the same instant under a different text) and at least one
// well-formed v1 are required.
func parseHeader(header string) (parsedSignature, error) {
	var p parsedSignature
	if header == "" {
		return p, errors.New("signature header is missing")
	}
	if len(header) > maxSignatureHeaderLen {
		return p, fmt.Errorf("signature header is %d bytes, limit %d", len(header), maxSignatureHeaderLen)
	}
	seenT := false
	for _, f := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok {
			return p, fmt.Errorf("signature header field %q is not key=value", truncate(f, 40))
		}
		switch k {
		case "t":
			if seenT {
				return p, errors.New("signature header has more than one t")
			}
			seenT = true
			n, err := parseUnix(v)
			if err != nil {
				return p, err
			}
			p.ts, p.unix = v, n
		case "v1":
			b, err := hex.DecodeString(v)
			if err != nil || len(b) != sha256.Size {
				return p, fmt.Errorf("signature header v1 %q is not %d hex-encoded bytes", truncate(v, 80), sha256.Size)
			}
			p.v1 = append(p.v1, b)
		}
	}
	if !seenT {
		return p, errors.New("signature header has no timestamp t")
	}
	if len(p.v1) == 0 {
		return p, errors.New("signature header has no v1 signature")
	}
	return p, nil
}

// parseUnix parses canonical non-negative decimal unix seconds.
func parseUnix(s string) (int64, error) {
	if s == "" || len(s) > 18 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("signature timestamp %q is not unix seconds", truncate(s, 40))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("signature timestamp %q is not unix seconds", truncate(s, 40))
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("signature timestamp %q is not unix seconds", truncate(s, 40))
	}
	return n, nil
}

// truncate bounds attacker-controlled text quoted in an error.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
