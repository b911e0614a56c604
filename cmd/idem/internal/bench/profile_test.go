package bench

import (
	"context"
	"testing"

	"github.com/idemkit/idem/internal/testenv"
)

// BenchmarkBatched100 runs the batched path at 8 workers, batch 100, for profiling:
// go test -run='^$' -bench=Batched100 -benchtime=20000x -cpuprofile cpu.out ./internal/bench
func BenchmarkBatched100(b *testing.B) {
	benchCase(b, func(ctx context.Context, e *env) (Result, error) { return e.batched(ctx, 8, 100, "batched") })
}

// BenchmarkSetBatch100 runs the set-based path at 8 workers, batch 100, for profiling:
// go test -run='^$' -bench=SetBatch100 -benchtime=20000x -memprofile mem.out ./internal/bench
func BenchmarkSetBatch100(b *testing.B) {
	r := benchCase(b, func(ctx context.Context, e *env) (Result, error) { return e.setBatch(ctx, 8, 100) })
	b.ReportMetric(r.AllocsPerEv, "allocs/event")
}

// BenchmarkSQLitePipeline runs the queue-table pipeline on SQLite at 8 workers, per event, for
// profiling: go test -run='^$' -bench=SQLitePipeline -benchtime=5000x -cpuprofile cpu.out ./internal/bench
func BenchmarkSQLitePipeline(b *testing.B) {
	benchCase(b, func(ctx context.Context, e *env) (Result, error) {
		l, err := newLite(ctx, e)
		if err != nil {
			return Result{}, err
		}
		defer l.close()
		b.ResetTimer() // the database file and its migrations are not the pipeline
		return l.pipeline(ctx, 8, 0)
	})
}

// BenchmarkSQLiteCeiling runs sqlite_ceiling at 8 workers, the profile the pipeline's is read
// against: go test -run='^$' -bench=SQLiteCeiling -benchtime=5000x -cpuprofile cpu.out ./internal/bench
func BenchmarkSQLiteCeiling(b *testing.B) {
	benchCase(b, func(ctx context.Context, e *env) (Result, error) {
		l, err := newLite(ctx, e)
		if err != nil {
			return Result{}, err
		}
		defer l.close()
		b.ResetTimer()
		return l.ceiling(ctx, 8)
	})
}

// BenchmarkPipelineQueue runs the queue-table pipeline on PostgreSQL at 8 workers (per event,
// and with -batch=100 batched), for profiling:
// go test -run='^$' -bench=PipelineQueue -benchtime=5000x -cpuprofile cpu.out ./internal/bench
func BenchmarkPipelineQueue(b *testing.B) {
	benchCase(b, func(ctx context.Context, e *env) (Result, error) { return e.pipelineQueue(ctx, 8, 0) })
}

// BenchmarkPipelineJetStream runs the JetStream pipeline at 8 workers, per event, for
// profiling (IDEM_NATS_URL): go test -run='^$' -bench=PipelineJetStream -benchtime=5000x
// -cpuprofile cpu.out ./internal/bench
func BenchmarkPipelineJetStream(b *testing.B) {
	nats := testenv.NATS(b)
	benchCase(b, func(ctx context.Context, e *env) (Result, error) {
		e.opts.NATSURL = nats
		return e.pipelineJetStream(ctx, 8, 0)
	})
}

// BenchmarkRelay runs the relay draining an outbox backlog to JetStream, for profiling
// (IDEM_NATS_URL): go test -run='^$' -bench=Relay -benchtime=5000x -cpuprofile cpu.out ./internal/bench
func BenchmarkRelay(b *testing.B) {
	nats := testenv.NATS(b)
	benchCase(b, func(ctx context.Context, e *env) (Result, error) {
		e.opts.NATSURL = nats
		return e.relay(ctx)
	})
}

// benchCase runs one case over b.N events at 8 workers in a fresh environment and reports its
// throughput; the result is returned for further metrics.
func benchCase(b *testing.B, run func(ctx context.Context, e *env) (Result, error)) Result {
	ctx := context.Background()
	e, err := newEnv(ctx, Options{PostgresURL: testenv.Postgres(b), Concurrency: []int{8}}.WithDefaults())
	if err != nil {
		b.Fatal(err)
	}
	defer e.close()
	e.opts.Events = b.N
	b.ReportAllocs()
	b.ResetTimer()
	r, err := run(ctx, e)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.EventsPerS, "events/s")
	return r
}
