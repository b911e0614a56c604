// Package idemauth authenticates messages with HMAC-SHA256 signatures bound to tenants: step 2 of
// idem's path, "trust after verification". A producer signs each message with a [Key] that
// belongs to one tenant; the consumer's [Verifier] (an [idem.Authenticator]) checks the
// signature, and the tenant of the verified key — never a payload field — becomes the message's
// tenant and so part of its claim key.
//
// # Wire format
//
// The signature travels in the Idem-Signature header ([HeaderSignature]) as
//
//	kid=<key id>,t=<unix seconds>,v1=<64 lowercase hex digits>
//
// where v1 is HMAC-SHA256 under the key's secret over the concatenation of these fields, each
// preceded by its length in bytes as an 8-byte big-endian integer, so that no two different
// messages can produce the same input:
//
//	"idem-signature-v1"          a domain tag (the scheme's version)
//	t                            the timestamp exactly as written in the header
//	kid                          the key id
//	EventID                      the producer's event id
//	Tenant                       the tenant of the key
//	Type                         the event type
//	SHA-256(Payload)             32 bytes
//
// Any language with HMAC-SHA256 can produce it; [Sign] is the reference implementation.
//
// # Rotation
//
// A [Keyring] holds several keys, several per tenant if need be. To rotate, add the new key
// (producers then sign with it: [Keyring.SigningKey] picks the last one listed for a tenant)
// while the old one still verifies what is in flight; give the old key a NotAfter, and remove it
// once that has passed and the queues have drained.
package idemauth
