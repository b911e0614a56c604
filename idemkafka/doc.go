// Package idemkafka is the Kafka transport for idem, built on franz-go: a [Source] over a
// consumer group and a [Sink] over an idempotent producer that keys each record (see [KeyOf]) so
// that a key's records share a partition and keep their order. docs/kafka.md describes
// delivery, order, retries, rebalances and limits.
//
// The wire mapping between an [idem.Message] and a Kafka record is fixed, so that any producer
// can publish events idem consumes:
//
//	EventID     ↔ Idem-Event-Id      (without it: SourceConfig.EventIDOf, else "" and a dead letter)
//	Tenant      ↔ Idem-Tenant
//	Type        ↔ Idem-Type
//	OccurredAt  ↔ Idem-Occurred-At   (RFC 3339 with nanoseconds, UTC)
//	Payload     ↔ record value
//	Headers     ↔ every other header (a repeated header decodes to its first value)
//	Attempt     ←  Idem-Attempt on a retry copy (1 without it), plus the leases run out in-process
//	PublishedAt ←  record timestamp, or Idem-Published-At on a retry copy (the original's)
//
// Kafka acknowledges per partition, not per record: a consumer group commits the offset up to
// which a partition is done. The Source keeps each partition's fetched records in order and
// commits only the contiguous prefix of settled records (acked, terminated after a dead letter,
// or nak'ed into a retry topic), so a crash redelivers every unsettled record and never skips
// one. Nak with a delay produces a copy, with the same event id and the next attempt, to the
// group's retry topic of the delay's tier ([RetryTopic]) and settles the original only once
// Kafka stored the copy. There is no broker-side lease: the lease is how long the Source holds a record for
// one handler before handing it out again, and a rebalance is what redelivers a record to
// another worker. A worker that lost its partition can neither settle nor commit it any more
// ([ErrRevoked]); the consumer's claim makes the new owner's redelivery harmless.
//
// The package is tested against franz-go's in-process kfake cluster with the shared conformance
// suite in package transporttest.
package idemkafka
