package demo

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemamqp"
)

// amqpMessageTTL bounds how long the run's queue keeps a message (it is deleted after the run
// anyway); it is what bounds the source's redelivery window, as MaxAge does for the stream.
const amqpMessageTTL = time.Hour

// amqpBroker declares a work queue "idem.demo.payments.<run id>" (with its delay queues) on the
// RabbitMQ server at url, consumed by this run's source. The relay publishes to it through the
// default exchange. Closing it deletes the queues.
func amqpBroker(ctx context.Context, url, runID string) (*broker, error) {
	queue := "idem.demo.payments." + runID
	dial := idemamqp.DialURL(url, "idem demo")
	// A queue a crashed run leaves behind goes away once unused this long.
	expires := amqp.Table{"x-expires": (2 * amqpMessageTTL).Milliseconds()}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	src, err := idemamqp.NewSource(sctx, dial, idemamqp.SourceConfig{
		Queue:          queue,
		Lease:          lease,
		MessageTTL:     amqpMessageTTL,
		QueueArgs:      expires,
		DelayQueueArgs: expires,
	})
	if err != nil {
		return nil, err
	}
	sink, err := idemamqp.NewSink(sctx, dial, idemamqp.SinkConfig{})
	if err != nil {
		_ = src.Close()
		return nil, err
	}
	conn, err := dial(sctx)
	if err != nil {
		_ = src.Close()
		_ = sink.Close()
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = src.Close()
		_ = sink.Close()
		_ = conn.Close()
		return nil, fmt.Errorf("inspection channel: %w", err)
	}
	queues := []string{queue}
	for _, tier := range idemamqp.DelayTiersDefault {
		queues = append(queues, idemamqp.DelayQueueName(queue, tier))
	}
	// RabbitMQ does not deduplicate: a copy or a key-reuse message is simply published again.
	again := func(ctx context.Context, topic string, msgs []idem.Message) (int, int, error) {
		if err := sink.Publish(ctx, topic, msgs...); err != nil {
			return 0, 0, err
		}
		return len(msgs), 0, nil
	}
	return &broker{
		topic:  queue,
		source: src,
		sink:   sink,
		again:  again,
		reuse: func(ctx context.Context, topic string, msgs []idem.Message) error {
			_, _, err := again(ctx, topic, msgs)
			return err
		},
		redelivery: src.RedeliveryWindow(),
		// Ready messages of the work queue and of the delay queues (naks waiting out their
		// delay); deliveries in the consumer's hands are not counted.
		backlog: func(ctx context.Context) (int, error) {
			n := 0
			for _, q := range queues {
				st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
				if err != nil {
					return 0, fmt.Errorf("inspect queue %s: %w", q, err)
				}
				n += st.Messages
			}
			return n, nil
		},
		close: func() {
			_ = src.Close()
			_ = sink.Close()
			for _, q := range queues {
				_, _ = ch.QueueDelete(q, false, false, false)
			}
			_ = conn.Close()
		},
	}, nil
}
