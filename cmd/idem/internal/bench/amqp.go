package bench

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemamqp"
)

// amqpMessageTTL bounds how long the case's queue keeps a message, which keeps the source's
// redelivery window within the consumer's default (Run refuses a longer one); the queues are
// deleted after the case anyway.
const amqpMessageTTL = time.Hour

// pipelineAMQP runs the pipeline over a fresh RabbitMQ work queue (and its delay queues),
// deleted afterwards.
func (e *env) pipelineAMQP(ctx context.Context, workers, batch int) (Result, error) {
	return e.brokerPipeline(ctx, "pipeline_amqp", workers, batch, e.openAMQP)
}

// openAMQP declares the work queue topic on the RabbitMQ server of Options.AMQPURL; the sink
// publishes to it through the default exchange.
func (e *env) openAMQP(ctx context.Context, topic string) (brokerCase, error) {
	bu, err := connect.ParseBroker(e.opts.AMQPURL)
	if err != nil {
		return brokerCase{}, err
	}
	if bu.Kind != connect.BrokerAMQP {
		return brokerCase{}, fmt.Errorf("broker %s is not amqp://", bu)
	}
	dial := idemamqp.DialURL(bu.URL, "idem bench")
	// A queue a crashed run leaves behind goes away once unused this long.
	expires := amqp.Table{"x-expires": (2 * amqpMessageTTL).Milliseconds()}
	src, err := idemamqp.NewSource(ctx, dial, idemamqp.SourceConfig{
		Queue: topic, MessageTTL: amqpMessageTTL, QueueArgs: expires, DelayQueueArgs: expires,
	})
	if err != nil {
		return brokerCase{}, err
	}
	sink, err := idemamqp.NewSink(ctx, dial, idemamqp.SinkConfig{})
	if err != nil {
		_ = src.Close()
		return brokerCase{}, err
	}
	return brokerCase{
		src: src,
		publish: func(ctx context.Context, msgs []idem.Message) error {
			return sink.Publish(ctx, topic, msgs...)
		},
		close: func() {
			_ = src.Close()
			_ = sink.Close()
			conn, err := dial(context.WithoutCancel(ctx))
			if err != nil {
				return // x-expires removes the queues
			}
			defer func() { _ = conn.Close() }()
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			queues := []string{topic}
			for _, tier := range idemamqp.DelayTiersDefault {
				queues = append(queues, idemamqp.DelayQueueName(topic, tier))
			}
			for _, q := range queues {
				_, _ = ch.QueueDelete(q, false, false, false)
			}
		},
	}, nil
}
