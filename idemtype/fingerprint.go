package idemtype

import "encoding/hex"

// Fingerprint is the SHA-256 of an event's relevant content. Two deliveries with the same key
// and the same fingerprint are the same event; the same key with another fingerprint is key
// reuse.
type Fingerprint [32]byte

// String returns the fingerprint in hex.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// Short returns the first 12 hex digits, enough to tell fingerprints apart in an error message.
func (f Fingerprint) Short() string { return hex.EncodeToString(f[:6]) }

// IsZero reports whether f was never computed.
func (f Fingerprint) IsZero() bool { return f == Fingerprint{} }
