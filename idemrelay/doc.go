// Package idemrelay is the outbox relay: it publishes the rows producers enqueued in their own
// transactions (idemstore.OutboxStore.EnqueueTx) through an idem.Sink — JetStream (idemnats), the
// queue table (idemqueue), an HTTP endpoint (idemhttp) — and marks them published.
//
//	relay, err := idemrelay.New(store, sink, idemrelay.Config{})
//	…
//	err = relay.Run(ctx) // until ctx ends; releases its leases on the way out
//
// # Work sharing
//
// Rows are hashed by ordering key into a fixed number of partitions (store.OutboxPartitions()).
// Each relay holds a membership lease "relay/member/<ID>", counts the live members, and takes
// partition leases "relay/partition/<k>" up to its fair share ceil(partitions/members); it
// renews everything every LeaseTTL/3 and releases partitions above its share between rounds, so
// a new relay gets work within a few renewals, and the partitions of a relay that died are taken
// over once its leases expire (LeaseTTL). Only rows of partitions the relay holds are fetched,
// and a publish runs only while its partition's lease lasts (its context ends LeaseTTL/10 before
// the lease does, so that what a cut-off publish had already sent still lands under the lease),
// so two relays never publish one key at the same time — provided their clocks agree to well
// within LeaseTTL/10, since lease times come from the relays' own clocks.
//
// # Order and retries
//
// Within a round rows come in enqueue order. Rows with the same Outgoing.Key are published in
// that order, and a key's row goes out only after the publish of its earlier row was confirmed:
// one Publish call carries at most one row per key (rows of different keys share calls), since
// a sink may pipeline a call and store a later message after an earlier one failed. A key stops
// at its first row that is not yet due, whose publish fails or that is dead, and its later rows
// wait, while other keys go on (an empty key orders nothing: each such row stands alone).
//
// A failed publish is classified with idem.Classify (unknown errors are transient): transient
// failures are retried under Config.Retry, counted from the row's first publish attempt (so an
// outage before it spends no budget) and honouring a destination's Retry-After hint; a
// permanent failure or a spent budget marks the row dead and writes a dead letter (consumer
// "relay", reason permanent_error or retries_exhausted, source "outbox:<topic>", error
// redacted). A dead row holds its key back until an operator replays (`idem dlq replay --topic
// <topic>`) or discards its dead letter; the relay sees the decision within a PollInterval,
// marks the row published and lets the key go on. Config.SkipDeadRows gives that up: the key's
// later rows then pass the dead row at once.
//
// # At least once
//
// The relay publishes, then marks. A crash (or a lost lease, or a store error) between the two
// publishes the row again, under the same event id, after a restart or takeover. This is by
// design and it is what the rest of idem is built for: consumers deduplicate by (tenant,
// consumer, event id), JetStream drops the copy by Nats-Msg-Id within its duplicate window, and
// an HTTP destination deduplicates by the Idempotency-Key idemhttp sends.
//
// Published rows are deleted after Config.Retention, in batches of Config.GCBatch, at start
// and every Config.GCInterval.
package idemrelay
