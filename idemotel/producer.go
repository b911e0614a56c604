package idemotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// Span and attribute names. The messaging.* ones follow OpenTelemetry's messaging semantic
// conventions; the idem.* ones are idem's own.
const (
	attrDestination  = "messaging.destination.name"
	attrOperation    = "messaging.operation.type"
	attrConsumer     = "messaging.consumer.group.name"
	attrBatchCount   = "messaging.batch.message_count"
	attrMessageID    = "messaging.message.id"
	attrTenant       = "idem.tenant"
	attrEventType    = "idem.event_type"
	attrAttempt      = "idem.attempt"
	attrOutcome      = "idem.outcome"
	attrResult       = "idem.result"
	attrReason       = "idem.reason"
	attrErrorType    = "error.type"
	attrRetryDelay   = "idem.retry.delay_ms"
	eventRetry       = "retry"
	eventDLWriteFail = "dead_letter_write_failed"
)

// identity returns the attributes naming one event: its type always, its id and tenant only
// when Config.RecordIdentities is set.
func (t *Telemetry) identity(m idem.Message) []attribute.KeyValue {
	var kv []attribute.KeyValue
	if m.Type != "" {
		kv = append(kv, attribute.String(attrEventType, m.Type))
	}
	if t.cfg.RecordIdentities {
		kv = append(kv, attribute.String(attrMessageID, idem.BoundID(m.EventID)))
		if m.Tenant != "" {
			kv = append(kv, attribute.String(attrTenant, idem.BoundID(m.Tenant)))
		}
	}
	return kv
}

// endSpan ends span with err as its status (redacted).
func (t *Telemetry) endSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, t.redactor.Text(err.Error()))
	}
	span.End()
}

// OutboxStore is an idemstore.OutboxStore whose EnqueueTx traces the enqueue and stores the trace
// context in each event's headers. Every other method is the wrapped store's.
type OutboxStore[TTx any] struct {
	idemstore.OutboxStore[TTx]
	t *Telemetry
}

// Outbox wraps a producer's outbox store (idempg, idemsqlite, idemmysql) so that each event it
// enqueues carries the producer's trace. A function rather than a method because Go methods
// cannot take type parameters.
func Outbox[TTx any](t *Telemetry, store idemstore.OutboxStore[TTx]) *OutboxStore[TTx] {
	return &OutboxStore[TTx]{OutboxStore: store, t: t}
}

// EnqueueTx runs the store's EnqueueTx under an "enqueue <topic>" span, a child of ctx's (the
// producer's transaction), after writing that span's context into a copy of each event's
// headers. The caller's Outgoing values and header maps are not changed.
func (o *OutboxStore[TTx]) EnqueueTx(ctx context.Context, tx TTx, msgs ...idem.Outgoing) (err error) {
	topic := ""
	if len(msgs) > 0 {
		topic = msgs[0].Topic
	}
	attrs := []attribute.KeyValue{attribute.String(attrOperation, "create"), attribute.String(attrDestination, topic)}
	if len(msgs) == 1 {
		attrs = append(attrs, o.t.identity(msgs[0].Message())...)
	} else {
		attrs = append(attrs, attribute.Int(attrBatchCount, len(msgs)))
	}
	ctx, span := o.t.tracer.Start(ctx, "enqueue "+topic, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	defer func() { o.t.endSpan(span, err) }()
	out := make([]idem.Outgoing, len(msgs))
	for i, m := range msgs {
		m.Headers = o.t.Inject(ctx, m.Headers)
		out[i] = m
	}
	return o.OutboxStore.EnqueueTx(ctx, tx, out...)
}

// sink is an idem.Sink that traces each publish; see Telemetry.Sink.
type sink struct {
	next idem.Sink
	t    *Telemetry
}

// Sink wraps the relay's sink (or any sink) so that each event it publishes gets a "publish
// <topic>" span, a child of the trace context in the event's headers (the producer's, stored
// by Outbox), and the broker carries that span's context to the consumer in its place. A span
// in ctx (a caller's own) becomes a link. The messages' header maps are not changed.
func (t *Telemetry) Sink(next idem.Sink) idem.Sink { return &sink{next: next, t: t} }

// Publish publishes msgs through the wrapped sink, one span per message, ending each with the
// sink's error.
func (s *sink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	own := trace.SpanContextFromContext(ctx)
	out := make([]idem.Message, len(msgs))
	spans := make([]trace.Span, len(msgs))
	for i, m := range msgs {
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(append([]attribute.KeyValue{attribute.String(attrOperation, "send"), attribute.String(attrDestination, topic)}, s.t.identity(m)...)...)}
		parent, remote := s.t.Extract(ctx, m.Headers)
		if remote.IsValid() && own.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: own}))
		}
		pctx, span := s.t.tracer.Start(parent, "publish "+topic, opts...)
		m.Headers = s.t.Inject(pctx, m.Headers)
		out[i], spans[i] = m, span
	}
	err := s.next.Publish(ctx, topic, out...)
	for _, span := range spans {
		s.t.endSpan(span, err)
	}
	return err
}

// Close closes the wrapped sink.
func (s *sink) Close() error { return s.next.Close() }
