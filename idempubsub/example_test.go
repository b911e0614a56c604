package idempubsub_test

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

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempubsub"
)

// Publish an event with the Sink and receive it with the Source, against pstest. In production
// the client comes from pubsub.NewClient(ctx, projectID).
func Example() {
	ctx := context.Background()
	srv := pstest.NewServer()
	defer srv.Close()
	conn, _ := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	client, _ := pubsub.NewClient(ctx, "my-project", option.WithGRPCConn(conn))
	defer client.Close()

	// Subscriptions exist before producers publish; enable ordering to keep each key's order.
	_, _ = client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/my-project/topics/orders"})
	_, _ = client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name:                  "projects/my-project/subscriptions/orders-billing",
		Topic:                 "projects/my-project/topics/orders",
		EnableMessageOrdering: true,
	})

	sink, _ := idempubsub.NewSink(client, idempubsub.SinkConfig{})
	defer sink.Close()
	err := sink.Publish(ctx, "orders", idem.Message{EventID: "evt-1", Type: "order.created", Payload: []byte(`{}`)})
	fmt.Println("published:", err)

	src, _ := idempubsub.NewSource(ctx, client, idempubsub.SourceConfig{Subscription: "orders-billing", Lease: 30 * time.Second})
	defer src.Close()
	ds, _ := src.Receive(ctx, 10)
	m := ds[0].Message()
	fmt.Println("event", m.EventID, m.Type, m.Attempt)
	fmt.Println("acked:", ds[0].Ack(ctx))
	// Output:
	// published: <nil>
	// event evt-1 order.created 1
	// acked: <nil>
}
