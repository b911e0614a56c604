// Package idemamqp is the RabbitMQ (AMQP 0-9-1) transport for idem: a [Source] that consumes a
// work queue with manual acknowledgements and a prefetch, and a [Sink] that publishes with
// publisher confirms and mandatory routing, so that Publish returns only once the broker holds
// every message and an unroutable one is an error rather than a silent drop.
//
// The wire mapping between an [idem.Message] and an AMQP message is the one every idem
// transport uses, so any producer (the idem relay, another language, rabbitmqadmin) can publish
// events idem consumes:
//
//	EventID     ↔ message_id         (or an Idem-Event-Id header from a producer that cannot set it)
//	Tenant      ↔ Idem-Tenant
//	Type        ↔ Idem-Type          (and the type property)
//	OccurredAt  ↔ Idem-Occurred-At   (RFC 3339 with nanoseconds, UTC)
//	Payload     ↔ body
//	Headers     ↔ every other header, one to one (non-text values as fmt.Sprint prints them)
//	Attempt     ←  Idem-Attempt (1 when absent) + x-delivery-count, or + 1 when redelivered
//	PublishedAt ←  timestamp property (set by the Sink, to the second)
//
// RabbitMQ has no per-message visibility timeout and no delayed redelivery, so the source keeps
// a lease per delivery itself (Extend restarts it; nothing goes to the broker) and refuses to
// outlive the broker's consumer_timeout, and Nak(delay) republishes the message, with the next
// Idem-Attempt, to a delay queue whose message TTL dead-letters it back to the work queue: one
// queue per delay tier, since RabbitMQ expires messages only at the head of a queue, with the
// delay rounded up to the next tier. Term acks: the consumer has written the message to idem's
// dead-letter table. docs/rabbitmq.md describes the semantics, the limits and the settings we
// recommend.
package idemamqp
