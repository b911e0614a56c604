// Package idempubsub is the Google Cloud Pub/Sub transport for idem: a [Source] that pulls from a
// subscription and a [Sink] that publishes with ordering keys, waiting for every result. It uses
// cloud.google.com/go/pubsub/v2 and is tested against its in-process fake, pstest.
//
// The wire mapping uses the attribute names every idem transport uses for its headers:
//
//	EventID     ↔ Idem-Event-Id      (a message without it is dead-lettered as invalid_payload)
//	Tenant      ↔ Idem-Tenant
//	Type        ↔ Idem-Type
//	OccurredAt  ↔ Idem-Occurred-At   (RFC 3339 with nanoseconds, UTC)
//	Payload     ↔ data
//	Headers     ↔ every other attribute, one to one
//	Attempt     ←  DeliveryAttempt with a dead-letter policy, else the Source's own count
//	PublishedAt ←  the publish time
//
// The Source uses synchronous Pull, not streaming pull: Receive(max) maps to one Pull of at most
// max messages, a cancelled Receive gives back what it pulled, and no background stream holds
// or auto-extends messages behind the consumer's back. A delivery's lease is its ack deadline:
// Extend and Nak(delay) are ModifyAckDeadline, Nak(0) is ModifyAckDeadline(0), Ack and Term
// acknowledge (Term after the consumer wrote idem's dead letter). Without exactly-once delivery
// Pub/Sub accepts an ack whose deadline passed without acting on it, so settles are not fenced.
//
// docs/pubsub.md describes delivery, the ack deadline, retries, ordering and the limits.
package idempubsub
