package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/idemkit/idem/internal/canonjson"
)

// FingerprintFromBytes converts a stored 32-byte value back to a Fingerprint.
func FingerprintFromBytes(b []byte) (Fingerprint, error) {
	var f Fingerprint
	if len(b) != len(f) {
		return f, fmt.Errorf("idem: fingerprint has %d bytes, want %d", len(b), len(f))
	}
	copy(f[:], b)
	return f, nil
}

// FingerprintConfig chooses the content that defines an event. By default it is the event type
// and the whole canonicalised JSON payload, and a payload that is not JSON is refused.
type FingerprintConfig struct {
	// Fields, when set, restricts the fingerprint to these dotted paths of the JSON payload
	// ("order_id", "amount.cents"); other fields may change between deliveries.
	Fields []string
	// Exclude removes volatile dotted paths (delivery timestamps, trace ids) from the fingerprint.
	Exclude []string
	// Raw declares that this consumer's payloads need not be JSON (protobuf, CSV, plain text): a
	// payload that does not parse as JSON is fingerprinted as its raw bytes instead of being
	// refused as invalid_payload. A payload that does parse is still canonicalised, so
	// fingerprints stored before Raw was set stay valid. Without Raw, a truncated document or
	// one with a byte-order mark in front is an invalid_payload dead letter, never applied.
	Raw bool
	// Func, when set, replaces the computation entirely.
	Func func(msg Message) (Fingerprint, error)
}

// Domain tags keep a JSON payload and a raw payload with the same bytes from colliding.
const (
	fpTagJSON = "idem.fp.v1.json"
	fpTagRaw  = "idem.fp.v1.raw"
)

// ComputeFingerprint returns the fingerprint of msg: SHA-256 over the event type and the
// canonical JSON payload (keys sorted, insignificant whitespace removed, numbers as written),
// restricted or trimmed as cfg says. A payload that is not JSON (truncated, a byte-order mark in
// front, binary) is an error wrapping ErrInvalidPayload unless cfg.Raw is set, in which case it
// is hashed as raw bytes; a payload that is JSON but cannot be canonicalised (duplicate keys,
// too deep) is always such an error.
func ComputeFingerprint(msg Message, cfg FingerprintConfig) (Fingerprint, error) {
	if cfg.Func != nil {
		return cfg.Func(msg)
	}
	// One parse on the common path: canonicalise, and only when that fails ask whether the
	// payload was JSON at all (raw bytes, when allowed) or JSON that cannot be fingerprinted.
	canon, err := canonjson.Canonicalize(msg.Payload, canonjson.Options{Include: cfg.Fields, Exclude: cfg.Exclude})
	if err == nil {
		return hashFields(fpTagJSON, msg.Type, canon), nil
	}
	if canonjson.IsJSON(msg.Payload) {
		return Fingerprint{}, fmt.Errorf("%w: %w", ErrInvalidPayload, err)
	}
	if !cfg.Raw {
		return Fingerprint{}, fmt.Errorf("%w: payload is not JSON (%w); a consumer whose payloads are not JSON sets FingerprintConfig.Raw", ErrInvalidPayload, err)
	}
	if len(cfg.Fields) > 0 {
		return Fingerprint{}, fmt.Errorf("%w: fingerprint fields %v need a JSON payload", ErrInvalidPayload, cfg.Fields)
	}
	return RawFingerprint(msg), nil
}

// hashFields is SHA-256 over a domain tag, the event type and the content, each prefixed with
// its length so that no two different triples hash alike.
func hashFields(tag, typ string, content []byte) Fingerprint {
	h := sha256.New()
	var n [8]byte
	field := func(b []byte) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field([]byte(tag))
	field([]byte(typ))
	field(content)
	var fp Fingerprint
	h.Sum(fp[:0])
	return fp
}

// RawFingerprint hashes the type and the payload bytes as they are: the fingerprint of a raw
// consumer's non-JSON payload, and (so that package idemdlq can check a replay against it) of a
// dead letter rejected before its fingerprint was computed. The runtime also uses it for
// a dead letter rejected before its fingerprint was computed (no event id, too large, not
// authenticated), so that two different rejected messages never share a pending dead letter.
func RawFingerprint(msg Message) Fingerprint {
	return hashFields(fpTagRaw, msg.Type, msg.Payload)
}
