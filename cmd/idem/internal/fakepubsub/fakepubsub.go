// Package fakepubsub runs Google's in-process Pub/Sub server (pstest, from the client library)
// with a client connected to it, and creates its topics and subscriptions: the one setup that
// the demo's pubsub://embedded, the bench's pipeline_pubsub and the Pub/Sub tests share.
package fakepubsub

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// AckDeadlineSeconds is every subscription's ack deadline: pstest, like Pub/Sub, refuses one
// under 10 s; idempubsub's Source sets each delivery's deadline to its lease on receipt.
const AckDeadlineSeconds = 10

// Server is a running pstest server and a client of it, in one project.
type Server struct {
	// Srv is the server, for what only it can tell (Messages: what was published and acked).
	Srv *pstest.Server
	// Client is connected to Srv without credentials.
	Client *pubsub.Client
	// Project is the project of every topic and subscription.
	Project string
	conn    *grpc.ClientConn
}

// Start starts a server and connects a client to it; Close stops both.
func Start(ctx context.Context, project string) (*Server, error) {
	srv := pstest.NewServer()
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("connect to the in-process Pub/Sub: %w", err), srv.Close())
	}
	client, err := pubsub.NewClient(ctx, project, option.WithGRPCConn(conn))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("Pub/Sub client: %w", err), conn.Close(), srv.Close())
	}
	return &Server{Srv: srv, Client: client, Project: project, conn: conn}, nil
}

// Close stops the client, its connection and the server.
func (s *Server) Close() {
	_ = s.Client.Close()
	_ = s.conn.Close()
	_ = s.Srv.Close()
}

// TopicName is the full name of topic.
func (s *Server) TopicName(topic string) string {
	return "projects/" + s.Project + "/topics/" + topic
}

// CreateTopic creates topic and returns its full name.
func (s *Server) CreateTopic(ctx context.Context, topic string) (string, error) {
	name := s.TopicName(topic)
	if _, err := s.Client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: name}); err != nil {
		return "", fmt.Errorf("create topic %s: %w", topic, err)
	}
	return name, nil
}

// SubscriptionConfig is what differs between the subscriptions the callers create.
type SubscriptionConfig struct {
	// Retention is how long the subscription keeps messages; it bounds the Source's redelivery
	// window, which the consumer checks against its own.
	Retention time.Duration
	// Ordered turns on message ordering (by the messages' ordering keys).
	Ordered bool
}

// Subscribe creates the subscription name ("<topic>.<name>") on topic, or finds it when it
// exists already, and returns its full name.
func (s *Server) Subscribe(ctx context.Context, topic, name string, cfg SubscriptionConfig) (string, error) {
	sub := "projects/" + s.Project + "/subscriptions/" + topic + "." + name
	_, err := s.Client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name:                     sub,
		Topic:                    s.TopicName(topic),
		AckDeadlineSeconds:       AckDeadlineSeconds,
		MessageRetentionDuration: durationpb.New(cfg.Retention),
		EnableMessageOrdering:    cfg.Ordered,
	})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return "", fmt.Errorf("create subscription %s: %w", sub, err)
	}
	return sub, nil
}

// Backlog counts the messages published to topic that no subscriber acked; with one
// subscription per topic, a message acked once is settled.
func (s *Server) Backlog(topic string) int {
	name, n := s.TopicName(topic), 0
	for _, m := range s.Srv.Messages() {
		if m.Topic == name && m.Acks == 0 {
			n++
		}
	}
	return n
}
