// Package idem turns at-least-once message delivery into exactly-once business effects.
//
// Every broker redelivers: after a timeout, a crash, a rebalance or a lost ack. idem makes the
// effect of each event happen once by claiming the event's key — (tenant, consumer@version,
// event id) — in the same database transaction as the handler's business write. A redelivery
// finds the claim and is acknowledged as a duplicate; a message that reuses a key with other
// content is refused as [ErrKeyReuse]; a failing handler rolls back its claim with its effect,
// so the next delivery applies it once.
//
// The pieces:
//
//   - [Message] and [Key] identify an event; [Fingerprint] tells a duplicate from key reuse.
//   - [Consumer] runs the path of one delivery ([Consumer.Process]) and a pool of workers over a
//     [Source] ([Consumer.Run]) with budgeted retries (package retry), lease extension and dead
//     letters.
//   - A store is the seam to the database ([idemstore.Store]): package idempg (PostgreSQL
//     through pgx v5, for production), idemsqlite (pure-Go SQLite, the embedded default) and
//     idemmysql (MySQL and MariaDB) implement it, and package storetest holds the conformance
//     suite all three pass. [NewConsumer] takes one; a handler receives its transaction.
//   - [Permanent], [Transient], [RetryAfter] and [Classify] steer retries from a handler's error.
//   - [ExpectRows] turns a business write that matched nothing into an error that rolls back.
//
// The packages:
//
//   - idem (this one): the consumer and what a handler author reads — [Consumer],
//     [ConsumerConfig], [Message], [Handler], [Result], [Source], [Sink], [Delivery], the error
//     classes.
//   - idemstore: the store seam, as riverdriver is River's — claims and dead letters
//     (Store, BatchStore, DeadLetterStore), queue table, outbox, relay leases, migrations.
//   - idemtype: the values that cross the seam (Message, Key, Outgoing, Fingerprint, Class,
//     Reason, DeadLetter); idem names each of them, so application code need not import it.
//   - idempg, idemsqlite, idemmysql: the stores; storetest: the suite every store passes.
//   - idemdlq: dead-letter operations (replay, discard, audit), used by the CLI and dashboard.
//   - idemrelay: the outbox relay; idemqueue: the queue table as a Source and Sink.
//   - idemnats, idemamqp, idemredis, idemkafka, idemsqs, idempubsub: broker adapters;
//     transporttest: the suite every adapter passes; consumertest: the consumer's suite.
//   - idemtest: the test kit (a handler in a rolled-back transaction, in-memory source/sink).
//   - idemauth, idemschema, idemredact: signatures, payload schemas, secret masking.
//   - idemhttp, idemkey, idemwebhook: HTTP delivery, Idempotency-Key, inbound webhooks.
//   - idemprom, idemotel: Prometheus metrics, OpenTelemetry traces; retry: retry policies.
//   - wire: every header name and signature format on the wire.
package idem
