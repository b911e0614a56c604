package relaytest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idemrelay"
)

// countObserver counts published rows.
type countObserver struct{ n atomic.Int64 }

func (c *countObserver) Published(_ string, n int, _ time.Duration) { c.n.Add(int64(n)) }
func (c *countObserver) PublishFailed(string, idem.Class, bool)     {}
func (c *countObserver) wait(tb testing.TB, want int64, d time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for c.n.Load() < want {
		if time.Now().After(deadline) {
			tb.Fatalf("published %d of %d rows in %v", c.n.Load(), want, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkRelay measures one relay publishing a backlog from PostgreSQL to JetStream: rows are
// enqueued first (100 ordering keys, one topic), then the relay starts and the clock runs until
// every row is published and marked. It reports events/s.
func BenchmarkRelay(b *testing.B) {
	js := connectJS(b)
	const rows, keys, perTx = 5000, 100, 500
	for _, batch := range []int{100, 500} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			env := newPG(b, storeCfg{maxConns: 8})
			_, subject := testStream(b, js, 2*time.Minute)
			sink := idemnats.NewSink(js)
			ctx := context.Background()
			var elapsed time.Duration
			for i := range b.N {
				b.StopTimer()
				for start := 0; start < rows; start += perTx {
					msgs := make([]idem.Outgoing, 0, perTx)
					for j := start; j < start+perTx; j++ {
						msgs = append(msgs, idem.Outgoing{EventID: fmt.Sprintf("bench-%d-%d", i, j), Tenant: "acme",
							Topic: subject, Key: fmt.Sprintf("k%d", j%keys), Type: "bench", Payload: []byte(`{"n":1}`)})
					}
					if err := env.store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
						return env.store.EnqueueTx(ctx, tx, msgs...)
					}); err != nil {
						b.Fatal(err)
					}
				}
				obs := &countObserver{}
				r := newRelay(b, env.store, env.store, sink, func(c *idemrelay.Config) {
					c.BatchSize, c.LeaseTTL, c.PollInterval, c.Observer = batch, 10*time.Second, 50*time.Millisecond, obs
				})
				b.StartTimer()
				t0 := time.Now()
				rr := start(b, r)
				obs.wait(b, rows, time.Minute)
				elapsed += time.Since(t0)
				b.StopTimer()
				rr.stop(b)
				b.StartTimer()
			}
			b.ReportMetric(float64(rows*b.N)/elapsed.Seconds(), "events/s")
		})
	}
}
