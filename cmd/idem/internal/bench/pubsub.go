package bench

import (
	"context"
	"fmt"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempubsub"
)

// pubsubProject is the project of the in-process Pub/Sub server's topics.
const pubsubProject = "idem-bench"

// pubsubRetention is the subscription's message retention: it bounds the source's redelivery
// window within the consumer's default (Run refuses a longer one).
const pubsubRetention = time.Hour

// pipelinePubSub runs the pipeline over a topic of an in-process Pub/Sub server (pstest) the
// case starts and stops: it measures idempubsub's path and pstest, not Google's service.
func (e *env) pipelinePubSub(ctx context.Context, workers, batch int) (Result, error) {
	return e.brokerPipeline(ctx, "pipeline_pubsub", workers, batch, openPubSub)
}

// openPubSub starts a pstest server with the topic and one subscription to it, a source on the
// subscription and a sink; closing stops them all.
func openPubSub(ctx context.Context, topic string) (bc brokerCase, err error) {
	srv := pstest.NewServer()
	var closers []func()
	shut := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	closers = append(closers, func() { _ = srv.Close() })
	defer func() {
		if err != nil {
			shut()
		}
	}()
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return brokerCase{}, fmt.Errorf("pstest connection: %w", err)
	}
	closers = append(closers, func() { _ = conn.Close() })
	client, err := pubsub.NewClient(ctx, pubsubProject, option.WithGRPCConn(conn))
	if err != nil {
		return brokerCase{}, fmt.Errorf("pubsub client: %w", err)
	}
	closers = append(closers, func() { _ = client.Close() })
	topicName := "projects/" + pubsubProject + "/topics/" + topic
	if _, err := client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topicName}); err != nil {
		return brokerCase{}, fmt.Errorf("create topic %s: %w", topic, err)
	}
	sub := "projects/" + pubsubProject + "/subscriptions/" + topic + ".pipeline"
	if _, err := client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: sub, Topic: topicName, AckDeadlineSeconds: 10, MessageRetentionDuration: durationpb.New(pubsubRetention),
	}); err != nil {
		return brokerCase{}, fmt.Errorf("create subscription %s: %w", sub, err)
	}
	src, err := idempubsub.NewSource(ctx, client, idempubsub.SourceConfig{Subscription: sub, PullWait: time.Second})
	if err != nil {
		return brokerCase{}, err
	}
	closers = append(closers, func() { _ = src.Close() })
	settings := pubsub.DefaultPublishSettings
	settings.DelayThreshold = time.Millisecond
	sink, err := idempubsub.NewSink(client, idempubsub.SinkConfig{Settings: &settings})
	if err != nil {
		return brokerCase{}, err
	}
	closers = append(closers, func() { _ = sink.Close() })
	return brokerCase{
		src: src,
		publish: func(ctx context.Context, msgs []idem.Message) error {
			return sink.Publish(ctx, topic, msgs...)
		},
		close: shut,
	}, nil
}
