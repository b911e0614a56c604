package idemauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/wire"
)

// HeaderSignature is the message header that carries the signature.
const HeaderSignature = wire.Signature

// MaxSignatureHeaderLen bounds the header ParseSignature reads: a real one is under 250 bytes,
// and a bound keeps a hostile header from costing more than a real one.
const MaxSignatureHeaderLen = 1024

// MAC domains start every MAC input; a new scheme gets a new tag (and a new "v" field).
const (
	macDomainV1 = wire.SignatureDomainV1
	macDomainV2 = wire.SignatureDomainV2
)

// Purposes a v2 MAC is made for: a producer's signature can never pass as an operator's replay
// signature, nor the reverse, even under the same secret.
const (
	purposeEvent  = "event"
	purposeReplay = "replay"
)

// maxUnix is the last second RFC 3339 can write (9999-12-31T23:59:59Z); timestamps have at most
// 12 digits, so parsing never overflows.
const maxUnix = 253402300799

// Signature is a parsed signature header.
type Signature struct {
	// KeyID names the key that made the signature (unverified until the MAC is checked).
	KeyID string
	// Timestamp is when the producer signed, to the second.
	Timestamp time.Time
	// Version is the scheme of MAC: 2 (the v2 field, what Sign writes) or 1 (the v1 field, the
	// former scheme, verified only while VerifierConfig.AcceptV1Until allows it). A header with
	// both fields parses as version 2.
	Version int
	// MAC is the HMAC-SHA256 from the v2 (or v1) field.
	MAC [sha256.Size]byte
}

// String formats s as a header value, "kid=<id>,t=<unix>,v2=<hex>" ("v1=" for version 1).
func (s Signature) String() string {
	field := "," + wire.SignatureFieldV2 + "="
	if s.Version == 1 {
		field = "," + wire.SignatureFieldV1 + "="
	}
	return "kid=" + s.KeyID + ",t=" + strconv.FormatInt(s.Timestamp.Unix(), 10) + field + hex.EncodeToString(s.MAC[:])
}

// ParseSignature parses a signature header value: comma-separated key=value fields (spaces
// around a field are ignored) with exactly one kid, one t (decimal unix seconds without sign or
// leading zeros, so one instant has one spelling) and one v2 or v1 (64 hex digits; when both are
// present v2 is used). Unknown fields are ignored, so that a later scheme can add one beside v2. It never panics and reads at most
// MaxSignatureHeaderLen bytes; its errors wrap ErrMalformedSignature and quote only a bounded
// part of the input.
func ParseSignature(header string) (Signature, error) {
	s, err := parseSignature(header)
	if err != nil {
		return Signature{}, fmt.Errorf("%w: %w", ErrMalformedSignature, err)
	}
	return s, nil
}

func parseSignature(header string) (Signature, error) {
	var s Signature
	if header == "" {
		return s, errors.New("header is empty")
	}
	if len(header) > MaxSignatureHeaderLen {
		return s, fmt.Errorf("header is %d bytes, limit %d", len(header), MaxSignatureHeaderLen)
	}
	var haveKID, haveT, haveV1, haveV2 bool
	var v1 [sha256.Size]byte
	for i, f := range strings.Split(header, ",") {
		f = strings.Trim(f, " \t")
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return s, fmt.Errorf("field %d %s is not key=value", i+1, quoteTrunc(f))
		}
		seen := func(have *bool) error {
			if *have {
				return fmt.Errorf("field %s appears twice", k)
			}
			*have = true
			return nil
		}
		switch k {
		case "kid":
			if err := seen(&haveKID); err != nil {
				return s, err
			}
			if !validKeyID(v) {
				return s, fmt.Errorf("kid %s is not a key id (1 to %d letters, digits, '.', '_' or '-')", quoteTrunc(v), KeyIDMaxLen)
			}
			s.KeyID = v
		case "t":
			if err := seen(&haveT); err != nil {
				return s, err
			}
			unix, err := parseUnix(v)
			if err != nil {
				return s, fmt.Errorf("t %s %w", quoteTrunc(v), err)
			}
			s.Timestamp = time.Unix(unix, 0).UTC()
		case wire.SignatureFieldV1, wire.SignatureFieldV2:
			have, dst := &haveV1, &v1
			if k == wire.SignatureFieldV2 {
				have, dst = &haveV2, &s.MAC
			}
			if err := seen(have); err != nil {
				return s, err
			}
			if len(v) != 2*sha256.Size {
				return s, fmt.Errorf("%s has %d characters, want %d hex digits", k, len(v), 2*sha256.Size)
			}
			if _, err := hex.Decode(dst[:], []byte(v)); err != nil {
				return s, fmt.Errorf("%s is not hex", k)
			}
		}
	}
	switch {
	case haveV2:
		s.Version = 2
	case haveV1:
		s.Version, s.MAC = 1, v1
	}
	switch {
	case !haveKID:
		return s, errors.New("field kid is missing")
	case !haveT:
		return s, errors.New("field t is missing")
	case !haveV1 && !haveV2:
		return s, errors.New("field v2 (or v1) is missing")
	}
	return s, nil
}

// parseUnix parses unix seconds written as Sign writes them: digits only, no leading zero, at
// most the year 9999.
func parseUnix(v string) (int64, error) {
	if v == "" || len(v) > 12 {
		return 0, errors.New("is not unix seconds (1 to 12 digits)")
	}
	if len(v) > 1 && v[0] == '0' {
		return 0, errors.New("has a leading zero")
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, errors.New("is not unix seconds (digits only)")
		}
		n = n*10 + int64(c-'0')
	}
	if n > maxUnix {
		return 0, errors.New("is after the year 9999")
	}
	return n, nil
}

// Sign returns the signature header value for msg signed with key at now (see the package
// documentation for what the MAC covers). It refuses an invalid key, a key expired at now, a
// message without EventID, a message whose Tenant is set to another tenant than the key's (a
// producer bug that the consumer would refuse anyway) and a time before 1970 or after 9999.
func Sign(key Key, msg idem.Message, now time.Time) (string, error) {
	if err := key.validate(0); err != nil {
		return "", fmt.Errorf("idemauth: sign: %w (event %s)", err, quoteTrunc(msg.EventID))
	}
	switch {
	case msg.EventID == "":
		return "", fmt.Errorf("idemauth: sign (type %q): EventID is empty", msg.Type)
	case msg.Tenant != "" && msg.Tenant != key.Tenant:
		return "", fmt.Errorf("idemauth: sign: Tenant %s differs from the tenant %q of key %q (event %s)", quoteTrunc(msg.Tenant), key.Tenant, key.ID, quoteTrunc(msg.EventID))
	case key.expiredAt(now):
		return "", fmt.Errorf("idemauth: sign: key %q expired at %s (event %s)", key.ID, key.NotAfter.UTC().Format(time.RFC3339), quoteTrunc(msg.EventID))
	case now.Unix() < 0 || now.Unix() > maxUnix:
		return "", fmt.Errorf("idemauth: sign: time %s is outside 1970-9999 (event %s)", now.UTC().Format(time.RFC3339), quoteTrunc(msg.EventID))
	}
	s := Signature{KeyID: key.ID, Timestamp: time.Unix(now.Unix(), 0).UTC(), Version: 2}
	s.MAC = computeMAC(key, s.Timestamp.Unix(), msg)
	return s.String(), nil
}

// SignMessage signs *msg with key at now: it sets msg.Tenant to the key's tenant and the
// HeaderSignature header. It copies msg.Headers before adding to it, so a header map shared with
// other messages is not changed.
func SignMessage(key Key, msg *idem.Message, now time.Time) error {
	m := *msg
	m.Tenant = key.Tenant
	sig, err := Sign(key, m, now)
	if err != nil {
		return err
	}
	h := make(map[string]string, len(m.Headers)+1)
	for k, v := range m.Headers {
		h[k] = v
	}
	h[HeaderSignature] = sig
	m.Headers = h
	*msg = m
	return nil
}

// computeMAC is the v2 HMAC-SHA256 under key.Secret over the length-prefixed fields of the
// package documentation. The tenant is always the key's: that is what binds a signature to a
// tenant.
func computeMAC(key Key, unix int64, msg idem.Message) [sha256.Size]byte {
	return macV2(key.Secret, purposeEvent, unix, key.ID, key.Tenant, msg)
}

// macV2 is HMAC-SHA256 under secret over "idem-signature-v2", the purpose, the timestamp, the key
// id, the event id, the tenant, the type, the occurrence time (RFC 3339 with nanoseconds, UTC;
// to the microsecond, empty when unknown), the purpose's own fields (none for "event"; for "replay" the replay
// headers) and SHA-256 of the payload, each preceded by its length. The purpose fixes how many
// fields follow, so the length prefixes keep every input unambiguous.
func macV2(secret []byte, purpose string, unix int64, kid, tenant string, msg idem.Message, extra ...string) [sha256.Size]byte {
	sum := sha256.Sum256(msg.Payload)
	m := hmac.New(sha256.New, secret)
	for _, f := range []string{macDomainV2, purpose, strconv.FormatInt(unix, 10), kid, msg.EventID, tenant, msg.Type,
		occurredText(msg.OccurredAt)} {
		writeField(m, []byte(f))
	}
	for _, f := range extra {
		writeField(m, []byte(f))
	}
	writeField(m, sum[:])
	var out [sha256.Size]byte
	m.Sum(out[:0])
	return out
}

// occurredText is the signed spelling of an occurrence time: RFC 3339 in UTC, to the
// microsecond. Microseconds, because that is what PostgreSQL keeps of a dead letter's
// occurred_at: a replayed dead letter must still match its producer's signature.
func occurredText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano)
}

// computeMACv1 is the former scheme, verified during a rotation window only: it covers neither
// the occurrence time nor a purpose.
func computeMACv1(key Key, unix int64, msg idem.Message) [sha256.Size]byte {
	sum := sha256.Sum256(msg.Payload)
	m := hmac.New(sha256.New, key.Secret)
	writeField(m, []byte(macDomainV1))
	writeField(m, []byte(strconv.FormatInt(unix, 10)))
	writeField(m, []byte(key.ID))
	writeField(m, []byte(msg.EventID))
	writeField(m, []byte(key.Tenant))
	writeField(m, []byte(msg.Type))
	writeField(m, sum[:])
	var out [sha256.Size]byte
	m.Sum(out[:0])
	return out
}

// writeField writes b preceded by its length as 8 bytes, big-endian.
func writeField(h hash.Hash, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// quoteTrunc quotes s for an error message, cut to 64 bytes at a rune boundary: values in errors
// come from untrusted input and end up in dead letters and logs.
func quoteTrunc(s string) string {
	const max = 64
	if len(s) <= max {
		return strconv.Quote(s)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…"
}
