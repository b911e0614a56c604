package demo

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

const (
	// pubsubProject is the project of the in-process Pub/Sub server.
	pubsubProject = "idem-demo"
	// pubsubRetention is the subscription's message retention: within idem's default
	// RedeliveryWindow, which Run checks, and far longer than a run.
	pubsubRetention = time.Hour
)

// pubsubBroker starts an in-process Pub/Sub server (pstest), creates the topic
// "idem-demo-payments-<run id>" and its subscription "ledger", and runs the scenario through
// idempubsub. Pub/Sub does not deduplicate, so the copies and key-reuse messages are published
// as they are and the consumer's claims drop them. Closing it stops the server.
func pubsubBroker(ctx context.Context, runID string) (b *broker, err error) {
	srv := pstest.NewServer()
	var closers []func()
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()
	closers = append(closers, func() { _ = srv.Close() })
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to the in-process Pub/Sub: %w", err)
	}
	closers = append(closers, func() { _ = conn.Close() })
	client, err := pubsub.NewClient(ctx, pubsubProject, option.WithGRPCConn(conn))
	if err != nil {
		return nil, fmt.Errorf("Pub/Sub client: %w", err)
	}
	closers = append(closers, func() { _ = client.Close() })

	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	topic := "idem-demo-payments-" + runID
	topicName := "projects/" + pubsubProject + "/topics/" + topic
	if _, err := client.TopicAdminClient.CreateTopic(sctx, &pubsubpb.Topic{Name: topicName}); err != nil {
		return nil, fmt.Errorf("create topic %s: %w", topic, err)
	}
	subName := "projects/" + pubsubProject + "/subscriptions/" + topic + "." + ledgerSubscription
	if _, err := client.SubscriptionAdminClient.CreateSubscription(sctx, &pubsubpb.Subscription{
		Name:  subName,
		Topic: topicName,
		// pstest refuses a subscription deadline under 10 s (as Pub/Sub does); the source sets
		// each delivery's deadline to lease on receipt.
		AckDeadlineSeconds:       10,
		MessageRetentionDuration: durationpb.New(pubsubRetention),
	}); err != nil {
		return nil, fmt.Errorf("create subscription %s: %w", subName, err)
	}
	src, err := idempubsub.NewSource(sctx, client, idempubsub.SourceConfig{Subscription: subName, Lease: lease, PullWait: time.Second})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = src.Close() })
	sink, err := idempubsub.NewSink(client, idempubsub.SinkConfig{})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = sink.Close() })
	return &broker{
		topic:  topic,
		source: src,
		sink:   sink,
		again: func(ctx context.Context, topic string, msgs []idem.Message) (int, int, error) {
			if err := sink.Publish(ctx, topic, msgs...); err != nil {
				return 0, 0, err
			}
			return len(msgs), 0, nil
		},
		backlog: func(context.Context) (int, error) { return pubsubBacklog(srv, topicName), nil },
		close: func() {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		},
	}, nil
}

// pubsubBacklog counts the messages published to topic (full name) that the server has not seen
// acked. The topic has one subscription, so a message acked once is settled.
func pubsubBacklog(srv *pstest.Server, topic string) int {
	n := 0
	for _, m := range srv.Messages() {
		if m.Topic == topic && m.Acks == 0 {
			n++
		}
	}
	return n
}
