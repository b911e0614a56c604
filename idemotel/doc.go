// Package idemotel traces and measures idem with OpenTelemetry: one trace follows an event
// from the producer's transaction through the outbox, the relay and the broker to the
// consumer's handler, and the consumer's and relay's metrics are the ones package idemprom
// exports, under the same names and labels.
//
// A Telemetry plays every role; each process adds one line for its own:
//
//	tel, err := idemotel.New(idemotel.Config{})        // the global providers, W3C propagation
//	outbox := idemotel.Outbox(tel, store)               // producer: outbox.EnqueueTx(ctx, tx, out)
//	relay, err := idemrelay.New(store, tel.Sink(sink), idemrelay.Config{Observer: tel})
//	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{…, Observer: tel, Tracer: tel})
//
// # Propagation
//
// The producer's trace context (W3C traceparent and tracestate) is stored in each outbox row's
// headers by the Outbox's EnqueueTx, which runs under an "enqueue <topic>" span. The relay's
// Sink starts a "publish <topic>" span per event as a child of that context and replaces the
// headers' trace context with its own, so the broker carries it (every idem transport maps
// Message.Headers to broker headers one to one, and back). The consumer's Tracer restores it:
// each delivery's "process <queue>" span is a child of the publish span, its handler's span a
// child of the delivery's, and the user's own database spans nest in the handler's. A batch runs
// under one "process batch <queue>" span that links every event's producer; each delivery is a
// child of the batch span with a link to its own producer.
//
// # Spans
//
// A delivery's span records what its claim and handler found as idem.result (processed,
// duplicate, key_reuse, failed), its verdict as idem.outcome (processed, duplicate, retried,
// dead_lettered, abandoned), the dead-letter reason as idem.reason (key reuse is dead-lettered
// with reason key_reuse), the error class, and the attempt; a retry is a "retry" span event
// with its delay, a failed dead-letter write a "dead_letter_write_failed" event. A redelivery
// of an event already applied is a span of its own with idem.outcome duplicate. Event ids and
// tenants appear in span attributes only when Config.RecordIdentities is set, and then in their
// bounded form (idem.BoundID).
//
// # Metrics
//
// Telemetry is the consumer's idem.Observer and the relay's idemrelay.Observer. Its instruments
// are idemprom's: idem_messages_total{consumer,queue,outcome}, idem_handling_seconds, … with the
// same attributes; ObserveStores adds idemprom's store figures (backlogs, oldest ages, pending
// dead letters). Event ids, tenants and error text never become metric attributes: each
// distinct value would be a new series.
package idemotel
