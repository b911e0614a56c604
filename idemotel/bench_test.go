package idemotel_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
)

// BenchmarkDeliveryTrace measures what tracing adds to one delivery: extracting the producer's
// context, the delivery and handler spans and the verdict, with a sampling SDK whose spans go
// to an in-memory exporter. Compare it with a claim's transaction (a commit, ~1ms on SQLite).
func BenchmarkDeliveryTrace(b *testing.B) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tel, err := idemotel.New(idemotel.Config{TracerProvider: tp})
	if err != nil {
		b.Fatal(err)
	}
	pctx, span := tp.Tracer("bench").Start(context.Background(), "producer")
	span.End()
	msg := idem.Message{EventID: "evt-1", Type: "payment.captured", Headers: tel.Inject(pctx, nil)}
	ev := idem.Observation{Consumer: "ledger@v1", Queue: "payments", Outcome: idem.OutcomeProcessed, Result: idem.OutcomeProcessed, Attempt: 1}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		dt := tel.StartDelivery(context.Background(), "ledger@v1", "payments", msg)
		_, end := tel.StartHandler(dt.Context(context.Background()), msg)
		end(nil)
		dt.Observe(ev)
		tel.Observe(ev)
		if i%1024 == 0 {
			exp.Reset()
		}
	}
}
