package examples_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemsqlite"
)

// One trace from the producer's transaction to the consumer's handler: the producer wraps its
// outbox, the relay its sink, and the consumer sets Observer and Tracer — the three lines of
// README. The queue table stands in for the broker; any idem transport carries the trace the
// same way, in the message's headers.
func Example_openTelemetry() {
	dir, _ := os.MkdirTemp("", "idemotel-example")
	defer os.RemoveAll(dir)
	db, err := idemsqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	store := idemsqlite.New(db)
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}

	// An application sets its own providers (OTLP exporter and so on); this one keeps spans in memory.
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(ctx)
	tel, err := idemotel.New(idemotel.Config{TracerProvider: tp})
	if err != nil {
		panic(err)
	}

	// Producer: the event is enqueued in the business transaction, under the request's span.
	outbox := idemotel.Outbox(tel, store) // ← line 1
	rctx, request := tp.Tracer("app").Start(ctx, "POST /orders")
	err = store.InTx(rctx, func(ctx context.Context, tx *sql.Tx) error {
		return outbox.EnqueueTx(ctx, tx, idem.Outgoing{EventID: "order-o1-paid", Topic: "orders.paid", Type: "order.paid", Payload: []byte(`{"order":"o1"}`)})
	})
	request.End()
	if err != nil {
		panic(err)
	}

	// Relay: its sink starts the publish span and hands the trace to the broker.
	relay, err := idemrelay.New(store, tel.Sink(idemqueue.NewSink(store)), idemrelay.Config{Observer: tel}) // ← line 2
	if err != nil {
		panic(err)
	}
	if _, err := relay.RunOnce(ctx); err != nil {
		panic(err)
	}
	_ = relay.Release(ctx)

	// Consumer: each delivery's span is a child of the publish span, the handler's of the delivery's.
	done := make(chan struct{})
	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{
		Name: "ledger@v1",
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			defer close(done)
			return nil // the handler's own spans (its SQL) nest under ctx's
		},
		Observe: idem.ObserveConfig{Observer: tel, Tracer: tel}, // ← line 3
	})
	if err != nil {
		panic(err)
	}
	src, err := idemqueue.NewSource(store, idemqueue.SourceConfig{Queue: "orders.paid"})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error)
	go func() { stopped <- consumer.Run(runCtx, src) }()
	<-done
	stop()
	if err := <-stopped; err != nil {
		panic(err)
	}

	printTree(spans.GetSpans(), "", 0)
	// Output:
	// POST /orders
	//   enqueue orders.paid
	//     publish orders.paid
	//       process queue:orders.paid (outcome processed)
	//         handle order.paid
}

// printTree prints the spans under parent (a span id, "" for the roots), indented by depth, in
// the order they started.
func printTree(spans tracetest.SpanStubs, parent string, depth int) {
	for _, s := range spans {
		p := ""
		if s.Parent.IsValid() {
			p = s.Parent.SpanID().String()
		}
		if p != parent {
			continue
		}
		line := strings.Repeat("  ", depth) + s.Name
		for _, kv := range s.Attributes {
			if kv.Key == "idem.outcome" {
				line += " (outcome " + kv.Value.AsString() + ")"
			}
		}
		fmt.Println(line)
		printTree(spans, s.SpanContext.SpanID().String(), depth+1)
	}
}
