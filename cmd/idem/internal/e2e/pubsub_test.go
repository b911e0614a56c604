package e2e_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/fakepubsub"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/consumertest"
	"github.com/idemkit/idem/idempubsub"
	"github.com/idemkit/idem/storetest"
	"github.com/idemkit/idem/transporttest"
)

const pubsubProject = "idem-e2e"

// pubsubNames are the durable consumer names consumertest opens sources under. A subscription
// receives only what is published after it exists, as in a deployment that creates its
// subscriptions before producers publish, so each topic gets them when it is created.
var pubsubNames = []string{"ledger"}

// pubsubHarness runs over an in-process pstest server (the client library's fake), so it needs
// no service: a topic per check, a subscription per source name, without message ordering (the
// suite's checks hold several messages of one key at once). Subscriptions keep messages 10
// minutes, so the Source's RedeliveryWindow stays within the consumer's.
func pubsubHarness(tb testing.TB) transporttest.Harness {
	tb.Helper()
	return pubsubHarnessNamed(tb, pubsubNames)
}

// pubsubHarnessNamed is pubsubHarness whose topics get the subscriptions names when created.
func pubsubHarnessNamed(tb testing.TB, names []string) transporttest.Harness {
	tb.Helper()
	ps, err := fakepubsub.Start(context.Background(), pubsubProject)
	if err != nil {
		tb.Fatalf("pstest: %v", err)
	}
	tb.Cleanup(ps.Close)
	client := ps.Client
	subscribe := func(tb testing.TB, topic, name string) string {
		sub, err := ps.Subscribe(context.Background(), topic, name, fakepubsub.SubscriptionConfig{Retention: 10 * time.Minute})
		if err != nil {
			tb.Fatal(err)
		}
		return sub
	}
	return transporttest.Harness{
		Features: transporttest.Features{Takeover: true, DelayedNak: true, Persistent: true, FanOut: true},
		NewTopic: func(tb testing.TB) string {
			topic := testdb.Name("ps_")
			if _, err := ps.CreateTopic(context.Background(), topic); err != nil {
				tb.Fatal(err)
			}
			for _, n := range names {
				subscribe(tb, topic, n)
			}
			return topic
		},
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			src, err := idempubsub.NewSource(context.Background(), client, idempubsub.SourceConfig{
				Subscription: subscribe(tb, topic, name), Lease: lease, PullWait: 2 * time.Second,
			})
			if err != nil {
				tb.Fatalf("source on %s: %v", topic, err)
			}
			tb.Cleanup(func() { _ = src.Close() })
			return src
		},
		Sink: func(tb testing.TB) idem.Sink {
			settings := pubsub.DefaultPublishSettings
			settings.DelayThreshold = time.Millisecond
			sink, err := idempubsub.NewSink(client, idempubsub.SinkConfig{Settings: &settings})
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { _ = sink.Close() })
			return sink
		},
	}
}

func TestRuntimeSQLitePubSub(t *testing.T) {
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		_, b := testdb.SQLite(tb)
		return b, pubsubHarness(tb)
	})
}

func TestRuntimeBatchedSQLitePubSub(t *testing.T) {
	wholeMatrix(t, "TestRuntimeSQLitePubSub and TestRuntimeBatchedMySQLNATS")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		_, b := testdb.SQLite(tb)
		return b, pubsubHarness(tb)
	}, consumertest.Batched(10))
}
