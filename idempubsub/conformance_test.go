package idempubsub_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempubsub"
	"github.com/idemkit/idem/transporttest"
)

const project = "idem-test"

// suiteNames are the durable consumer names transporttest and consumertest open sources under.
// A Pub/Sub subscription only receives messages published after it exists, as a deployment
// creates its subscriptions before producers publish; so NewTopic creates one per name.
var suiteNames = transporttest.SourceNames

// fake starts an in-process pstest server and a client connected to it.
func fake(tb testing.TB) *pubsub.Client {
	tb.Helper()
	srv := pstest.NewServer()
	tb.Cleanup(func() { _ = srv.Close() })
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = conn.Close() })
	c, err := pubsub.NewClient(context.Background(), project, option.WithGRPCConn(conn))
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// createSubscription creates the subscription topic.name (retention 10 minutes, within idem's
// default RedeliveryWindow), unless it exists.
func createSubscription(tb testing.TB, c *pubsub.Client, topic, name string, ordered bool) string {
	tb.Helper()
	sub := "projects/" + project + "/subscriptions/" + topic + "." + name
	_, err := c.SubscriptionAdminClient.CreateSubscription(context.Background(), &pubsubpb.Subscription{
		Name:                     sub,
		Topic:                    "projects/" + project + "/topics/" + topic,
		AckDeadlineSeconds:       10,
		MessageRetentionDuration: durationpb.New(10 * time.Minute),
		EnableMessageOrdering:    ordered,
	})
	if status.Code(err) != codes.AlreadyExists {
		require.NoError(tb, err)
	}
	return sub
}

// newTopic creates a fresh topic and the suite's subscriptions on it (or those of names).
func newTopic(tb testing.TB, c *pubsub.Client, ordered bool, names ...string) string {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	topic := "idem-" + hex.EncodeToString(b[:])
	_, err := c.TopicAdminClient.CreateTopic(context.Background(), &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topic})
	require.NoError(tb, err)
	if len(names) == 0 {
		names = suiteNames
	}
	for _, n := range names {
		createSubscription(tb, c, topic, n, ordered)
	}
	return topic
}

// openSource opens a Source on the subscription topic.name.
func openSource(tb testing.TB, c *pubsub.Client, topic, name string, lease time.Duration, ordered bool) *idempubsub.Source {
	tb.Helper()
	sub := createSubscription(tb, c, topic, name, ordered)
	src, err := idempubsub.NewSource(context.Background(), c, idempubsub.SourceConfig{Subscription: sub, Lease: lease, PullWait: 2 * time.Second})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = src.Close() })
	return src
}

// newSink opens a Sink that flushes its batches after a millisecond.
func newSink(tb testing.TB, c *pubsub.Client) *idempubsub.Sink {
	tb.Helper()
	settings := pubsub.DefaultPublishSettings
	settings.DelayThreshold = time.Millisecond
	sink, err := idempubsub.NewSink(c, idempubsub.SinkConfig{Settings: &settings})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = sink.Close() })
	return sink
}

// harness runs the shared suite over one pstest server, on subscriptions without message
// ordering: the suite holds several messages of one key unsettled at once
// (KeyReuseReachesConsumer), which an ordered subscription delivers one after the other.
// names, when given, are the only subscriptions each topic gets.
func harness(c *pubsub.Client, names ...string) transporttest.Harness {
	return transporttest.Harness{
		Features: transporttest.Features{Takeover: true, DelayedNak: true, Persistent: true, FanOut: true},
		NewTopic: func(tb testing.TB) string { return newTopic(tb, c, false, names...) },
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			return openSource(tb, c, topic, name, lease, false)
		},
		Sink: func(tb testing.TB) idem.Sink { return newSink(tb, c) },
		// The client refuses a message over Pub/Sub's 10 MB request limit (ErrOversizedMessage),
		// the same limit the service enforces; pstest itself refuses nothing.
		Refuse: func(m idem.Message) idem.Message {
			m.Payload = make([]byte, pubsub.MaxPublishRequestBytes+1)
			return m
		},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	transporttest.Exercise(t, harness(fake(t)))
}

// BenchmarkPublishReceive gives its topic only the benchmark's subscription: pstest copies every
// message to each subscription and scans them all every 10 ms, so idle ones would dominate.
func BenchmarkPublishReceive(b *testing.B) {
	transporttest.Benchmark(b, harness(fake(b), "bench"))
}

// TestHandover: two sources on one subscription share its messages; one closing with
// deliveries held loses none (they return after its ack deadline), and its Ack after Close
// still settles (the client stays open).
func TestHandover(t *testing.T) {
	t.Parallel()
	transporttest.ExerciseHandover(t, harness(fake(t)))
}
