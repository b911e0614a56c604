package e2e_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/consumertest"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/storetest"
	"github.com/idemkit/idem/transporttest"
)

// queueHarness is the queue-table transport over store.
func queueHarness[TTx any](store idemstore.QueueTxStore[TTx]) transporttest.Harness {
	return transporttest.Harness{
		Features: transporttest.Features{FencedSettle: true, DelayedNak: true, Persistent: true},
		NewTopic: func(tb testing.TB) string { return testdb.Name("q_") },
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			src, err := idemqueue.NewSource(store, idemqueue.SourceConfig{Queue: topic, Lease: lease, MaxWait: 200 * time.Millisecond})
			if err != nil {
				tb.Fatal(err)
			}
			return src
		},
		Sink: func(tb testing.TB) idem.Sink { return idemqueue.NewSink(store) },
	}
}

// queueSubscriptionHarness is the queue-table transport with a subscription per source name:
// fan-out. A subscription receives only what is published after it exists, as in a deployment
// that subscribes before producers publish: NewTopic subscribes names, and each source
// registers its own when opened (idempotent).
func queueSubscriptionHarness[TTx any](store interface {
	idemstore.QueueTxStore[TTx]
	idemstore.QueueSubscriptionStore
}, names []string) transporttest.Harness {
	return transporttest.Harness{
		Features: transporttest.Features{FencedSettle: true, DelayedNak: true, Persistent: true, FanOut: true},
		NewTopic: func(tb testing.TB) string {
			topic := testdb.Name("q_")
			for _, name := range names {
				if err := store.QueueSubscribe(context.Background(), topic, name); err != nil {
					tb.Fatal(err)
				}
			}
			return topic
		},
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			src, err := idemqueue.NewSource(store, idemqueue.SourceConfig{Queue: topic, Subscription: name, Lease: lease, MaxWait: 200 * time.Millisecond})
			if err != nil {
				tb.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := src.Subscribe(ctx); err != nil {
				tb.Fatal(err)
			}
			return src
		},
		Sink: func(tb testing.TB) idem.Sink { return idemqueue.NewSink(store) },
	}
}

// TestQueueSubscriptions runs the transport suite (FanOut among its checks) and the runtime's
// fan-out check over queue-table subscriptions on every store.
func TestQueueSubscriptions(t *testing.T) {
	t.Parallel()
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		store, _ := testdb.Postgres(t)
		transporttest.Exercise(t, queueSubscriptionHarness[pgx.Tx](store, transporttest.SourceNames))
		consumertest.ExerciseFanOut(t, func(tb testing.TB) (storetest.Bundle[pgx.Tx], transporttest.Harness) {
			store, b := testdb.Postgres(tb)
			return b, queueSubscriptionHarness[pgx.Tx](store, transporttest.SourceNames)
		})
	})
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		store, _ := testdb.SQLite(t)
		transporttest.Exercise(t, queueSubscriptionHarness[*sql.Tx](store, transporttest.SourceNames))
		consumertest.ExerciseFanOut(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
			store, b := testdb.SQLite(tb)
			return b, queueSubscriptionHarness[*sql.Tx](store, transporttest.SourceNames)
		})
	})
	t.Run("MySQL", func(t *testing.T) {
		t.Parallel()
		store, _ := testdb.MySQL(t)
		transporttest.Exercise(t, queueSubscriptionHarness[*sql.Tx](store, transporttest.SourceNames))
		consumertest.ExerciseFanOut(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
			store, b := testdb.MySQL(tb)
			return b, queueSubscriptionHarness[*sql.Tx](store, transporttest.SourceNames)
		}, consumertest.Batched(10))
	})
}

func TestRuntimePostgresQueue(t *testing.T) {
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[pgx.Tx], transporttest.Harness) {
		store, b := testdb.Postgres(tb)
		return b, queueHarness[pgx.Tx](store)
	})
}

func TestRuntimeSQLiteQueue(t *testing.T) {
	wholeMatrix(t, "TestRuntimeBatchedSQLiteQueue")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		store, b := testdb.SQLite(tb)
		return b, queueHarness[*sql.Tx](store)
	})
}

func TestQueueTransportPostgres(t *testing.T) {
	t.Parallel()
	store, _ := testdb.Postgres(t)
	transporttest.Exercise(t, queueHarness[pgx.Tx](store))
}

func TestQueueTransportSQLite(t *testing.T) {
	t.Parallel()
	store, _ := testdb.SQLite(t)
	transporttest.Exercise(t, queueHarness[*sql.Tx](store))
}

func TestRuntimeBatchedPostgresQueue(t *testing.T) {
	wholeMatrix(t, "TestRuntimePostgresQueue and TestRuntimeBatchedSQLiteQueue")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[pgx.Tx], transporttest.Harness) {
		store, b := testdb.Postgres(tb)
		return b, queueHarness[pgx.Tx](store)
	}, consumertest.Batched(10))
}

func TestRuntimeBatchedSQLiteQueue(t *testing.T) {
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		store, b := testdb.SQLite(tb)
		return b, queueHarness[*sql.Tx](store)
	}, consumertest.Batched(10))
}

func TestRuntimeSetBasedSQLiteQueue(t *testing.T) {
	wholeMatrix(t, "TestRuntimeSetBasedPostgresQueue")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		store, b := testdb.SQLite(tb)
		return b, queueHarness[*sql.Tx](store)
	}, consumertest.SetBased(10))
}

func TestRuntimeSetBasedPostgresQueue(t *testing.T) {
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[pgx.Tx], transporttest.Harness) {
		store, b := testdb.Postgres(tb)
		return b, queueHarness[pgx.Tx](store)
	}, consumertest.SetBased(10))
}

func TestRuntimeMySQLQueue(t *testing.T) {
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		store, b := testdb.MySQL(tb)
		return b, queueHarness[*sql.Tx](store)
	})
}

func TestQueueTransportMySQL(t *testing.T) {
	t.Parallel()
	store, _ := testdb.MySQL(t)
	transporttest.Exercise(t, queueHarness[*sql.Tx](store))
}

func TestRuntimeBatchedMySQLQueue(t *testing.T) {
	wholeMatrix(t, "TestRuntimeMySQLQueue and TestRuntimeBatchedSQLiteQueue")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		store, b := testdb.MySQL(tb)
		return b, queueHarness[*sql.Tx](store)
	}, consumertest.Batched(10))
}
