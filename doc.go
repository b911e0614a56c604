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
//   - [Store] is the seam to the database: package idempg (PostgreSQL through pgx v5, for
//     production) and package idemsqlite (pure-Go SQLite, the embedded default) implement it,
//     and package storetest holds the conformance suite both pass.
//   - [Permanent], [Transient], [RetryAfter] and [Classify] steer retries from a handler's error.
//   - [ExpectRows] turns a business write that matched nothing into an error that rolls back.
package idem
