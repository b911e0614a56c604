// Package idemredis is the Redis Streams transport for idem: a [Source] that reads a stream
// through a consumer group and a [Sink] that adds entries with XADD, each confirmed before the
// next and deduplicated within a window. It requires Redis 6.2 or later (XAUTOCLAIM); it is
// tested against Redis 7.
//
// The wire mapping between an [idem.Message] and a stream entry uses the field names every idem
// transport uses for its headers, so any producer (the idem relay, redis-cli, another language)
// can add events idem consumes:
//
//	EventID     ↔ Idem-Event-Id      (an entry without it is dead-lettered as invalid_payload)
//	Tenant      ↔ Idem-Tenant
//	Type        ↔ Idem-Type
//	OccurredAt  ↔ Idem-Occurred-At   (RFC 3339 with nanoseconds, UTC)
//	Payload     ↔ payload
//	Headers     ↔ every other field, one to one (Redis fields are binary-safe)
//	Attempt     ←  the group's delivery count of the entry (+ Idem-Attempt − 1 on a retry entry)
//	PublishedAt ←  the entry id's milliseconds (kept across retries in Idem-Published-At)
//
// The lease is the pending entry's idle time. A source gives what it receives the idle time
// LeaseMax minus its lease, and every consumer of the group claims entries idle LeaseMax
// (XAUTOCLAIM), so a delivery expires after its own owner's lease; Extend resets it with
// XCLAIM … JUSTID. Every settle runs as a Lua script that first checks that this consumer still
// owns the entry with the delivery count it received it with, so a worker whose lease was taken
// over cannot ack, extend or nak it (idem.ErrLeaseLost). Nak(0) releases the entry in place;
// Nak(delay) acks it and parks a copy, carrying the next attempt, in the group's delayed set
// (a sorted set scored by the server's clock), which the group's sources move to the group's
// retry stream when due: other groups of the stream never see a retry. Term acks: the consumer
// has written the message to idem's dead-letter table.
//
// docs/redis.md describes the keys, the semantics, the limits and the settings we recommend.
package idemredis
