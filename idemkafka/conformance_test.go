package idemkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/transporttest"
)

// Test topics have testPartitions partitions, refuse records above testMaxMessageBytes (so the
// suite can inject a refusal) and come with retry topics for testTiers.
const (
	testPartitions      = 3
	testMaxMessageBytes = 64 << 10
)

// testTiers are short, so the suite's delayed naks (2s) land in a tier of their own.
var testTiers = []time.Duration{500 * time.Millisecond, 2 * time.Second}

// cluster starts an in-process kfake cluster for one test.
func cluster(tb testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	tb.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	require.NoError(tb, err)
	tb.Cleanup(c.Close)
	return c
}

// clientOptions are the connection options of every test client: quick heartbeats, so that a
// rebalance completes in a fraction of a second, and short fetch waits.
func clientOptions(c *kfake.Cluster) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.MetadataMinAge(50 * time.Millisecond),
	}
}

// newTopic creates a fresh topic; each Source creates its group's retry topics (openSource).
func newTopic(tb testing.TB, c *kfake.Cluster, partitions int32) string {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	topic := "idem-" + hex.EncodeToString(b[:])
	require.NoError(tb, c.CreateTopic(topic, partitions, map[string]string{"max.message.bytes": strconv.Itoa(testMaxMessageBytes)}))
	return topic
}

// createRetryTopics creates group's retry topics of topic, like topic (partitions and configs),
// unless they exist.
func createRetryTopics(tb testing.TB, c *kfake.Cluster, topic, group string, tiers []time.Duration) {
	tb.Helper()
	cfg := make(map[string]string)
	if ti := c.TopicInfo(topic); ti != nil {
		for k, v := range ti.Configs {
			if v != nil {
				cfg[k] = *v
			}
		}
	}
	for _, rt := range idemkafka.RetryTopics(topic, group, tiers) {
		if err := c.CreateTopic(rt, int32(len(c.PartitionInfos(topic))), cfg); err != nil && c.TopicInfo(rt) == nil {
			tb.Fatalf("create retry topic %s: %v", rt, err)
		}
	}
}

// openSource opens a Source on topic in group with the test tiers.
func openSource(tb testing.TB, c *kfake.Cluster, topic, group string, lease time.Duration, mod ...func(*idemkafka.SourceConfig)) *idemkafka.Source {
	tb.Helper()
	cfg := idemkafka.SourceConfig{
		Topic:          topic,
		Group:          group,
		ClientOptions:  clientOptions(c),
		Lease:          lease,
		RetryTiers:     testTiers,
		CommitInterval: 20 * time.Millisecond,
		RevokeWait:     time.Second,
	}
	for _, m := range mod {
		m(&cfg)
	}
	createRetryTopics(tb, c, topic, group, cfg.RetryTiers)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src, err := idemkafka.NewSource(ctx, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = src.Close() })
	return src
}

// newSink opens a producer client and a Sink over it.
func newSink(tb testing.TB, c *kfake.Cluster) *idemkafka.Sink {
	tb.Helper()
	cl, err := kgo.NewClient(clientOptions(c)...)
	require.NoError(tb, err)
	tb.Cleanup(cl.Close)
	sink, err := idemkafka.NewSink(cl, idemkafka.SinkConfig{})
	require.NoError(tb, err)
	return sink
}

// harness runs the shared suite over one kfake cluster: a topic (with retry topics) per check,
// a consumer group per source name. The suite holds several unsettled messages of one key at
// once (KeyReuseReachesConsumer), so its sources deliver in OrderNone; ordered delivery is
// checked by this package's own tests.
func harness(c *kfake.Cluster) transporttest.Harness { return harnessOrdered(c, idemkafka.OrderNone) }

// harnessOrdered is harness with sources delivering in order.
func harnessOrdered(c *kfake.Cluster, order idemkafka.Order) transporttest.Harness {
	return transporttest.Harness{
		Features: transporttest.Features{DelayedNak: true, Persistent: true},
		NewTopic: func(tb testing.TB) string { return newTopic(tb, c, testPartitions) },
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			return openSource(tb, c, topic, topic+"."+name, lease, func(cfg *idemkafka.SourceConfig) { cfg.Order = order })
		},
		Sink: func(tb testing.TB) idem.Sink { return newSink(tb, c) },
		// Test topics store records up to testMaxMessageBytes (max.message.bytes).
		Refuse: func(m idem.Message) idem.Message {
			// Random bytes: kgo compresses batches, and zeros would shrink below the limit.
			m.Payload = make([]byte, 2*testMaxMessageBytes)
			_, _ = rand.Read(m.Payload)
			return m
		},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	transporttest.Exercise(t, harness(cluster(t)))
}

func BenchmarkPublishReceive(b *testing.B) {
	for _, order := range []idemkafka.Order{idemkafka.OrderKey, idemkafka.OrderNone} {
		b.Run(order.String(), func(b *testing.B) {
			transporttest.Benchmark(b, harnessOrdered(cluster(b), order))
		})
	}
}

func TestHandover(t *testing.T) {
	t.Parallel()
	transporttest.ExerciseHandover(t, harness(cluster(t)))
}
