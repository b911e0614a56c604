package idemamqp

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/retry"
)

// Defaults and bounds of SourceConfig.
const (
	// ConsumerTimeoutDefault is RabbitMQ's own default consumer_timeout (since 3.8.15): a
	// delivery left unacknowledged this long makes the broker close the whole channel.
	ConsumerTimeoutDefault = 30 * time.Minute
	// LeaseDefault is the lease when SourceConfig.Lease is zero: how long a delivery stays with a
	// worker that neither settles nor extends it before the source gives it back to the queue.
	// The consumer extends it at a third while a handler runs, so it need not cover the slowest.
	LeaseDefault = 30 * time.Second
	// PrefetchDefault is the channel's QoS prefetch count when SourceConfig.Prefetch is zero. It
	// bounds how many deliveries all workers together may hold unsettled: the broker sends no
	// more until some are acked, so it must exceed Workers × batch size of the consumer.
	PrefetchDefault = 256
	// ReconnectMinDefault and ReconnectMaxDefault bound the backoff between attempts to
	// reconnect after the connection or channel was lost.
	ReconnectMinDefault = 100 * time.Millisecond
	ReconnectMaxDefault = 10 * time.Second
	// QueueClassic and QueueQuorum are the queue types a Source declares.
	QueueClassic = "classic"
	QueueQuorum  = "quorum"
	// consumerTimeoutMargin is how long before consumer_timeout an extension is refused and the
	// delivery given back: the broker checks the timeout only periodically, and a refused
	// extension costs one redelivery where a closed channel costs every unacked delivery.
	consumerTimeoutMargin = time.Minute
)

// DelayTiersDefault are the delay queues a Source declares when SourceConfig.DelayTiers is
// nil. A Nak(delay) waits in the smallest tier at least as long as delay (see DelayTier).
var DelayTiersDefault = []time.Duration{
	100 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second,
	30 * time.Second, time.Minute, 5 * time.Minute, 15 * time.Minute, time.Hour,
}

// SourceConfig configures a Source: the work queue it consumes and the delay queues its naks
// wait in.
type SourceConfig struct {
	// Queue is the work queue to consume (required). The Source declares it durable, with the
	// arguments below; producers route to it through a binding or the default exchange.
	// Sources with the same Queue are competing consumers sharing its messages.
	Queue string
	// QueueType is QueueClassic (default) or QueueQuorum. Quorum queues replicate and support
	// DeliveryLimit; a queue's type cannot change once declared.
	QueueType string
	// DeliveryLimit, on a quorum queue only, is the broker's x-delivery-limit: how often one
	// queue message may be returned (lease lost, channel lost) before the broker drops it or
	// dead-letters it to its own DLX. 0 (default) declares none; RabbitMQ 4.0 and later then
	// apply their own default of 20 (QuorumDeliveryLimitDefault) to a quorum queue, which
	// Source.DeliveryLimit reports so that the consumer checks it against its retry policy. It is
	// only a safety net against a message that crashes every worker, and must be at least the
	// retry policy's attempts (see Retry) plus idem.DeliveryLimitMargin: when the broker gives up
	// first, the message is neither handled nor in idem's dead-letter table. A limit set by a
	// broker policy instead is not visible to idem; keep it as high.
	DeliveryLimit int
	// Retry is the consumer's retry policy, used only to check DeliveryLimit against its
	// attempts (zero fields mean the policy's defaults, as in the consumer).
	Retry retry.Policy
	// Bindings bind the work queue to exchanges, each declared durable first (of kind
	// Binding.Kind) unless it exists. Without bindings the queue gets what producers publish to
	// the default exchange with its name as routing key (what `idem relay` does). The usual
	// RabbitMQ shape is one exchange per event family and one queue per consumer (ledger@v1,
	// mailer@v1), each bound to it, so that every consumer gets every event.
	Bindings []Binding
	// QueueArgs are extra arguments of the work queue (x-max-length, x-message-ttl, x-expires,
	// …). They must match any earlier declaration of the queue, or the broker refuses it.
	QueueArgs amqp.Table
	// DelayTiers are the delays of the delay queues, in increasing order (default
	// DelayTiersDefault). Each is a queue with that message TTL that dead-letters back to Queue.
	DelayTiers []time.Duration
	// DelayQueueArgs are extra arguments of every delay queue (x-expires in tests, …).
	DelayQueueArgs amqp.Table
	// Prefetch is the channel's QoS prefetch count: how many unacknowledged deliveries the
	// broker sends ahead (default PrefetchDefault).
	Prefetch int
	// Lease is how long a received delivery stays with its worker without Ack, Nak, Term or
	// Extend before the source gives it back to the queue (default LeaseDefault). RabbitMQ has
	// no per-message visibility timeout, so the source keeps this one itself.
	Lease time.Duration
	// ConsumerTimeout is the broker's consumer_timeout this source assumes (default
	// ConsumerTimeoutDefault): the hard limit on how long one delivery may stay unacked, which
	// Extend cannot move. Set it to the server's value when the operator changed it.
	ConsumerTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the exponential backoff between reconnection attempts
	// (defaults ReconnectMinDefault and ReconnectMaxDefault).
	ReconnectMin, ReconnectMax time.Duration
	// Tenant, when set, is the tenant of every message from this source: the queue is bound to
	// one tenant by its credentials. A different tenant claimed in the Idem-Tenant header is kept
	// in Headers under that name, so an Authenticator can refuse the mismatch.
	Tenant string
	// MessageTTL, when the work queue has an x-message-ttl (set here, not in QueueArgs), is how
	// long the broker keeps an undelivered message; it bounds RedeliveryWindow.
	MessageTTL time.Duration
	// Logger receives reconnection notices (default: discarded).
	Logger *slog.Logger
}

// Binding binds a work queue to an exchange.
type Binding struct {
	// Exchange is the exchange's name (required; the default exchange cannot be bound).
	Exchange string
	// Kind is the exchange's type when the source declares it: "topic" (default), "direct",
	// "fanout" or "headers". An existing exchange of another kind makes the declaration fail.
	Kind string
	// RoutingKey is the binding key ("payments.#" on a topic exchange).
	RoutingKey string
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SourceConfig) WithDefaults() SourceConfig {
	if c.QueueType == "" {
		c.QueueType = QueueClassic
	}
	if c.DelayTiers == nil {
		c.DelayTiers = slices.Clone(DelayTiersDefault)
	}
	if c.Prefetch == 0 {
		c.Prefetch = PrefetchDefault
	}
	if c.Lease == 0 {
		c.Lease = LeaseDefault
	}
	if c.ConsumerTimeout == 0 {
		c.ConsumerTimeout = ConsumerTimeoutDefault
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = ReconnectMinDefault
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = ReconnectMaxDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if len(c.Bindings) > 0 {
		c.Bindings = slices.Clone(c.Bindings)
		for i := range c.Bindings {
			if c.Bindings[i].Kind == "" {
				c.Bindings[i].Kind = amqp.ExchangeTopic
			}
		}
	}
	return c
}

// validate reports every invalid field of a config with defaults applied, naming each.
func (c SourceConfig) validate() error {
	var errs []error
	if c.Queue == "" {
		errs = append(errs, errors.New("Queue is empty"))
	} else if len(c.Queue)+len(delaySuffix)+16 > 255 {
		errs = append(errs, fmt.Errorf("Queue is %d bytes, want at most %d so that its delay queues' names fit in 255", len(c.Queue), 255-len(delaySuffix)-16))
	}
	switch c.QueueType {
	case QueueClassic, QueueQuorum:
	default:
		errs = append(errs, fmt.Errorf("QueueType is %q, want %q or %q", c.QueueType, QueueClassic, QueueQuorum))
	}
	if c.DeliveryLimit < 0 {
		errs = append(errs, fmt.Errorf("DeliveryLimit is %d, want 0 (none) or more", c.DeliveryLimit))
	}
	if c.DeliveryLimit > 0 {
		if c.QueueType != QueueQuorum {
			errs = append(errs, fmt.Errorf("DeliveryLimit is %d but QueueType is %q: only quorum queues have x-delivery-limit", c.DeliveryLimit, c.QueueType))
		}
		if attempts := c.Retry.WithDefaults().MaxAttempts; c.DeliveryLimit < attempts {
			errs = append(errs, fmt.Errorf("DeliveryLimit is %d, below the retry policy's %d attempts: the broker would drop a message idem still means to retry, and it would reach no dead-letter table", c.DeliveryLimit, attempts))
		}
	}
	for _, k := range []string{"x-queue-type", "x-delivery-limit", "x-message-ttl"} {
		if _, ok := c.QueueArgs[k]; ok {
			errs = append(errs, fmt.Errorf("QueueArgs sets %s, which the config's own field sets", k))
		}
	}
	for i, b := range c.Bindings {
		if b.Exchange == "" {
			errs = append(errs, fmt.Errorf("Bindings[%d].Exchange is empty: the default exchange cannot be bound", i))
		}
		switch b.Kind {
		case amqp.ExchangeTopic, amqp.ExchangeDirect, amqp.ExchangeFanout, amqp.ExchangeHeaders:
		default:
			errs = append(errs, fmt.Errorf("Bindings[%d].Kind is %q, want topic, direct, fanout or headers", i, b.Kind))
		}
	}
	if len(c.DelayTiers) == 0 {
		errs = append(errs, errors.New("DelayTiers is empty, want at least one delay"))
	}
	for i, d := range c.DelayTiers {
		if d < time.Millisecond {
			errs = append(errs, fmt.Errorf("DelayTiers[%d] is %v, want at least 1ms (a queue's message TTL)", i, d))
		}
		if i > 0 && d <= c.DelayTiers[i-1] {
			errs = append(errs, fmt.Errorf("DelayTiers[%d] is %v, want more than DelayTiers[%d] (%v)", i, d, i-1, c.DelayTiers[i-1]))
		}
	}
	if c.Prefetch < 1 || c.Prefetch > 65535 {
		errs = append(errs, fmt.Errorf("Prefetch is %d, want 1 to 65535", c.Prefetch))
	}
	if c.Lease <= 0 {
		errs = append(errs, fmt.Errorf("Lease is %v, want > 0", c.Lease))
	}
	if c.ConsumerTimeout <= 0 {
		errs = append(errs, fmt.Errorf("ConsumerTimeout is %v, want > 0", c.ConsumerTimeout))
	} else if c.Lease > 0 && c.Lease >= c.ConsumerTimeout {
		errs = append(errs, fmt.Errorf("Lease (%v) is not below ConsumerTimeout (%v): the broker would close the channel before the lease gives a delivery back", c.Lease, c.ConsumerTimeout))
	}
	if c.ReconnectMin <= 0 || c.ReconnectMax < c.ReconnectMin {
		errs = append(errs, fmt.Errorf("ReconnectMin/ReconnectMax are %v/%v, want 0 < min <= max", c.ReconnectMin, c.ReconnectMax))
	}
	if c.MessageTTL < 0 {
		errs = append(errs, fmt.Errorf("MessageTTL is %v, want >= 0", c.MessageTTL))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idemamqp: invalid SourceConfig for queue %q: %w", c.Queue, err)
	}
	return nil
}

// DelayTier returns the delay tier a Nak(delay) waits in: the smallest of tiers (increasing)
// at least as long as delay, so a message never comes back early; a delay beyond the largest
// tier waits the largest. A delay <= 0 returns 0: the message goes straight back to the queue.
func DelayTier(tiers []time.Duration, delay time.Duration) time.Duration {
	if delay <= 0 || len(tiers) == 0 {
		return 0
	}
	i, _ := slices.BinarySearch(tiers, delay)
	if i == len(tiers) {
		return tiers[len(tiers)-1]
	}
	return tiers[i]
}

// delaySuffix separates a work queue's name from its delay tier in a delay queue's name.
const delaySuffix = ".idem-delay."

// DelayQueueName is the name of the delay queue of tier on queue: "<queue>.idem-delay.<ms>ms".
func DelayQueueName(queue string, tier time.Duration) string {
	return fmt.Sprintf("%s%s%dms", queue, delaySuffix, tier.Milliseconds())
}

// PublishTimeoutDefault bounds waiting for the broker's confirms when Publish's context has no
// deadline, so a lost confirm fails the publish instead of hanging the relay.
const PublishTimeoutDefault = 30 * time.Second

// SinkConfig configures a Sink.
type SinkConfig struct {
	// Exchange is the exchange messages are published to, with the Publish topic as routing
	// key. Empty (default) is the default exchange, which routes to the queue named by the topic.
	Exchange string
	// Transient publishes with delivery mode 1 (not persisted). The default is persistent, so a
	// confirmed message on a durable queue survives a broker restart.
	Transient bool
	// OrderKey returns the ordering key of a message (for example a header the producer sets).
	// Publish sends a key's later messages only after its earlier ones were confirmed, and stops
	// a key at its first failure; messages of different keys are pipelined. A message whose key
	// is "" is ordered with no other. Nil (default) orders the whole batch as one key, which is
	// always safe and costs a confirm round trip per message.
	OrderKey func(m idem.Message) string
}

// validate reports the invalid fields of c.
func (c SinkConfig) validate() error {
	if len(c.Exchange) > 255 {
		return fmt.Errorf("idemamqp: invalid SinkConfig: Exchange is %d bytes, want at most 255", len(c.Exchange))
	}
	return nil
}
