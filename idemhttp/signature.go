package idemhttp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/wire"
)

// ToleranceDefault is the replay window Verify applies when it is given no tolerance: a signed
// request older (or further in the future) than this is refused. Five minutes absorbs clock skew
// and a slow network without keeping captured requests replayable for long.
const ToleranceDefault = 5 * time.Minute

// SecretMinBytes is the shortest secret VerifyHeader and NewSink accept: 32 bytes, HMAC-SHA256's
// output size, as idemauth.SecretMinBytes. A shorter secret can be guessed offline from a single
// signed request.
const SecretMinBytes = 32

// maxSignatureHeaderLen bounds the header Verify parses, so an attacker cannot make it work hard.
const maxSignatureHeaderLen = 4096

// macDomain starts every MAC input. The HTTP scheme's signature field is "h1", never "v1" or
// "v2": those belong to idemauth's broker signature (header Idem-Signature), whose MAC input is
// different, and a receiver must not mistake one for the other.
const macDomain = wire.HTTPSignatureDomainH1

// SignedRequest is what the HTTP signature covers: every part of a request a receiver decides on.
// RequestOf builds it from a received request.
type SignedRequest struct {
	// Method is the HTTP method ("POST").
	Method string
	// Target is the request target: the escaped path and, when there is one, "?" and the query
	// (url.URL.RequestURI). A proxy that rewrites the path breaks the signature on purpose.
	Target string
	// IdempotencyKey, EventID, Tenant, Type and OccurredAt are the values of the headers of the
	// same names (empty when absent).
	IdempotencyKey, EventID, Tenant, Type, OccurredAt string
	// Body is the request body.
	Body []byte
}

// RequestOf returns what the signature of r covers; body is r's body, read by the caller. It
// reads the first value of each header: Verify refuses a request that repeats a signed header,
// and a caller passing RequestOf to VerifyHeader itself should check the same (see Verify).
func RequestOf(r *http.Request, body []byte) SignedRequest {
	return SignedRequest{
		Method:         r.Method,
		Target:         r.URL.RequestURI(),
		IdempotencyKey: r.Header.Get(HeaderIdempotencyKey),
		EventID:        r.Header.Get(HeaderEventID),
		Tenant:         r.Header.Get(HeaderTenant),
		Type:           r.Header.Get(HeaderType),
		OccurredAt:     r.Header.Get(HeaderOccurredAt),
		Body:           body,
	}
}

// Sign returns the signature header value for req signed with secret at t:
// "t=<unix seconds>[,kid=<key id>],h1=<hex HMAC-SHA256>". The MAC input is the length-prefixed
// (8 bytes, big-endian) sequence "idem-http-signature-h1", t, kid, method, target,
// Idempotency-Key, Idem-Event-Id, Idem-Tenant, Idem-Type, Idem-Occurred-At and SHA-256(body):
// a captured request cannot be re-sent later, under another key or tenant, or to another path.
func Sign(secret []byte, keyID string, t time.Time, req SignedRequest) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	sig := hex.EncodeToString(mac(secret, ts, keyID, req))
	if keyID == "" {
		return "t=" + ts + "," + wire.HTTPSignatureFieldH1 + "=" + sig
	}
	return "t=" + ts + ",kid=" + keyID + "," + wire.HTTPSignatureFieldH1 + "=" + sig
}

// mac is HMAC-SHA256 over the length-prefixed fields Sign documents.
func mac(secret []byte, ts, keyID string, req SignedRequest) []byte {
	sum := sha256.Sum256(req.Body)
	h := hmac.New(sha256.New, secret)
	var n [8]byte
	for _, f := range [][]byte{[]byte(macDomain), []byte(ts), []byte(keyID), []byte(req.Method), []byte(req.Target),
		[]byte(req.IdempotencyKey), []byte(req.EventID), []byte(req.Tenant), []byte(req.Type), []byte(req.OccurredAt), sum[:]} {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	return h.Sum(nil)
}

// Verify checks the SignatureHeaderDefault header of r, whose body the caller has read into body,
// with secret: VerifyHeader over RequestOf(r, body). It first refuses, with an error wrapping
// idem.ErrUnauthenticated, a request with more than one value of a signed header or of the
// signature header: the signature covers one value, and a receiver (or a proxy) reading another
// one would act on what was not signed.
func Verify(secret []byte, r *http.Request, body []byte, now time.Time, tolerance time.Duration) error {
	// The headers whose values the signature covers (RequestOf), and the signature itself.
	for _, name := range [...]string{HeaderIdempotencyKey, HeaderEventID, HeaderTenant, HeaderType, HeaderOccurredAt, SignatureHeaderDefault} {
		if n := len(r.Header.Values(name)); n > 1 {
			return fmt.Errorf("%w: idemhttp: verify signature: header %s has more than one value (%d): the signature covers one, so the request is ambiguous",
				idem.ErrUnauthenticated, name, n)
		}
	}
	return VerifyHeader(secret, r.Header.Get(SignatureHeaderDefault), RequestOf(r, body), now, tolerance)
}

// VerifyHeader checks a signature header made by Sign (or sent by the sink) against req and
// secret. It refuses, with an error wrapping idem.ErrUnauthenticated: a secret shorter than
// SecretMinBytes (a configuration error, reported on every request), a malformed header, a
// timestamp further than tolerance from now in either direction (a replayed or pre-dated
// request; tolerance <= 0 means ToleranceDefault), and a header none of whose h1
// signatures matches. Several h1 fields are allowed so that a sender can sign with an old and a
// new key during rotation; they share the header's kid. Signatures are compared in constant time.
func VerifyHeader(secret []byte, header string, req SignedRequest, now time.Time, tolerance time.Duration) error {
	if len(secret) == 0 {
		return fmt.Errorf("%w: idemhttp: verify signature: secret is empty", idem.ErrUnauthenticated)
	}
	if len(secret) < SecretMinBytes {
		return fmt.Errorf("%w: idemhttp: verify signature: secret has %d bytes, want at least %d random bytes",
			idem.ErrUnauthenticated, len(secret), SecretMinBytes)
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
	want := mac(secret, sig.ts, sig.kid, req)
	for _, v := range sig.h1 {
		if hmac.Equal(v, want) {
			return nil
		}
	}
	return fmt.Errorf("%w: idemhttp: verify signature: no h1 signature matches the request (method, target, idempotency key, event id, tenant, type, occurrence time or body changed, or another secret)", idem.ErrUnauthenticated)
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
	kid  string
	h1   [][]byte
}

// parseHeader splits "t=…,kid=…,h1=…" into its fields. Exactly one t (decimal digits only, so
// that "+1" and "01" cannot sign the same instant under a different text), at most one kid and at
// least one well-formed h1 are required. A v1 or v2 field is refused by name: it is a broker
// signature (idemauth) or the former HTTP scheme, which signed the body only.
func parseHeader(header string) (parsedSignature, error) {
	var p parsedSignature
	if header == "" {
		return p, errors.New("signature header is missing")
	}
	if len(header) > maxSignatureHeaderLen {
		return p, fmt.Errorf("signature header is %d bytes, limit %d", len(header), maxSignatureHeaderLen)
	}
	seenT, seenKID, seenV := false, false, false
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
		case "kid":
			if seenKID {
				return p, errors.New("signature header has more than one kid")
			}
			seenKID, p.kid = true, v
		case wire.HTTPSignatureFieldH1:
			b, err := hex.DecodeString(v)
			if err != nil || len(b) != sha256.Size {
				return p, fmt.Errorf("signature header h1 %q is not %d hex-encoded bytes", truncate(v, 80), sha256.Size)
			}
			p.h1 = append(p.h1, b)
		case wire.SignatureFieldV1, wire.SignatureFieldV2:
			seenV = true
		}
	}
	if !seenT {
		return p, errors.New("signature header has no timestamp t")
	}
	if len(p.h1) == 0 {
		if seenV {
			return p, errors.New("signature header has no h1 signature (v1/v2 is a broker signature or the retired body-only HTTP scheme)")
		}
		return p, errors.New("signature header has no h1 signature")
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

// IdempotencyKey returns the Idempotency-Key of an event: tenant and event id, each
// query-escaped, joined by ':'. The escaping makes the encoding unambiguous — ':' only ever
// separates — so ("acme:eu", "42") and ("acme", "eu:42") get different keys, while ids of
// letters, digits, '-', '_' and '.' read as before ("acme:pay-1").
func IdempotencyKey(tenant, eventID string) string {
	return url.QueryEscape(tenant) + ":" + url.QueryEscape(eventID)
}
