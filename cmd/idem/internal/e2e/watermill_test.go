package e2e_test

import (
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/internal/watermillsuite"
)

// Watermill's universal pub/sub suite judges every transport as a second opinion beside
// transporttest. The features are what each broker really does:
//   - no transport delivers exactly once (idem makes the effect exactly-once, not the delivery);
//   - on JetStream every consumer group (durable consumer) receives every message; a subscriber
//     without a group joins the one shared durable consumer and resumes its unacked messages, so
//     it does not replay what that consumer already acked (Kafka's "new subscriber receives old
//     messages" is not claimed);
//   - the queue table deletes a job when it is acked and has one queue per topic shared by every
//     consumer name, so it has neither consumer groups (fan-out) nor old messages for newcomers;
//   - neither guarantees order once a message is nak'ed (it goes back behind the others), so
//     the in-order check is not claimed;
//   - reconnect needs a broker restart command, which the shared CI services do not allow;
//   - ForceShort: the suite's smaller message counts, so it fits CI on two cores (the queue
//     table hands one job at a time to this adapter: 10,000 messages take minutes).

func TestWatermillNATS(t *testing.T) {
	t.Parallel()
	watermillsuite.Run(t, natsHarness(t), tests.Features{
		ConsumerGroups: true,
		Persistent:     true,
		ForceShort:     true,
	})
}

func TestWatermillQueuePostgres(t *testing.T) {
	t.Parallel()
	store, _ := testdb.Postgres(t)
	watermillsuite.Run(t, queueHarness[pgx.Tx](store), tests.Features{Persistent: true, ForceShort: true})
}

func TestWatermillQueueSQLite(t *testing.T) {
	t.Parallel()
	store, _ := testdb.SQLite(t)
	watermillsuite.Run(t, queueHarness[*sql.Tx](store), tests.Features{Persistent: true, ForceShort: true})
}
