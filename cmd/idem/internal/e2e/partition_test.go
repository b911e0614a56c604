package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/storetest"
)

const day = 24 * time.Hour

// pgPartitioned is testdb.Postgres with the claims table partitioned by p.
func pgPartitioned(tb testing.TB, p idempg.PartitionConfig) (*idempg.Store, storetest.Bundle[pgx.Tx]) {
	tb.Helper()
	return testdb.PostgresPartitioned(tb, p)
}

// TestPartitionConformancePostgres runs the partitioned inbox's suite, single and batched paths,
// with both bucket widths. storetest.Exercise and ExerciseBatch cannot run here as they stand:
// their messages (storetest.PaymentMessage) carry no OccurredAt, which a partitioned inbox
// requires; ExercisePartitioned repeats their checks with one.
func TestPartitionConformancePostgres(t *testing.T) {
	t.Parallel()
	for name, p := range map[string]idempg.PartitionConfig{
		"Day":  {Bucket: day, Retention: 7 * day},
		"Hour": {Bucket: time.Hour, Retention: 50 * time.Hour, Ahead: 2 * time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			storetest.ExercisePartitioned(t, func(tb testing.TB) storetest.Bundle[pgx.Tx] { _, b := pgPartitioned(tb, p); return b })
		})
	}
}

// dropLoad runs 4 goroutines that deliver fresh events (and every fifth one again) into the
// current partition through Consumer.Process until stop is closed, retrying transient failures
// as a broker would. It returns a func that waits for them and reports.
type dropLoad struct {
	measuring  atomic.Bool
	during     atomic.Int64 // deliveries completed while measuring
	maxLatency atomic.Int64 // the slowest of them, in ns
	processed  atomic.Int64
	transient  atomic.Int64
	mu         sync.Mutex
	fatal      []error
}

func (l *dropLoad) run(ctx context.Context, c *idem.Consumer[pgx.Tx], stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				msg := storetest.PaymentMessageAt("acme", fmt.Sprintf("w%d-%d", w, i), time.Now(), storetest.Payment{Wallet: "w1", Amount: 1})
				for range 1 + boolInt(i%5 == 0) {
					for try := 1; ; try++ {
						began := time.Now()
						r := c.Process(ctx, msg)
						err := r.Err
						took := time.Since(began)
						if l.measuring.Load() {
							l.during.Add(1)
							for m := l.maxLatency.Load(); int64(took) > m && !l.maxLatency.CompareAndSwap(m, int64(took)); m = l.maxLatency.Load() {
							}
						}
						if r.Outcome == idem.OutcomeProcessed {
							l.processed.Add(1)
						}
						if err == nil {
							break
						}
						if r.Class != idem.ClassTransient || try == 10 {
							l.mu.Lock()
							l.fatal = append(l.fatal, fmt.Errorf("%s (class %s, try %d): %w", msg.EventID, r.Class, try, err))
							l.mu.Unlock()
							break
						}
						l.transient.Add(1)
					}
				}
			}
		})
	}
	return &wg
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestPartitionDropUnderLoad creates a partition ahead and drops an expired day partition of
// 200,000 claims while four consumers keep claiming into the current one. The partition is
// attached and detached concurrently, so claims are not blocked: the drop takes well under a
// second, and nothing but (retried) transient errors may occur. A second run holds a 3 s
// transaction open meanwhile: the detach waits for it, the attach and the claims do not.
func TestPartitionDropUnderLoad(t *testing.T) {
	t.Parallel()
	for _, longTx := range []time.Duration{0, 3 * time.Second} {
		t.Run(fmt.Sprintf("LongTransaction=%v", longTx), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store, b := pgPartitioned(t, idempg.PartitionConfig{Bucket: day, Retention: 3 * day, Ahead: 2 * day})
			require.NoError(t, b.CreateWallet(ctx, "w1"))
			now := time.Now().UTC()
			oldest := now.Add(-3 * day).Truncate(day)
			oldestName := "idem_claims_p" + oldest.Format("20060102")
			_, err := store.Pool().Exec(ctx, `INSERT INTO `+store.Config().Schema+`.idem_claims
				SELECT 'acme', 'ledger@v1', 'old-' || g, $1, sha256(g::text::bytea), $1 FROM generate_series(1, 200000) g`, oldest)
			require.NoError(t, err)
			// An expired partition has not been written for days: autovacuum is long done with it.
			_, err = store.Pool().Exec(ctx, `VACUUM (ANALYZE) `+store.Config().Schema+`.`+oldestName)
			require.NoError(t, err)

			c, err := idem.NewConsumer(store, idem.ConsumerConfig[pgx.Tx]{Name: "ledger@v1", Handler: storetest.CreditHandler(b),
				Claims: idem.ClaimConfig{
					Retention:        3 * day,
					RedeliveryWindow: time.Hour,
				},
			})
			require.NoError(t, err)
			var load dropLoad
			stop := make(chan struct{})
			wg := load.run(ctx, c, stop)
			t.Cleanup(func() {
				select {
				case <-stop:
				default:
					close(stop)
					wg.Wait()
				}
			})

			longDone := make(chan error, 1)
			if longTx > 0 {
				started := make(chan struct{})
				go func() {
					longDone <- store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
						_, err := store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: idem.Key{Tenant: "acme", Consumer: "slow@v1", EventID: "slow"},
							Bucket: time.Now()})
						close(started)
						time.Sleep(longTx) // a slow handler
						return err
					})
				}()
				<-started
			}
			time.Sleep(300 * time.Millisecond) // the load warms up

			load.measuring.Store(true)
			// A day later, one more partition is due ahead: attaching it waits for nobody.
			began := time.Now()
			created, err := store.EnsurePartitions(ctx, now.Add(day))
			ensureTook := time.Since(began)
			require.NoError(t, err)
			require.Equal(t, 1, created)
			// And the horizon (now - 2 days) has passed the oldest partition's end.
			began = time.Now()
			dropped, err := store.DropExpiredPartitions(ctx, now.Add(day))
			took := time.Since(began)
			time.Sleep(100 * time.Millisecond)
			load.measuring.Store(false)
			close(stop)
			wg.Wait()
			if longTx > 0 {
				require.NoError(t, <-longDone)
			}

			t.Logf("with a %v transaction open: created a partition in %v, dropped %v (200,000 claims) in %v; "+
				"%d deliveries meanwhile, slowest %v; %d processed, %d transient retries",
				longTx, ensureTook.Round(time.Millisecond), dropped, took.Round(time.Millisecond), load.during.Load(),
				time.Duration(load.maxLatency.Load()).Round(time.Millisecond), load.processed.Load(), load.transient.Load())
			require.NoError(t, err)
			require.Equal(t, []string{oldestName}, dropped)
			require.Empty(t, load.fatal, "only transient errors may occur")
			require.Less(t, took, longTx+5*time.Second, "the drop completes promptly")
			require.Less(t, ensureTook, 10*time.Second, "the attach waits for no transaction")
			require.Positive(t, load.during.Load(), "claims went on during the drop")
			if longTx > 0 {
				require.GreaterOrEqual(t, took, longTx/2, "the detach waits for the open transaction")
				require.Less(t, time.Duration(load.maxLatency.Load()), longTx, "claims do not wait for it")
			}
			bal, err := b.Balance(ctx, "w1")
			require.NoError(t, err)
			require.Equal(t, load.processed.Load(), bal, "every processed outcome is exactly one effect")
			var claims int64
			require.NoError(t, store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+store.Config().Schema+`.idem_claims WHERE consumer = 'ledger@v1'`).Scan(&claims))
			require.Equal(t, bal, claims, "the old partition's claims are gone, the new ones stay")
		})
	}
}

// TestPartitionedPassesThePlainSuites runs the plain store's conformance suites, single and
// batched, against the partitioned inbox: every semantic holds with either layout.
func TestPartitionedPassesThePlainSuites(t *testing.T) {
	t.Parallel()
	factory := func(tb testing.TB) storetest.Bundle[pgx.Tx] {
		_, b := pgPartitioned(tb, idempg.PartitionConfig{Bucket: day, Retention: 7 * day})
		return b
	}
	t.Run("Exercise", func(t *testing.T) { t.Parallel(); storetest.Exercise(t, factory) })
	t.Run("ExerciseBatch", func(t *testing.T) { t.Parallel(); storetest.ExerciseBatch(t, factory) })
}
