package idemotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
)

// batchKey marks the context of a batch span (StartBatch): its deliveries are the batch
// span's children and link their producers instead of being their producers' children.
type batchKey struct{}

// StartDelivery starts the "process <queue>" span of one delivery (idem.Tracer). Outside a
// batch it is a child of the trace context in the message's headers (the relay's publish
// span), or of ctx when they carry none; inside a batch it is a child of the batch span with
// a link to that context.
func (t *Telemetry) StartDelivery(ctx context.Context, consumer, queue string, msg idem.Message) idem.DeliveryTrace {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(append([]attribute.KeyValue{
		attribute.String(attrOperation, "process"),
		attribute.String(attrDestination, queue),
		attribute.String(attrConsumer, consumer),
		attribute.Int(attrAttempt, msg.Attempt),
	}, t.identity(msg)...)...)}
	parent, remote := t.Extract(ctx, msg.Headers)
	if ctx.Value(batchKey{}) != nil {
		parent = ctx
		if remote.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: remote}))
		}
	}
	_, span := t.tracer.Start(parent, "process "+queue, opts...)
	return &delivery{span: span}
}

// StartBatch starts the "process batch <queue>" span of one batch (idem.Tracer), a child of ctx
// with a link to the trace context of each message that carries one.
func (t *Telemetry) StartBatch(ctx context.Context, consumer, queue string, msgs []idem.Message) (context.Context, func()) {
	links := make([]trace.Link, 0, len(msgs))
	for _, m := range msgs {
		if _, sc := t.Extract(ctx, m.Headers); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, span := t.tracer.Start(ctx, "process batch "+queue, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...), trace.WithAttributes(
			attribute.String(attrOperation, "process"),
			attribute.String(attrDestination, queue),
			attribute.String(attrConsumer, consumer),
			attribute.Int(attrBatchCount, len(msgs)),
		))
	return context.WithValue(ctx, batchKey{}, true), func() { span.End() }
}

// StartHandler starts the handler's span, "handle <event type>", a child of the delivery's
// (idem.Tracer): the handler's own spans (its database statements) nest in it. A handler error
// sets the span's status, with its text redacted.
func (t *Telemetry) StartHandler(ctx context.Context, msg idem.Message) (context.Context, func(error)) {
	name := "handle"
	if msg.Type != "" {
		name += " " + msg.Type
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(t.identity(msg)...))
	return ctx, func(err error) { t.endSpan(span, err) }
}

// delivery is the trace of one delivery: its span, ended by the verdict's Event.
type delivery struct {
	span trace.Span
}

// Context returns ctx carrying the delivery's span.
func (d *delivery) Context(ctx context.Context) context.Context {
	return trace.ContextWithSpan(ctx, d.span)
}

// Observe records ev on the span: a failed dead-letter write as an event, the verdict as
// attributes (idem.outcome, and idem.result for what the claim and handler found), a retry
// also as an event, after which the span ends. Outcomes other than
// processed and duplicate set the span's status to error.
func (d *delivery) Observe(ev idem.Observation) {
	if ev.Outcome == idem.OutcomeDeadLetterFailed {
		d.span.AddEvent(eventDLWriteFail, trace.WithAttributes(
			attribute.String(attrErrorType, ev.Class.String()),
			attribute.String(attrReason, string(ev.Reason)),
			attribute.Int64(attrRetryDelay, ev.Delay.Milliseconds())))
		return
	}
	d.span.SetAttributes(attribute.String(attrOutcome, string(ev.Outcome)), attribute.Int(attrAttempt, ev.Attempt))
	if ev.Result != "" {
		d.span.SetAttributes(attribute.String(attrResult, string(ev.Result)))
	}
	if ev.Reason != "" {
		d.span.SetAttributes(attribute.String(attrReason, string(ev.Reason)))
	}
	switch ev.Outcome {
	case idem.OutcomeProcessed, idem.OutcomeDuplicate, idem.OutcomeIgnored:
	default:
		d.span.SetAttributes(attribute.String(attrErrorType, ev.Class.String()))
		d.span.SetStatus(codes.Error, string(ev.Outcome))
	}
	if ev.Outcome == idem.OutcomeRetried {
		d.span.AddEvent(eventRetry, trace.WithAttributes(
			attribute.Int(attrAttempt, ev.Attempt),
			attribute.String(attrErrorType, ev.Class.String()),
			attribute.Int64(attrRetryDelay, ev.Delay.Milliseconds())))
	}
	d.span.End()
}
