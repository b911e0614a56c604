package badinput_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/fakepubsub"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idempubsub"
)

// pubsubMaxMessage is Pub/Sub's message limit (10 MB), above the catalogue's oversized payload:
// the consumer's own limit is what refuses that one.
const pubsubMaxMessage = 10_000_000

// pubsubProject is the project of the in-process Pub/Sub server's topics.
const pubsubProject = "idem-badinput"

// pubSub is a topic and its subscription on an in-process pstest server (the client library's
// fake), so the catalogue runs on Pub/Sub without any service. Pub/Sub does not deduplicate, so
// a reused event id is simply published again.
func pubSub(t *testing.T) transport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ps, err := fakepubsub.Start(ctx, pubsubProject)
	require.NoError(t, err)
	t.Cleanup(ps.Close)
	client := ps.Client
	topic := testdb.Name("bad_")
	_, err = ps.CreateTopic(ctx, topic)
	require.NoError(t, err)
	// Messages are kept 10 minutes, within the consumer's RedeliveryWindow; the subscription
	// exists before anything is published, as it must.
	sub, err := ps.Subscribe(ctx, topic, "ledger", fakepubsub.SubscriptionConfig{Retention: 10 * time.Minute})
	require.NoError(t, err)
	src, err := idempubsub.NewSource(ctx, client, idempubsub.SourceConfig{Subscription: sub, Lease: lease, PullWait: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	sink, err := idempubsub.NewSink(client, idempubsub.SinkConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })
	raw := client.Publisher(topic)
	t.Cleanup(raw.Stop)
	tr := transport{
		source:  src,
		publish: sinkPublish(sink, topic),
		publishWithoutID: func(t *testing.T, m idem.Message) {
			t.Helper()
			_, err := idempubsub.Encode(m, "k")
			require.Error(t, err, "the sink refuses an empty event id")
			m.EventID = "placeholder"
			pm, err := idempubsub.Encode(m, "")
			require.NoError(t, err)
			delete(pm.Attributes, idempubsub.AttrEventID) // as a producer that does not know idem sends
			_, err = raw.Publish(context.Background(), pm).Get(context.Background())
			require.NoError(t, err)
		},
		maxPayload: pubsubMaxMessage,
	}
	tr.publishAgain = func(t *testing.T, m idem.Message) { tr.publish(t, m) }
	return tr
}

// TestBadInputPubSub runs the catalogue through Pub/Sub (pstest) on SQLite; it needs no service.
func TestBadInputPubSub(t *testing.T) {
	t.Parallel()
	tr := pubSub(t)
	_, b := testdb.SQLite(t)
	runCatalogue[*sql.Tx](t, b, tr)
}
