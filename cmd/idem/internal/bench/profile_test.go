package bench

import (
	"context"
	"testing"

	"github.com/idemkit/idem/internal/testenv"
)

// BenchmarkBatched100 runs the batched path at 8 workers, batch 100, for profiling:
// go test -run='^$' -bench=Batched100 -benchtime=20000x -cpuprofile cpu.out ./internal/bench
func BenchmarkBatched100(b *testing.B) {
	ctx := context.Background()
	e, err := newEnv(ctx, Options{PostgresURL: testenv.Postgres(b), Concurrency: []int{8}}.WithDefaults())
	if err != nil {
		b.Fatal(err)
	}
	defer e.close()
	e.opts.Events = b.N
	b.ReportAllocs()
	b.ResetTimer()
	r, err := e.batched(ctx, 8, 100, "batched")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.EventsPerS, "events/s")
}

// BenchmarkSetBatch100 runs the set-based path at 8 workers, batch 100, for profiling:
// go test -run='^$' -bench=SetBatch100 -benchtime=20000x -memprofile mem.out ./internal/bench
func BenchmarkSetBatch100(b *testing.B) {
	ctx := context.Background()
	e, err := newEnv(ctx, Options{PostgresURL: testenv.Postgres(b), Concurrency: []int{8}}.WithDefaults())
	if err != nil {
		b.Fatal(err)
	}
	defer e.close()
	e.opts.Events = b.N
	b.ReportAllocs()
	b.ResetTimer()
	r, err := e.setBatch(ctx, 8, 100)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.EventsPerS, "events/s")
	b.ReportMetric(r.AllocsPerEv, "allocs/event")
}

// BenchmarkSQLitePipeline runs the queue-table pipeline on SQLite at 8 workers, per event, for
// profiling: go test -run='^$' -bench=SQLitePipeline -benchtime=5000x -cpuprofile cpu.out ./internal/bench
func BenchmarkSQLitePipeline(b *testing.B) {
	ctx := context.Background()
	e, err := newEnv(ctx, Options{PostgresURL: testenv.Postgres(b), Concurrency: []int{8}}.WithDefaults())
	if err != nil {
		b.Fatal(err)
	}
	defer e.close()
	l, err := newLite(ctx, e)
	if err != nil {
		b.Fatal(err)
	}
	defer l.close()
	e.opts.Events = b.N
	b.ReportAllocs()
	b.ResetTimer()
	r, err := l.pipeline(ctx, 8, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.EventsPerS, "events/s")
}
