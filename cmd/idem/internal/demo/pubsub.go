package demo

import (
	"context"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/fakepubsub"
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
	ps, err := fakepubsub.Start(ctx, pubsubProject)
	if err != nil {
		return nil, err
	}
	closers := []func(){ps.Close}
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	topic := "idem-demo-payments-" + runID
	if _, err := ps.CreateTopic(sctx, topic); err != nil {
		return nil, err
	}
	subName, err := ps.Subscribe(sctx, topic, ledgerSubscription, fakepubsub.SubscriptionConfig{Retention: pubsubRetention})
	if err != nil {
		return nil, err
	}
	src, err := idempubsub.NewSource(sctx, ps.Client, idempubsub.SourceConfig{Subscription: subName, Lease: lease, PullWait: time.Second})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = src.Close() })
	sink, err := idempubsub.NewSink(ps.Client, idempubsub.SinkConfig{})
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
		backlog: func(context.Context) (int, error) { return ps.Backlog(topic), nil },
		close: func() {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		},
	}, nil
}
