package oteltrace_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/retry"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// transport is a broker between the relay and the consumer: a sink for topic and a source on it.
type transport struct {
	name  string
	setup func(t *testing.T, store *idemsqlite.Store) (topic string, sink idem.Sink, src idem.Source)
	// republish publishes msg again as a relay would after a crash: the broker must not
	// deduplicate it, so that the consumer sees the duplicate delivery.
	republish func(msg idem.Message) idem.Message
}

var transports = []transport{
	{
		name: "nats",
		setup: func(t *testing.T, _ *idemsqlite.Store) (string, idem.Sink, idem.Source) {
			nc, err := nats.Connect(testenv.NATS(t))
			require.NoError(t, err)
			t.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			require.NoError(t, err)
			id := testdb.Name("")
			stream, subject := "IDEMOTEL_"+strings.ToUpper(id), "idemotel."+id
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = idemnats.EnsureStream(ctx, js, jetstream.StreamConfig{Name: stream, Subjects: []string{subject},
				Storage: jetstream.MemoryStorage, Duplicates: time.Minute, MaxAge: 10 * time.Minute})
			require.NoError(t, err)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = js.DeleteStream(ctx, stream)
			})
			src, err := idemnats.NewSource(ctx, js, idemnats.SourceConfig{Stream: stream, Subject: subject, Durable: "ledger",
				AckWait: 5 * time.Second, MaxWait: 100 * time.Millisecond})
			require.NoError(t, err)
			t.Cleanup(func() { _ = src.Close() })
			return subject, idemnats.NewSink(js), src
		},
		republish: func(msg idem.Message) idem.Message {
			msg = msg.Clone()
			msg.Headers[idemnats.HeaderBrokerMsgID] = msg.EventID + "/again"
			return msg
		},
	},
	{
		name: "queue table",
		setup: func(t *testing.T, store *idemsqlite.Store) (string, idem.Sink, idem.Source) {
			src, err := idemqueue.NewSource[*sql.Tx](store, idemqueue.SourceConfig{Queue: "payments", Lease: 5 * time.Second, MaxWait: 50 * time.Millisecond})
			require.NoError(t, err)
			return "payments", idemqueue.NewSink(store), src
		},
		republish: func(msg idem.Message) idem.Message { return msg },
	},
}

// flow is one test's producer, relay and consumer around a SQLite store, all traced into rec.
type flow struct {
	t        *testing.T
	store    *idemsqlite.Store
	tel      *idemotel.Telemetry
	rec      *tracetest.SpanRecorder
	app      trace.Tracer
	topic    string
	sink     idem.Sink
	src      idem.Source
	relay    *idemrelay.Relay
	tr       transport
	handled  chan string
	consumer *idem.Consumer[*sql.Tx]
	sent     *capture
}

// capture is the relay's sink in front of idemotel's: it keeps what the relay published, as the
// outbox row holds it (with the enqueue span's trace context).
type capture struct {
	next idem.Sink
	mu   sync.Mutex
	msgs map[string]idem.Message
}

func (c *capture) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	c.mu.Lock()
	for _, m := range msgs {
		c.msgs[m.EventID] = m.Clone()
	}
	c.mu.Unlock()
	return c.next.Publish(ctx, topic, msgs...)
}

func (c *capture) Close() error { return c.next.Close() }

// outboxMessage returns the message the relay published for event id, as the outbox held it.
func (f *flow) outboxMessage(id string) idem.Message {
	f.t.Helper()
	f.sent.mu.Lock()
	defer f.sent.mu.Unlock()
	m, ok := f.sent.msgs[id]
	require.True(f.t, ok, "the relay did not publish %s", id)
	return m
}

// options vary a flow: batched processing, a handler that fails each event's first attempt.
type options struct {
	batch, failFirst bool
}

func newFlow(t *testing.T, tr transport, opt options) *flow {
	t.Helper()
	store, _ := testdb.SQLite(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tel, err := idemotel.New(idemotel.Config{TracerProvider: tp})
	require.NoError(t, err)
	f := &flow{t: t, store: store, tel: tel, rec: rec, app: tp.Tracer("app"), tr: tr, handled: make(chan string, 16)}
	f.topic, f.sink, f.src = tr.setup(t, store)
	f.sent = &capture{next: tel.Sink(f.sink), msgs: map[string]idem.Message{}}
	f.relay, err = idemrelay.New(store, f.sent, idemrelay.Config{ID: "otel-" + testdb.Name(""), Observer: tel,
		Topic: func(idem.Outgoing) string { return f.topic }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.relay.Release(context.Background()) })
	attempts := map[string]int{}
	var mu sync.Mutex
	cfg := idem.ConsumerConfig[*sql.Tx]{
		Name: "ledger@v1",
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			mu.Lock()
			attempts[msg.EventID]++
			first := attempts[msg.EventID] == 1
			mu.Unlock()
			if opt.failFirst && first {
				return idem.Transient(errors.New("upstream 503"))
			}
			// The user's own database span nests in the handler's.
			ctx, span := f.app.Start(ctx, "db credit")
			defer span.End()
			if _, err := tx.ExecContext(ctx, `INSERT INTO ledger (event_id, wallet, amount) VALUES (?, 'w', 1)`, msg.EventID); err != nil {
				return err
			}
			f.handled <- msg.EventID
			return nil
		},
		Failure: idem.FailureConfig{
			Retry: retry.Policy{MaxAttempts: 3, MaxElapsed: time.Minute, Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond},
		},
		Observe: idem.ObserveConfig{
			Observer: tel,
			Tracer:   tel,
		},
	}
	if opt.batch {
		cfg.Batch = idem.BatchConfig{Enabled: true, Size: 10, MaxWait: 300 * time.Millisecond}
	}
	f.consumer, err = idem.NewConsumer[*sql.Tx](store, cfg)
	require.NoError(t, err)
	return f
}

// produce enqueues events in one producer transaction under a "producer tx" span and returns
// that span's context.
func (f *flow) produce(ids ...string) trace.SpanContext {
	f.t.Helper()
	ctx, span := f.app.Start(context.Background(), "producer tx")
	defer span.End()
	outbox := idemotel.Outbox[*sql.Tx](f.tel, f.store)
	err := f.store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		out := make([]idem.Outgoing, len(ids))
		for i, id := range ids {
			out[i] = idem.Outgoing{EventID: id, Topic: "payments", Type: "payment.captured", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		}
		return outbox.EnqueueTx(ctx, tx, out...)
	})
	require.NoError(f.t, err)
	return span.SpanContext()
}

// run runs the consumer until the test ends.
func (f *flow) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.consumer.Run(ctx, f.src) }()
	f.t.Cleanup(func() {
		cancel()
		require.NoError(f.t, <-done)
	})
}

// relayOnce publishes what the outbox holds.
func (f *flow) relayOnce(want int) {
	f.t.Helper()
	n, err := f.relay.RunOnce(context.Background())
	require.NoError(f.t, err)
	require.Equal(f.t, want, n)
}

// spans waits until n spans named name have ended and returns them.
func (f *flow) spans(name string, n int) []sdktrace.ReadOnlySpan {
	f.t.Helper()
	var got []sdktrace.ReadOnlySpan
	require.Eventually(f.t, func() bool {
		got = got[:0]
		for _, s := range f.rec.Ended() {
			if s.Name() == name {
				got = append(got, s)
			}
		}
		return len(got) >= n
	}, 15*time.Second, 10*time.Millisecond, "waiting for %d spans %q", n, name)
	require.Len(f.t, got, n, "spans %q", name)
	return got
}

// byParent returns the span of spans whose parent is parent.
func byParent(t *testing.T, spans []sdktrace.ReadOnlySpan, parent trace.SpanContext) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range spans {
		if s.Parent().SpanID() == parent.SpanID() {
			require.Equal(t, parent.TraceID(), s.SpanContext().TraceID())
			return s
		}
	}
	t.Fatalf("no span under %s among %d", parent.SpanID(), len(spans))
	return nil
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

func linked(s sdktrace.ReadOnlySpan, sc trace.SpanContext) bool {
	for _, l := range s.Links() {
		if l.SpanContext.SpanID() == sc.SpanID() && l.SpanContext.TraceID() == sc.TraceID() {
			return true
		}
	}
	return false
}

// TestOneTracePerEvent follows an event from the producer's transaction to the user's span in
// the handler, parent to child all the way, then a second delivery of it (a relay's republish)
// as a span of its own with outcome duplicate that runs no handler, and a third with the same
// id but other content, whose span shows key reuse.
func TestOneTracePerEvent(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			f := newFlow(t, tr, options{})
			f.run()
			producer := f.produce("evt-1")
			f.relayOnce(1)

			enqueue := byParent(t, f.spans("enqueue payments", 1), producer)
			publish := byParent(t, f.spans("publish "+f.topic, 1), enqueue.SpanContext())
			process := byParent(t, f.spans("process "+f.src.Name(), 1), publish.SpanContext())
			require.Equal(t, trace.SpanKindConsumer, process.SpanKind())
			require.Equal(t, "processed", attr(process, "idem.outcome"))
			require.Equal(t, "ledger@v1", attr(process, "messaging.consumer.group.name"))
			handle := byParent(t, f.spans("handle payment.captured", 1), process.SpanContext())
			byParent(t, f.spans("db credit", 1), handle.SpanContext())
			require.Empty(t, attr(process, "messaging.message.id"), "event id recorded without RecordIdentities")

			// The same event again: its own publish and process spans in the same trace.
			sent := f.outboxMessage("evt-1")
			require.NoError(t, f.tel.Sink(f.sink).Publish(context.Background(), f.topic, tr.republish(sent)))
			processes := f.spans("process "+f.src.Name(), 2)
			var dup sdktrace.ReadOnlySpan
			for _, s := range processes {
				if s.SpanContext().SpanID() != process.SpanContext().SpanID() {
					dup = s
				}
			}
			require.Equal(t, "duplicate", attr(dup, "idem.outcome"))
			require.Equal(t, "duplicate", attr(dup, "idem.result"))
			require.Equal(t, producer.TraceID(), dup.SpanContext().TraceID())
			// It is a child of the second publish span, itself a child of the enqueue span.
			var again sdktrace.ReadOnlySpan
			for _, p := range f.spans("publish "+f.topic, 2) {
				if p.SpanContext().SpanID() == dup.Parent().SpanID() {
					again = p
				}
			}
			require.NotNil(t, again, "the duplicate's parent is not a publish span")
			require.NotEqual(t, publish.SpanContext().SpanID(), again.SpanContext().SpanID())
			require.Equal(t, enqueue.SpanContext().SpanID(), again.Parent().SpanID())
			require.Len(t, f.spans("handle payment.captured", 1), 1, "the duplicate ran the handler")
			require.Len(t, f.handled, 1)

			// The same event id with other content: key reuse, dead-lettered, no handler.
			reused := tr.republish(sent)
			reused.Payload = []byte(`{"n":"changed"}`)
			if tr.name == "nats" {
				reused.Headers[idemnats.HeaderBrokerMsgID] = reused.EventID + "/reused"
			}
			require.NoError(t, f.tel.Sink(f.sink).Publish(context.Background(), f.topic, reused))
			var reuse sdktrace.ReadOnlySpan
			for _, s := range f.spans("process "+f.src.Name(), 3) {
				if attr(s, "idem.result") == "key_reuse" {
					reuse = s
				}
			}
			require.NotNil(t, reuse, "no delivery span with result key_reuse")
			require.Equal(t, "dead_lettered", attr(reuse, "idem.outcome"))
			require.Equal(t, "key_reuse", attr(reuse, "idem.reason"))
			require.Equal(t, producer.TraceID(), reuse.SpanContext().TraceID())
			require.Len(t, f.spans("handle payment.captured", 1), 1, "key reuse ran the handler")
		})
	}
}

// TestBatchLinksProducers runs a producer's three events through one batch: the batch span
// links each event's publish span, each delivery is a child of the batch span with a link to its
// own publish span, and each handler nests in its own delivery.
func TestBatchLinksProducers(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			f := newFlow(t, tr, options{batch: true})
			producer := f.produce("evt-a", "evt-b", "evt-c")
			f.relayOnce(3)
			f.run()

			enqueue := byParent(t, f.spans("enqueue payments", 1), producer)
			publishes := f.spans("publish "+f.topic, 3)
			processes := f.spans("process "+f.src.Name(), 3)
			handles := f.spans("handle payment.captured", 3)
			for _, p := range publishes {
				require.Equal(t, enqueue.SpanContext().SpanID(), p.Parent().SpanID())
				var delivery sdktrace.ReadOnlySpan
				for _, d := range processes {
					if linked(d, p.SpanContext()) {
						delivery = d
					}
				}
				require.NotNil(t, delivery, "no delivery links publish %s", p.SpanContext().SpanID())
				require.NotEqual(t, p.SpanContext().TraceID(), delivery.SpanContext().TraceID(), "a batched delivery joined one producer's trace")
				// The batch span ends after its deliveries have settled.
				var batch sdktrace.ReadOnlySpan
				require.Eventually(t, func() bool {
					for _, b := range f.rec.Ended() {
						if b.SpanContext().SpanID() == delivery.Parent().SpanID() {
							batch = b
							return true
						}
					}
					return false
				}, 10*time.Second, 10*time.Millisecond, "the delivery's batch span did not end")
				require.Equal(t, "process batch "+f.src.Name(), batch.Name())
				require.True(t, linked(batch, p.SpanContext()), "the batch span does not link publish %s", p.SpanContext().SpanID())
				require.Equal(t, "processed", attr(delivery, "idem.outcome"))
				byParent(t, handles, delivery.SpanContext())
			}
		})
	}
}

// TestRetryIsAnEventThenANewDelivery: a transient failure ends the delivery's span with outcome
// retried and a retry event; the redelivery is a second span under the same publish span, whose
// handler runs again and succeeds.
func TestRetryIsAnEventThenANewDelivery(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			f := newFlow(t, tr, options{failFirst: true})
			f.run()
			f.produce("evt-r")
			f.relayOnce(1)

			publish := f.spans("publish "+f.topic, 1)[0]
			processes := f.spans("process "+f.src.Name(), 2)
			byOutcome := map[string]sdktrace.ReadOnlySpan{}
			for _, p := range processes {
				require.Equal(t, publish.SpanContext().SpanID(), p.Parent().SpanID())
				byOutcome[attr(p, "idem.outcome")] = p
			}
			retried, processed := byOutcome["retried"], byOutcome["processed"]
			require.NotNil(t, retried, "no retried delivery")
			require.NotNil(t, processed, "no processed delivery")
			require.Len(t, retried.Events(), 1)
			require.Equal(t, "retry", retried.Events()[0].Name)
			require.Equal(t, "transient", attr(retried, "error.type"))
			require.Equal(t, "failed", attr(retried, "idem.result"))
			require.Equal(t, "1", attr(retried, "idem.attempt"))
			require.Equal(t, "2", attr(processed, "idem.attempt"))
			handles := f.spans("handle payment.captured", 2)
			byParent(t, handles, retried.SpanContext())
			byParent(t, handles, processed.SpanContext())
		})
	}
}
