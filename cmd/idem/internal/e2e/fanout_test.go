package e2e_test

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/consumertest"
	"github.com/idemkit/idem/storetest"
	"github.com/idemkit/idem/transporttest"
)

// TestRuntimeFanOut runs consumertest.ExerciseFanOut (a ledger and an e-mail consumer of one
// topic, each applying every event once) over the brokers whose source names fan out: a
// JetStream durable, a Redis Streams group and a Pub/Sub subscription per name. The queue table
// runs it in TestQueueSubscriptions.
func TestRuntimeFanOut(t *testing.T) {
	t.Parallel()
	t.Run("PostgresNATS", func(t *testing.T) {
		t.Parallel()
		consumertest.ExerciseFanOut(t, func(tb testing.TB) (storetest.Bundle[pgx.Tx], transporttest.Harness) {
			_, b := testdb.Postgres(tb)
			return b, natsHarness(tb)
		})
	})
	t.Run("SQLiteRedis", func(t *testing.T) {
		t.Parallel()
		consumertest.ExerciseFanOut(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
			_, b := testdb.SQLite(tb)
			return b, redisHarness(tb)
		})
	})
	t.Run("SQLitePubSub", func(t *testing.T) {
		t.Parallel()
		consumertest.ExerciseFanOut(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
			_, b := testdb.SQLite(tb)
			return b, pubsubHarness(tb)
		})
	})
}
