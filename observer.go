package idem

import (
	"context"
	"time"
)

// Outcome is how a delivery was settled.
type Outcome string

// The outcomes of one delivery.
const (
	// OutcomeProcessed: the claim and the handler's effect committed.
	OutcomeProcessed Outcome = "processed"
	// OutcomeDuplicate: the key was already claimed with the same fingerprint; nothing applied.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeKeyReuse: the key was claimed with another fingerprint; nothing applied.
	OutcomeKeyReuse Outcome = "key_reuse"
	// OutcomeIgnored: the handler returned Ignore; the claim and an audit row committed, none of
	// the handler's effect did. Result.Reason and Observation.Reason carry the handler's reason.
	OutcomeIgnored Outcome = "ignored"
	// OutcomeFailed: the handler or the database failed; everything rolled back.
	OutcomeFailed Outcome = "failed"
	// OutcomeRetried: failed and handed back to the broker for a later attempt.
	OutcomeRetried Outcome = "retried"
	// OutcomeDeadLettered: failed for good and recorded in the dead-letter queue.
	OutcomeDeadLettered Outcome = "dead_lettered"
	// OutcomeAbandoned: left to the broker without a verdict (shutdown, lost lease, pause).
	OutcomeAbandoned Outcome = "abandoned"
	// OutcomeDeadLetterFailed is not a verdict: one attempt to write a dead letter failed, the
	// delivery is kept and the write retried (or, after ConsumerConfig.Failure.DeadLetterFailuresToPause
	// failures in a row, the delivery is given back and the consumer pauses). An alert on it
	// catches a dead-letter queue that cannot be written.
	OutcomeDeadLetterFailed Outcome = "dead_letter_failed"
)

// Observation describes one settled delivery (or one failed dead-letter write), for metrics. It
// carries no payload, and its Tenant and EventID are in their bounded form (BoundID).
type Observation struct {
	Consumer string
	// Owner is the consumer's ConsumerConfig.Owner ("" when none): a low-cardinality label
	// alerts route on.
	Owner   string
	Queue   string
	Tenant  string
	EventID string
	Attempt int
	Outcome Outcome
	// Result is what the claim and the handler found before the verdict (Result.Outcome of
	// Process): processed, duplicate, key_reuse, ignored or failed. Outcome is the verdict on
	// the delivery that followed (a failure is retried, dead-lettered or abandoned).
	Result Outcome
	// Class is the classification of the failure (Result.Class), empty on success.
	Class Class
	// Reason is set when Outcome is OutcomeDeadLettered or OutcomeDeadLetterFailed, and holds
	// the handler's reason when Outcome is OutcomeIgnored.
	Reason Reason
	// Delay is the retry delay when Outcome is OutcomeRetried.
	Delay    time.Duration
	Duration time.Duration
	// Recovered holds, for a processed replay of dead letters, the time from each dead letter's
	// first failure to this recovery.
	Recovered []time.Duration
}

// Observer receives events from a consumer; package idemprom turns them into Prometheus
// metrics. Implementations must be safe for concurrent use and must not block.
type Observer interface {
	Observe(Observation)
	// Paused is called when the consumer pauses itself (a handler bug, or dead letters that
	// cannot be written).
	Paused(consumer string)
}

// OwnerObserver is an Observer that hears, when Run starts, the owner of the consumer
// (ConsumerConfig.Owner, "" when none), so that its series carry the owner before any delivery
// settles: a pause may come first. Run discovers it by type assertion.
type OwnerObserver interface {
	ConsumerOwner(consumer, owner string)
}

// MaintenanceObserver is an Observer that also hears of Run's self-maintenance: it is called
// after each claim garbage collection with how many claims were deleted and the error, if the
// collection failed. Run discovers it by type assertion, so existing Observers need not change.
type MaintenanceObserver interface {
	ClaimsCollected(consumer string, deleted int, err error)
}

// Tracer traces deliveries for a tracing system (package idemotel implements it with
// OpenTelemetry) without the core importing one: a Tracer keeps its spans in the contexts it
// returns, and reads the producer's trace context from the message's Headers, which every
// transport carries. Set it as ConsumerConfig.Observe.Tracer. Implementations must be safe for
// concurrent use and must not block.
type Tracer interface {
	// StartDelivery is called when Run starts handling one delivery, before its claim. ctx is
	// Run's context, or in batch mode the batch's (from StartBatch).
	StartDelivery(ctx context.Context, consumer, queue string, msg Message) DeliveryTrace
	// StartBatch is called once per batch, before its deliveries' StartDelivery; the batch's
	// transaction runs under the returned context, and end is called once every delivery of
	// the batch has settled.
	StartBatch(ctx context.Context, consumer, queue string, msgs []Message) (bctx context.Context, end func())
	// StartHandler is called just before the handler runs, with the context the handler would
	// get; the handler gets the returned one instead (so the handler's own spans nest under
	// it), and end is called with what the handler returned (a panic as an error).
	StartHandler(ctx context.Context, msg Message) (hctx context.Context, end func(error))
}

// DeliveryTrace is the trace of one delivery, from Tracer.StartDelivery.
type DeliveryTrace interface {
	// Context returns ctx carrying the delivery's trace. Run processes and settles the delivery
	// under it; in a batch, each handler's context (derived from the shared transaction's) gets
	// it too, so every handler nests under its own delivery.
	Context(ctx context.Context) context.Context
	// Observe is called with each Observation of the delivery, as Observer.Observe is: failed
	// dead-letter writes (OutcomeDeadLetterFailed) come first, the verdict last; the trace ends
	// with the verdict.
	Observe(Observation)
}

// deliveryTraceKey keys the DeliveryTrace in the context Run settles a delivery under.
type deliveryTraceKey struct{}

// withDeliveryTrace returns ctx carrying dt (ctx itself when dt is nil), so that every Observation
// of the delivery reaches it however deep the settling goes.
func withDeliveryTrace(ctx context.Context, dt DeliveryTrace) context.Context {
	if dt == nil {
		return ctx
	}
	return dt.Context(context.WithValue(ctx, deliveryTraceKey{}, dt))
}

// deliveryTraceFrom returns the DeliveryTrace ctx carries, or nil.
func deliveryTraceFrom(ctx context.Context) DeliveryTrace {
	dt, _ := ctx.Value(deliveryTraceKey{}).(DeliveryTrace)
	return dt
}
