package e2e_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/consumertest"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/storetest"
	"github.com/idemkit/idem/transporttest"
)

// kafkaTiers are the retry tiers of the test topics; the suite's delays are far below them, so
// its naks go to the first tier and come back after their own delay.
var kafkaTiers = []time.Duration{500 * time.Millisecond, 2 * time.Second}

// kafkaTopicConfig bounds how long the test topics keep records (and so the Source's
// RedeliveryWindow) within the suite's RedeliveryWindow of an hour, as a real deployment must.
var kafkaTopicConfig = map[string]string{"retention.ms": "600000"}

// kafkaHarness runs over an in-process kfake cluster (franz-go's protocol-true fake), so it
// needs no service: a topic per check, a consumer group (with its retry topics) per source
// name, the Source's default order (OrderKey).
func kafkaHarness(tb testing.TB) transporttest.Harness {
	tb.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		tb.Fatalf("kfake: %v", err)
	}
	tb.Cleanup(c.Close)
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}
	// A group member that stops receiving keeps its partitions until it leaves the group. The
	// suite runs a consumer, stops it and runs another on a source of the same name without
	// closing the first, which would strand the first one's partitions; so a new source of a
	// name closes the previous one, as a restarted process leaves the group.
	var mu sync.Mutex
	open := make(map[string]*idemkafka.Source)
	return transporttest.Harness{
		Features: transporttest.Features{DelayedNak: true, Persistent: true},
		NewTopic: func(tb testing.TB) string {
			topic := testdb.Name("k_")
			if err := c.CreateTopic(topic, 2, kafkaTopicConfig); err != nil {
				tb.Fatalf("create topic %s: %v", topic, err)
			}
			return topic
		},
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			group := topic + "." + name
			for _, rt := range idemkafka.RetryTopics(topic, group, kafkaTiers) {
				if err := c.CreateTopic(rt, 2, kafkaTopicConfig); err != nil && c.TopicInfo(rt) == nil {
					tb.Fatalf("create retry topic %s: %v", rt, err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			src, err := idemkafka.NewSource(ctx, idemkafka.SourceConfig{
				Topic: topic, Group: group, ClientOptions: opts, Lease: lease,
				RetryTiers: kafkaTiers, CommitInterval: 20 * time.Millisecond, RevokeWait: time.Second,
			})
			if err != nil {
				tb.Fatalf("source on %s: %v", topic, err)
			}
			tb.Cleanup(func() { _ = src.Close() })
			mu.Lock()
			prev := open[group]
			open[group] = src
			mu.Unlock()
			if prev != nil {
				_ = prev.Close()
			}
			return src
		},
		Sink: func(tb testing.TB) idem.Sink {
			cl, err := kgo.NewClient(opts...)
			if err != nil {
				tb.Fatalf("producer: %v", err)
			}
			tb.Cleanup(cl.Close)
			sink, err := idemkafka.NewSink(cl, idemkafka.SinkConfig{})
			if err != nil {
				tb.Fatal(err)
			}
			return sink
		},
	}
}

func TestRuntimeSQLiteKafka(t *testing.T) {
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		_, b := testdb.SQLite(tb)
		return b, kafkaHarness(tb)
	})
}

func TestRuntimeBatchedSQLiteKafka(t *testing.T) {
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		_, b := testdb.SQLite(tb)
		return b, kafkaHarness(tb)
	}, consumertest.Batched(10))
}
