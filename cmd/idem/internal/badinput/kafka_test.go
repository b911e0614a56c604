package badinput_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemkafka"
)

// kafkaMaxMessage is the largest record the test topic and producer take: above the catalogue's
// oversized payload, so that the consumer's own limit is what refuses it.
const kafkaMaxMessage = 8 << 20

// kafka is a topic (with its retry topics) on an in-process kfake cluster, franz-go's
// protocol-true fake, so the catalogue runs on Kafka without any service. Kafka does not
// deduplicate, so a reused event id is simply published again.
func kafka(t *testing.T) transport {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.FetchMaxWait(200 * time.Millisecond), kgo.ProducerBatchMaxBytes(kafkaMaxMessage)}
	topic := testdb.Name("bad_")
	// Records are kept 10 minutes, within the consumer's RedeliveryWindow of an hour.
	cfg := map[string]string{"max.message.bytes": strconv.Itoa(kafkaMaxMessage), "retention.ms": "600000"}
	for _, name := range append([]string{topic}, idemkafka.RetryTopics(topic, "ledger", idemkafka.RetryTiersDefault)...) {
		require.NoError(t, c.CreateTopic(name, 2, cfg))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src, err := idemkafka.NewSource(ctx, idemkafka.SourceConfig{Topic: topic, Group: "ledger", ClientOptions: opts, Lease: lease})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	cl, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	sink, err := idemkafka.NewSink(cl, idemkafka.SinkConfig{})
	require.NoError(t, err)
	tr := transport{
		source:  src,
		publish: sinkPublish(sink, topic),
		publishWithoutID: func(t *testing.T, m idem.Message) {
			t.Helper()
			_, err := idemkafka.EncodeRecord(topic, nil, m)
			require.Error(t, err, "the sink refuses an empty event id")
			m.EventID = "placeholder"
			r, err := idemkafka.EncodeRecord(topic, nil, m)
			require.NoError(t, err)
			// No Idem-Event-Id, as a producer that does not know idem sends.
			hs := r.Headers[:0]
			for _, h := range r.Headers {
				if h.Key != idemkafka.HeaderEventID {
					hs = append(hs, h)
				}
			}
			r.Headers = hs
			require.NoError(t, cl.ProduceSync(context.Background(), r).FirstErr())
		},
		maxPayload: kafkaMaxMessage,
	}
	tr.publishAgain = func(t *testing.T, m idem.Message) { tr.publish(t, m) }
	return tr
}

// TestBadInputKafka runs the catalogue through Kafka (kfake) on SQLite; it needs no service.
func TestBadInputKafka(t *testing.T) {
	t.Parallel()
	tr := kafka(t)
	_, b := testdb.SQLite(t)
	runCatalogue[*sql.Tx](t, b, tr)
}
