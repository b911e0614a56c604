package demo

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
)

const (
	// kafkaPartitions is the partition count of the run's topic: several, so records of
	// different keys are delivered side by side.
	kafkaPartitions = 3
	// kafkaRetryTier is the one delay tier of the run's retry topic: the demo's retries wait at
	// most retryPolicy.Cap.
	kafkaRetryTier = 200 * time.Millisecond
)

// kafkaBroker starts an in-process Kafka cluster (franz-go's kfake) with the topic
// "idem-demo-payments-<run id>" and its retry topic, and runs the scenario through idemkafka
// with the consumer group "ledger-<run id>". Kafka does not deduplicate, so the copies and
// key-reuse messages are produced as they are and the consumer's claims drop them. Closing it
// stops the cluster.
func kafkaBroker(ctx context.Context, runID string, logger *slog.Logger) (b *broker, err error) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, fmt.Errorf("start the in-process Kafka: %w", err)
	}
	closers := []func(){cluster.Close}
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()
	topic := "idem-demo-payments-" + runID
	group := ledgerSubscription + "-" + runID
	tiers := []time.Duration{kafkaRetryTier}
	topics := append([]string{topic}, idemkafka.RetryTopics(topic, group, tiers)...)
	for _, t := range topics {
		if err := cluster.CreateTopic(t, kafkaPartitions, nil); err != nil {
			return nil, fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.FetchMaxWait(pollWait),
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("Kafka client: %w", err)
	}
	closers = append(closers, cl.Close)
	sink, err := idemkafka.NewSink(cl, idemkafka.SinkConfig{})
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	src, err := idemkafka.NewSource(sctx, idemkafka.SourceConfig{
		Topic:          topic,
		Group:          group,
		ClientOptions:  opts,
		Lease:          lease,
		RetryTiers:     tiers,
		CommitInterval: pollWait,
		Logger:         logger,
	})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = src.Close() })
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
		backlog: func(context.Context) (int, error) { return kafkaBacklog(cluster, group, topics), nil },
		close: func() {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		},
	}, nil
}

// kafkaBacklog counts the records of topics past group's committed offsets (from the start of
// a partition the group never committed).
func kafkaBacklog(cluster *kfake.Cluster, group string, topics []string) int {
	var commits map[string]map[int32]kfake.GroupCommit
	if gi := cluster.GroupInfo(group); gi != nil {
		commits = gi.Commits
	}
	n := 0
	for _, t := range topics {
		for _, p := range cluster.PartitionInfos(t) {
			from := p.LogStartOffset
			if c, ok := commits[t][p.Partition]; ok {
				from = c.Offset
			}
			n += int(max(p.HighWatermark-from, 0))
		}
	}
	return n
}
