package idemotel

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem"
)

// instruments are idemprom's metrics as OpenTelemetry instruments: the same names (the
// namespace, "_", then idemprom's name, so a Prometheus exporter adds no suffix of its own)
// and the same attributes.
type instruments struct {
	messages, errors, retries, duplicates, keyReuse, deadLetters, dlFailures metric.Int64Counter
	ignored                                                                  metric.Int64Counter
	pauses, published, publishFailures                                       metric.Int64Counter
	handling, recovery, publishLag                                           metric.Float64Histogram
	paused                                                                   metric.Int64Gauge

	// owners maps a consumer to its owner (idem.Observation.Owner, or ConsumerOwner), for Paused and
	// Resumed, which name only the consumer.
	owners sync.Map
	// seen holds the consumer/owner/queue triples whose counters were created at zero, as idemprom
	// does, so that a rate sees the first retry or dead letter.
	seen sync.Map
}

func newInstruments(m metric.Meter, cfg Config) (*instruments, error) {
	ns := cfg.Namespace + "_"
	var errs []error
	counter := func(name, help string) metric.Int64Counter {
		c, err := m.Int64Counter(ns+name, metric.WithDescription(help))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, help string, buckets []float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(ns+name, metric.WithDescription(help), metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	in := &instruments{
		messages:    counter("messages_total", "Deliveries settled by a consumer, by outcome."),
		errors:      counter("errors_total", "Deliveries that did not end processed or duplicate, by error class."),
		retries:     counter("retries_total", "Deliveries handed back to the broker for another attempt."),
		duplicates:  counter("duplicates_ignored_total", "Redeliveries recognised by their claim and acknowledged without applying anything."),
		keyReuse:    counter("key_reuse_total", "Deliveries whose event id was already claimed with different content."),
		deadLetters: counter("dead_letters_total", "Deliveries recorded in the dead-letter queue, by reason."),
		ignored: counter("ignored_total",
			"Deliveries a handler ignored (idem.Ignore: the target is gone for good), acknowledged without effect, by the handler's reason."),
		dlFailures: counter("dead_letter_write_failures_total",
			"Failed attempts to write a dead letter; the delivery is kept and the write retried, and the consumer pauses after failures in a row. Alert on any increase."),
		pauses:          counter("consumer_pauses_total", "Times a consumer paused itself (a handler bug, or dead letters that cannot be written)."),
		published:       counter("outbox_published_total", "Outbox events published and marked published by a relay."),
		publishFailures: counter("outbox_publish_failures_total", "Failed outbox publishes, by error class and whether the event was dead-lettered."),
		handling:        histogram("handling_seconds", "Time from the start of handling to the delivery's verdict, by outcome.", cfg.Buckets),
		recovery:        histogram("recovery_seconds", "Time from a dead letter's first failure to the processing of its replay.", cfg.RecoveryBuckets),
		publishLag:      histogram("outbox_publish_lag_seconds", "Per published batch, how long its oldest event waited in the outbox.", cfg.LagBuckets),
	}
	paused, err := m.Int64Gauge(ns+"consumer_paused",
		metric.WithDescription("1 when the consumer paused itself (a handler bug, or dead letters that cannot be written), else 0."))
	in.paused = paused
	if err := errors.Join(append(errs, err)...); err != nil {
		return nil, errors.Join(errors.New("idemotel: create instruments"), err)
	}
	return in, nil
}

// Attribute keys of the metrics: idemprom's label names.
const (
	labelConsumer = "consumer"
	labelOwner    = "owner"
	labelQueue    = "queue"
	labelOutcome  = "outcome"
	labelClass    = "class"
	labelReason   = "reason"
	labelTopic    = "topic"
	labelDead     = "dead"
)

// init creates a consumer/owner/queue triple's counters at zero the first time it is seen.
func (in *instruments) init(ctx context.Context, consumer, owner, queue string) {
	in.owners.Store(consumer, owner)
	key := consumer + "\xff" + owner + "\xff" + queue
	if _, loaded := in.seen.LoadOrStore(key, struct{}{}); loaded {
		return
	}
	cq := []attribute.KeyValue{attribute.String(labelConsumer, consumer), attribute.String(labelOwner, owner), attribute.String(labelQueue, queue)}
	with := func(kv ...attribute.KeyValue) metric.AddOption {
		return metric.WithAttributes(append(kv, cq...)...)
	}
	for _, o := range []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeDuplicate, idem.OutcomeKeyReuse,
		idem.OutcomeFailed, idem.OutcomeRetried, idem.OutcomeDeadLettered, idem.OutcomeAbandoned, idem.OutcomeIgnored} {
		in.messages.Add(ctx, 0, with(attribute.String(labelOutcome, string(o))))
	}
	for _, c := range []idem.Class{idem.ClassUnknown, idem.ClassTransient, idem.ClassPermanent} {
		in.errors.Add(ctx, 0, with(attribute.String(labelClass, c.String())))
	}
	for _, r := range idem.Reasons() {
		in.deadLetters.Add(ctx, 0, with(attribute.String(labelReason, string(r))))
	}
	for _, c := range []metric.Int64Counter{in.retries, in.duplicates, in.keyReuse, in.dlFailures} {
		c.Add(ctx, 0, with())
	}
	in.pauses.Add(ctx, 0, metric.WithAttributes(attribute.String(labelConsumer, consumer), attribute.String(labelOwner, owner)))
}

// consumerAttrs are the attributes of a consumer's pause gauge and counter: its name and owner.
func (in *instruments) consumerAttrs(consumer string) metric.MeasurementOption {
	owner := ""
	if o, ok := in.owners.Load(consumer); ok {
		owner = o.(string)
	}
	return metric.WithAttributes(attribute.String(labelConsumer, consumer), attribute.String(labelOwner, owner))
}

// ConsumerOwner records consumer's owner (idem.OwnerObserver; Run calls it when it starts), so
// that a pause before any settled delivery carries the owner attribute.
func (t *Telemetry) ConsumerOwner(consumer, owner string) {
	t.metrics.owners.Store(consumer, owner)
}

// Observe records one settled delivery as idemprom's Metrics.Observe does (idem.Observer).
// Only the consumer, queue, outcome, error class and reason become attributes: the event id
// and tenant never do.
func (t *Telemetry) Observe(ev idem.Observation) {
	in, ctx := t.metrics, context.Background()
	in.init(ctx, ev.Consumer, ev.Owner, ev.Queue)
	cq := []attribute.KeyValue{attribute.String(labelConsumer, ev.Consumer), attribute.String(labelOwner, ev.Owner), attribute.String(labelQueue, ev.Queue)}
	with := func(kv ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributes(append(kv, cq...)...)
	}
	if ev.Outcome == idem.OutcomeDeadLetterFailed {
		in.dlFailures.Add(ctx, 1, with())
		return
	}
	outcome := attribute.String(labelOutcome, string(ev.Outcome))
	in.messages.Add(ctx, 1, with(outcome))
	in.handling.Record(ctx, seconds(ev.Duration), with(outcome))
	if ev.Outcome != idem.OutcomeProcessed && ev.Outcome != idem.OutcomeDuplicate && ev.Outcome != idem.OutcomeIgnored {
		in.errors.Add(ctx, 1, with(attribute.String(labelClass, ev.Class.String())))
	}
	switch ev.Outcome {
	case idem.OutcomeRetried:
		in.retries.Add(ctx, 1, with())
	case idem.OutcomeDuplicate:
		in.duplicates.Add(ctx, 1, with())
	case idem.OutcomeIgnored:
		in.ignored.Add(ctx, 1, with(attribute.String(labelReason, string(ev.Reason))))
	case idem.OutcomeKeyReuse:
		in.keyReuse.Add(ctx, 1, with())
	case idem.OutcomeDeadLettered:
		reason := "unknown"
		if ev.Reason.Valid() {
			reason = string(ev.Reason)
		}
		in.deadLetters.Add(ctx, 1, with(attribute.String(labelReason, reason)))
		if ev.Reason == idem.ReasonKeyReuse {
			in.keyReuse.Add(ctx, 1, with())
		}
	}
	for _, d := range ev.Recovered {
		in.recovery.Record(ctx, seconds(d), metric.WithAttributes(attribute.String(labelConsumer, ev.Consumer), attribute.String(labelOwner, ev.Owner)))
	}
}

// Paused records that consumer paused itself (idem.Observer): idem_consumer_paused goes to 1
// and idem_consumer_pauses_total counts the pause.
func (t *Telemetry) Paused(consumer string) {
	ctx, c := context.Background(), t.metrics.consumerAttrs(consumer)
	t.metrics.paused.Record(ctx, 1, c)
	t.metrics.pauses.Add(ctx, 1, c)
}

// Resumed sets consumer's idem_consumer_paused back to 0. idem does not call it: the
// application does when it runs a paused consumer again, so an alert on the gauge clears.
func (t *Telemetry) Resumed(consumer string) {
	t.metrics.paused.Record(context.Background(), 0, t.metrics.consumerAttrs(consumer))
}

// Published records that a relay published n events of topic, lag being how long the oldest
// of them waited in the outbox (idemrelay.Observer).
func (t *Telemetry) Published(topic string, n int, lag time.Duration) {
	if n <= 0 {
		return
	}
	ctx, tp := context.Background(), metric.WithAttributes(attribute.String(labelTopic, topic))
	t.metrics.published.Add(ctx, int64(n), tp)
	t.metrics.publishLag.Record(ctx, seconds(lag), tp)
}

// PublishFailed records one failed publish of an event of topic (idemrelay.Observer).
func (t *Telemetry) PublishFailed(topic string, class idem.Class, dead bool) {
	t.metrics.publishFailures.Add(context.Background(), 1, metric.WithAttributes(
		attribute.String(labelTopic, topic), attribute.String(labelClass, class.String()),
		attribute.String(labelDead, strconv.FormatBool(dead))))
}

// seconds converts d for a histogram, clamping the negative values clock skew can produce.
func seconds(d time.Duration) float64 {
	if d < 0 {
		return 0
	}
	return d.Seconds()
}
