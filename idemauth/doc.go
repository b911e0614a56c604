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
//	kid=<key id>,t=<unix seconds>,v2=<64 lowercase hex digits>
//
// where v2 is HMAC-SHA256 under the key's secret over the concatenation of these fields, each
// preceded by its length in bytes as an 8-byte big-endian integer, so that no two different
// messages can produce the same input:
//
//	"idem-signature-v2"          a domain tag (the scheme's version)
//	"event"                      the purpose ("replay" for an operator's replay signature)
//	t                            the timestamp exactly as written in the header
//	kid                          the key id
//	EventID                      the producer's event id
//	Tenant                       the tenant of the key
//	Type                         the event type
//	OccurredAt                   RFC 3339 in UTC, truncated to the microsecond (as
//	                             PostgreSQL stores it), without trailing zeros; empty when unknown
//	SHA-256(Payload)             32 bytes
//
// Every field that decides the claim key, the tenant or the retention horizon is covered. The
// topic or subject is not: idem.Message does not carry it, and the key's tenant — not the
// route — decides where an event belongs.
//
// The former scheme v1 ("idem-signature-v1", t, kid, EventID, Tenant, Type, SHA-256(Payload);
// no purpose, no OccurredAt) is refused with [ErrVersionRetired] unless
// [VerifierConfig].AcceptV1Until allows it: the rotation window for producers not yet upgraded.
//
// # Replays
//
// A dead letter's producer signature is older than the tolerance by the time an operator replays
// it. [ReplaySigner] signs the replay with an operator [ReplayKey] in its own header,
// Idem-Replay-Signature ([HeaderReplaySignature]), purpose "replay", over the fields above plus
// the Idem-Replay-Of, Idem-Replayed-By, Idem-Replay-New-Event-Of and Idem-Replay-Event-Time
// headers (the last one dates the original event for the too_old check). A [Verifier] lists
// the replay keys it accepts in [VerifierConfig].ReplayKeys; it still requires the producer's
// signature, made with a key the keyring holds, and checks its MAC (not its age).
//
// # Rotation
//
// A [Keyring] holds several keys, several per tenant if need be. To rotate, add the new key
// (producers then sign with it: [Keyring.SigningKey] picks the last one listed for a tenant)
// while the old one still verifies what is in flight; give the old key a NotAfter, and remove it
// once that has passed and the queues have drained.
package idemauth
