// Package oteltrace holds idemotel's end-to-end checks: one trace from a producer's
// transaction through the SQLite outbox, the relay and a broker (NATS JetStream, or the queue
// table) to the consumer's handler, per event and batched. They live in cmd/idem's module,
// which may require every adapter, so that idemotel's own module requires only OpenTelemetry.
package oteltrace
