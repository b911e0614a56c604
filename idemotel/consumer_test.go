package idemotel_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
)

// TestDeliverySpan drives the Tracer as Run does and checks what each verdict leaves on the
// delivery's span.
func TestDeliverySpan(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		events     []idem.Observation
		outcome    string
		result     string
		reason     string
		status     codes.Code
		spanEvents []string
	}{
		{"processed", []idem.Observation{{Outcome: idem.OutcomeProcessed, Result: idem.OutcomeProcessed}}, "processed", "processed", "", codes.Unset, nil},
		{"duplicate", []idem.Observation{{Outcome: idem.OutcomeDuplicate, Result: idem.OutcomeDuplicate}}, "duplicate", "duplicate", "", codes.Unset, nil},
		{"retried", []idem.Observation{{Outcome: idem.OutcomeRetried, Result: idem.OutcomeFailed, Class: idem.ClassTransient, Delay: 2 * time.Second}},
			"retried", "failed", "", codes.Error, []string{"retry"}},
		{"key reuse", []idem.Observation{{Outcome: idem.OutcomeDeadLettered, Result: idem.OutcomeKeyReuse, Class: idem.ClassPermanent, Reason: idem.ReasonKeyReuse}},
			"dead_lettered", "key_reuse", "key_reuse", codes.Error, nil},
		{"dead letter written at the second try", []idem.Observation{
			{Outcome: idem.OutcomeDeadLetterFailed, Result: idem.OutcomeFailed, Class: idem.ClassTransient, Reason: idem.ReasonPermanentError, Delay: time.Second},
			{Outcome: idem.OutcomeDeadLettered, Result: idem.OutcomeFailed, Class: idem.ClassPermanent, Reason: idem.ReasonPermanentError},
		}, "dead_lettered", "failed", "permanent_error", codes.Error, []string{"dead_letter_write_failed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemotel.Config{})
			msg := idem.Message{EventID: "evt-1", Tenant: "acme", Type: "payment.captured", Attempt: 2,
				Headers: b.tel.Inject(startedCtx(t, b), nil)}
			dt := b.tel.StartDelivery(context.Background(), "ledger@v1", "payments", msg)
			hctx, end := b.tel.StartHandler(dt.Context(context.Background()), msg)
			end(errors.New("no rows"))
			require.Equal(t, trace.SpanFromContext(hctx).SpanContext().SpanID(), b.span(t, "handle payment.captured").SpanContext().SpanID())
			for i, ev := range tt.events {
				ev.Consumer, ev.Queue, ev.Attempt = "ledger@v1", "payments", 2
				dt.Observe(ev)
				if i < len(tt.events)-1 {
					require.Empty(t, ended(b, "process payments"), "the span ended before the verdict")
				}
			}
			process := b.span(t, "process payments")
			producer := b.span(t, "producer")
			require.Equal(t, producer.SpanContext().SpanID(), process.Parent().SpanID())
			require.Equal(t, process.SpanContext().SpanID(), b.span(t, "handle payment.captured").Parent().SpanID())
			require.Equal(t, codes.Error, b.span(t, "handle payment.captured").Status().Code)
			require.Equal(t, tt.outcome, attr(process, "idem.outcome"))
			require.Equal(t, tt.result, attr(process, "idem.result"))
			require.Equal(t, tt.reason, attr(process, "idem.reason"))
			require.Equal(t, "2", attr(process, "idem.attempt"))
			require.Equal(t, tt.status, process.Status().Code)
			var names []string
			for _, e := range process.Events() {
				names = append(names, e.Name)
			}
			require.Equal(t, tt.spanEvents, names)
			require.Empty(t, attr(process, "messaging.message.id"))
			require.Empty(t, attr(process, "idem.tenant"))
		})
	}
}

func TestDeliverySpanIdentitiesAreOptIn(t *testing.T) {
	t.Parallel()
	b := setup(t, idemotel.Config{RecordIdentities: true})
	long := "evt-" + strings.Repeat("x", 300)
	dt := b.tel.StartDelivery(context.Background(), "ledger@v1", "payments", idem.Message{EventID: long, Tenant: "acme"})
	dt.Observe(idem.Observation{Outcome: idem.OutcomeProcessed})
	process := b.span(t, "process payments")
	require.Equal(t, idem.BoundID(long), attr(process, "messaging.message.id"))
	require.Equal(t, "acme", attr(process, "idem.tenant"))
	require.NotEqual(t, long, idem.BoundID(long), "the id was not long enough to be bounded")
}

// TestBatchSpanLinksProducers: the batch span links each message's producer; each delivery is
// the batch span's child and links its own producer.
func TestBatchSpanLinksProducers(t *testing.T) {
	t.Parallel()
	b := setup(t, idemotel.Config{})
	var msgs []idem.Message
	var producers []trace.SpanContext
	for range 2 {
		ctx, span := b.tracer.Start(context.Background(), "producer")
		msgs = append(msgs, idem.Message{EventID: "e", Headers: b.tel.Inject(ctx, nil)})
		producers = append(producers, span.SpanContext())
		span.End()
	}
	msgs = append(msgs, idem.Message{EventID: "untraced"})
	bctx, endBatch := b.tel.StartBatch(context.Background(), "ledger@v1", "payments", msgs)
	for _, m := range msgs {
		b.tel.StartDelivery(bctx, "ledger@v1", "payments", m).Observe(idem.Observation{Outcome: idem.OutcomeProcessed})
	}
	endBatch()
	batch := b.span(t, "process batch payments")
	require.Equal(t, "3", attr(batch, "messaging.batch.message_count"))
	require.Len(t, batch.Links(), 2)
	deliveries := ended(b, "process payments")
	require.Len(t, deliveries, 3)
	for i, d := range deliveries {
		require.Equal(t, batch.SpanContext().SpanID(), d.Parent().SpanID())
		if i < 2 {
			require.Len(t, d.Links(), 1)
			require.Equal(t, producers[i].SpanID(), d.Links()[0].SpanContext.SpanID())
			require.Equal(t, producers[i].SpanID(), batch.Links()[i].SpanContext.SpanID())
		} else {
			require.Empty(t, d.Links())
		}
	}
}
