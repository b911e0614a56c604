package bench

import (
	"context"
	"strconv"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/fakepubsub"
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
	return e.brokerPipeline(ctx, "pipeline_pubsub", workers, batch, func(ctx context.Context, topic string) (brokerCase, error) {
		return e.openPubSub(ctx, topic, batch > 1)
	})
}

// openPubSub starts a pstest server with the topic and one subscription to it, a source on the
// subscription and a sink; closing stops them all.
//
// Batched (byWallet), the messages' ordering key is their wallet, on a subscription with message
// ordering: Pub/Sub
// (and pstest, which picks messages in Go's map order) delivers in no particular order, so
// without it batches of 100 credit random wallets in random order and 8 concurrent batch
// transactions deadlock on the wallets' rows (3,000 events over 1,000 wallets: about one
// PostgreSQL deadlock a second, each a 1 s deadlock_timeout plus a nak, 16-31 events/s). One
// delivery per wallet in flight is what a deployment with contended rows would configure. Per
// event, a transaction locks one wallet and cannot deadlock: every message has its own key.
func (e *env) openPubSub(ctx context.Context, topic string, byWallet bool) (bc brokerCase, err error) {
	ps, err := fakepubsub.Start(ctx, pubsubProject)
	if err != nil {
		return brokerCase{}, err
	}
	closers := []func(){ps.Close}
	shut := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			shut()
		}
	}()
	if _, err := ps.CreateTopic(ctx, topic); err != nil {
		return brokerCase{}, err
	}
	sub, err := ps.Subscribe(ctx, topic, "pipeline", fakepubsub.SubscriptionConfig{Retention: pubsubRetention, Ordered: byWallet})
	if err != nil {
		return brokerCase{}, err
	}
	src, err := idempubsub.NewSource(ctx, ps.Client, idempubsub.SourceConfig{Subscription: sub, PullWait: time.Second})
	if err != nil {
		return brokerCase{}, err
	}
	closers = append(closers, func() { _ = src.Close() })
	settings := pubsub.DefaultPublishSettings
	settings.DelayThreshold = time.Millisecond
	sc := idempubsub.SinkConfig{Settings: &settings}
	if byWallet {
		wallets := e.opts.Wallets
		sc.Key = func(m idem.Message) string { return strconv.Itoa(walletOf(m, wallets)) }
	}
	sink, err := idempubsub.NewSink(ps.Client, sc)
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
