package idemotel_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemtest"
)

// bundle is one test's Telemetry over an in-memory span recorder.
type bundle struct {
	tel      *idemotel.Telemetry
	recorder *tracetest.SpanRecorder
	tracer   trace.Tracer
}

func setup(t *testing.T, cfg idemotel.Config) bundle {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg.TracerProvider = tp
	tel, err := idemotel.New(cfg)
	require.NoError(t, err)
	return bundle{tel: tel, recorder: rec, tracer: tp.Tracer("test")}
}

// span returns the one ended span named name.
func (b bundle) span(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range b.recorder.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "spans named %q", name)
	return found[0]
}

// attr returns the value of attribute key on s ("" when absent).
func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// fakeOutbox is an idemstore.OutboxStore whose EnqueueTx records what it got; its other methods are
// not used by these tests (the nil embedded interface would panic).
type fakeOutbox struct {
	idemstore.OutboxStore[int]
	got []idem.Outgoing
	err error
}

func (f *fakeOutbox) EnqueueTx(_ context.Context, _ int, msgs ...idem.Outgoing) error {
	f.got = append(f.got, msgs...)
	return f.err
}

func TestInjectExtract(t *testing.T) {
	t.Parallel()
	b := setup(t, idemotel.Config{})
	ctx, span := b.tracer.Start(context.Background(), "producer")
	defer span.End()

	in := map[string]string{"x-custom": "1"}
	out := b.tel.Inject(ctx, in)
	require.Equal(t, map[string]string{"x-custom": "1"}, in, "Inject changed the caller's map")
	require.Contains(t, out, "traceparent")
	require.Equal(t, "1", out["x-custom"])

	tests := []struct {
		name    string
		headers map[string]string
		want    bool
	}{
		{"as injected", out, true},
		{"canonicalised by a broker", map[string]string{"Traceparent": out["traceparent"]}, true},
		{"none", map[string]string{"x-custom": "1"}, false},
		{"malformed", map[string]string{"traceparent": "00-zz-zz-01"}, false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// A span in ctx must not pass for the headers' context.
			base, own := b.tracer.Start(context.Background(), "own")
			defer own.End()
			got, sc := b.tel.Extract(base, tt.headers)
			require.Equal(t, tt.want, sc.IsValid())
			if !tt.want {
				require.Equal(t, base, got, "ctx changed without a trace context in the headers")
				return
			}
			require.Equal(t, span.SpanContext().TraceID(), sc.TraceID())
			require.Equal(t, span.SpanContext().SpanID(), sc.SpanID())
			require.True(t, sc.IsRemote())
		})
	}
}

func TestInjectWithoutSpanKeepsNil(t *testing.T) {
	t.Parallel()
	b := setup(t, idemotel.Config{})
	require.Nil(t, b.tel.Inject(context.Background(), nil))
}

// TestOutboxAndSink follows one event from the producer's span through the outbox's enqueue
// span to the sink's publish span, and checks what the broker would carry.
func TestOutboxAndSink(t *testing.T) {
	t.Parallel()
	for _, identities := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "RecordIdentities"}[identities], func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemotel.Config{RecordIdentities: identities})
			store := &fakeOutbox{}
			outbox := idemotel.Outbox[int](b.tel, store)
			ctx, producer := b.tracer.Start(context.Background(), "producer tx")
			out := idem.Outgoing{EventID: "evt-1", Tenant: "acme", Topic: "payments", Type: "payment.captured",
				Payload: []byte(`{}`), Headers: map[string]string{"x-custom": "1"}}
			require.NoError(t, outbox.EnqueueTx(ctx, 7, out))
			producer.End()
			require.Equal(t, map[string]string{"x-custom": "1"}, out.Headers, "EnqueueTx changed the caller's headers")
			require.Len(t, store.got, 1)

			enqueue := b.span(t, "enqueue payments")
			require.Equal(t, producer.SpanContext().SpanID(), enqueue.Parent().SpanID())
			require.Equal(t, trace.SpanKindProducer, enqueue.SpanKind())

			// The relay publishes the stored row (in another process: no span in ctx).
			sink := idemtest.NewSink()
			require.NoError(t, b.tel.Sink(sink).Publish(context.Background(), "payments", store.got[0].Message()))
			publish := b.span(t, "publish payments")
			require.Equal(t, enqueue.SpanContext().SpanID(), publish.Parent().SpanID())
			require.Equal(t, producer.SpanContext().TraceID(), publish.SpanContext().TraceID())
			require.Equal(t, "payment.captured", attr(publish, "idem.event_type"))
			if identities {
				require.Equal(t, "evt-1", attr(publish, "messaging.message.id"))
				require.Equal(t, "acme", attr(publish, "idem.tenant"))
			} else {
				require.Empty(t, attr(publish, "messaging.message.id"))
				require.Empty(t, attr(publish, "idem.tenant"))
			}

			// The broker carries the publish span's context; the stored row keeps the enqueue's.
			sent := sink.Topic("payments")
			require.Len(t, sent, 1)
			_, sc := b.tel.Extract(context.Background(), sent[0].Headers)
			require.Equal(t, publish.SpanContext().SpanID(), sc.SpanID())
			_, stored := b.tel.Extract(context.Background(), store.got[0].Headers)
			require.Equal(t, enqueue.SpanContext().SpanID(), stored.SpanID())
			require.Equal(t, "1", sent[0].Headers["x-custom"])
		})
	}
}

func TestSinkAndOutboxRecordErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, idemotel.Config{})
	boom := errors.New("connection refused password=hunter2")
	outbox := idemotel.Outbox[int](b.tel, &fakeOutbox{err: boom})
	require.ErrorIs(t, outbox.EnqueueTx(context.Background(), 1,
		idem.Outgoing{EventID: "a", Topic: "t"}, idem.Outgoing{EventID: "b", Topic: "t"}), boom)
	enqueue := b.span(t, "enqueue t")
	require.Equal(t, "Error", enqueue.Status().Code.String())
	require.NotContains(t, enqueue.Status().Description, "hunter2", "the span's error text is not redacted")
	require.Equal(t, "2", attr(enqueue, "messaging.batch.message_count"))
}

func TestConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  idemotel.Config
		want string
	}{
		{"defaults", idemotel.Config{}, ""},
		{"W3C and baggage", idemotel.Config{Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})}, ""},
		{"bad namespace", idemotel.Config{Namespace: "1idem"}, "Namespace"},
		{"unsorted buckets", idemotel.Config{Buckets: []float64{1, 0.5}}, "Buckets"},
		{"unsorted lag buckets", idemotel.Config{LagBuckets: []float64{1, 1}}, "LagBuckets"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := idemotel.New(tt.cfg)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// startedCtx returns a context under an ended "producer" span.
func startedCtx(t *testing.T, b bundle) context.Context {
	t.Helper()
	ctx, span := b.tracer.Start(context.Background(), "producer")
	span.End()
	return ctx
}

// ended returns the ended spans named name, in the order they ended.
func ended(b bundle, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range b.recorder.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}
