package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
)

// kafkaRetention is the case topic's retention.ms: it bounds the source's redelivery window
// within the consumer's default (Run refuses a longer one).
const kafkaRetention = time.Hour

// kafkaPartitions spreads the case's records so that the consumer's 8 workers all get some.
const kafkaPartitions = 8

// pipelineKafka runs the pipeline over a topic of an in-process Kafka cluster (kfake) the case
// starts and stops: it measures idemkafka's path and kfake, not a real broker's network and disk.
func (e *env) pipelineKafka(ctx context.Context, workers, batch int) (Result, error) {
	return e.brokerPipeline(ctx, "pipeline_kafka", workers, batch, openKafka)
}

// openKafka starts a one-broker kfake cluster with the topic, a source in one group and a
// producer; closing stops them all.
func openKafka(ctx context.Context, topic string) (brokerCase, error) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return brokerCase{}, fmt.Errorf("start kfake: %w", err)
	}
	if err := cluster.CreateTopic(topic, kafkaPartitions, map[string]string{"retention.ms": strconv.FormatInt(kafkaRetention.Milliseconds(), 10)}); err != nil {
		cluster.Close()
		return brokerCase{}, fmt.Errorf("create topic %s: %w", topic, err)
	}
	opts := []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.FetchMaxWait(100 * time.Millisecond)}
	// No retry topics: the case's handler never naks.
	src, err := idemkafka.NewSource(ctx, idemkafka.SourceConfig{
		Topic: topic, Group: "pipeline", ClientOptions: opts, RetryTiers: []time.Duration{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		cluster.Close()
		return brokerCase{}, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		_ = src.Close()
		cluster.Close()
		return brokerCase{}, fmt.Errorf("producer: %w", err)
	}
	sink, err := idemkafka.NewSink(cl, idemkafka.SinkConfig{})
	if err != nil {
		cl.Close()
		_ = src.Close()
		cluster.Close()
		return brokerCase{}, err
	}
	return brokerCase{
		src: src,
		publish: func(ctx context.Context, msgs []idem.Message) error {
			return sink.Publish(ctx, topic, msgs...)
		},
		close: func() { cl.Close(); _ = src.Close(); cluster.Close() },
	}, nil
}
