package idem

import (
	"context"
	"time"
)

// Source is the receiving side of a transport: a broker consumer, or the queue table.
// Implementations live in the transport packages (idemnats, idemqueue, …); package
// transporttest checks them against a real broker.
type Source interface {
	// Receive blocks until at least one delivery is available or ctx ends, and returns at most
	// max deliveries. It returns ctx.Err() when ctx ends.
	Receive(ctx context.Context, max int) ([]Delivery, error)
	// Lease is how long a delivery stays invisible to other consumers before the broker
	// redelivers it (JetStream AckWait, queue-table lease). The consumer extends it at a third.
	Lease() time.Duration
	// Name identifies the source (stream/durable, queue) in logs and dead letters.
	Name() string
	// Close releases the source's resources; deliveries not acked are redelivered later.
	Close() error
}

// Delivery is one received message and the handle to settle it with the broker.
type Delivery interface {
	// Message returns the message; its Attempt comes from the broker's delivery count.
	Message() Message
	// Ack settles the delivery as done.
	Ack(ctx context.Context) error
	// Nak asks for redelivery after delay, through the broker's own mechanism.
	Nak(ctx context.Context, delay time.Duration) error
	// Extend pushes the lease out by the source's lease time (JetStream InProgress).
	Extend(ctx context.Context) error
	// Term settles the delivery as never to be redelivered (it is in the dead-letter queue).
	Term(ctx context.Context) error
}

// TopicReporter is a Delivery that knows the topic it arrived on (the JetStream subject): the
// consumer stores it with the delivery's dead letter (DeadLetter.Topic), so that a replay goes
// back there without the operator naming it.
type TopicReporter interface {
	Topic() string
}

// DeliveryLimiter is a Source whose broker stops delivering a message after a number of
// deliveries (JetStream MaxDeliver, a RabbitMQ quorum queue's x-delivery-limit). At that limit
// the broker drops the message without telling the consumer, so the consumer can neither
// handle nor dead-letter it; Run refuses a limit the retry policy could reach (CheckSourceLimits).
type DeliveryLimiter interface {
	// DeliveryLimit is the most deliveries of one message, or 0 for no limit.
	DeliveryLimit() int
}

// RedeliveryWindower is a Source that knows how long after publishing it can deliver the same
// event again (a stream's MaxAge, a queue's message TTL). Run refuses a source whose window is
// longer than the consumer's RedeliveryWindow, which its claim retention is checked against.
type RedeliveryWindower interface {
	RedeliveryWindow() time.Duration
}

// TxAcker is a Delivery that can settle itself inside the consumer's transaction (the queue
// table does: it deletes its row in the claim's transaction, fenced by its lease token, so a
// worker that lost its lease rolls back instead of committing over the new owner).
type TxAcker[TTx any] interface {
	AckTx(ctx context.Context, tx TTx) error
}

// Sink is the publishing side of a transport.
type Sink interface {
	// Publish sends messages with their EventID as the broker's message id (so the broker's
	// deduplication drops a republish) and returns once the broker confirmed every one.
	Publish(ctx context.Context, topic string, msgs ...Message) error
	// Close releases the sink's resources.
	Close() error
}
