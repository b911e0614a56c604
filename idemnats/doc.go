// Package idemnats is the NATS JetStream transport for idem: a [Source] over a durable pull
// consumer and a [Sink] that publishes with [BrokerMsgID] (the event id scoped by subject and
// content) as the JetStream message id, so the stream's duplicate window drops a republish
// before any consumer sees it while key reuse still reaches the consumer. docs/nats.md
// describes delivery, nak delays, the lease, MaxDeliver and deduplication.
//
// The wire mapping between an [idem.Message] and a JetStream message is fixed, so that any
// producer (the idem relay, another language, the nats CLI) can publish events idem consumes:
//
//	EventID     ↔ Idem-Event-Id      (or Nats-Msg-Id when a foreign producer sets no Idem-Event-Id)
//	            →  Nats-Msg-Id        BrokerMsgID: JetStream deduplicates on it within the Duplicates window
//	Tenant      ↔ Idem-Tenant
//	Type        ↔ Idem-Type
//	OccurredAt  ↔ Idem-Occurred-At   (RFC 3339 with nanoseconds, UTC)
//	Payload     ↔ message data
//	Headers     ↔ every other header, one to one (a multi-valued header decodes to its first value)
//	Attempt     ←  delivery metadata NumDelivered
//	PublishedAt ←  delivery metadata Timestamp (when the stream stored the message)
//
// Settling maps onto JetStream acks: Ack is a double ack (it waits for the server's
// confirmation), Nak(delay) is NakWithDelay, Extend is InProgress and Term is a terminating ack
// (with a reason on servers from 2.10.4, which older servers would silently ignore). The package
// is tested against a real server with the shared conformance suite in package transporttest.
//
// # Delivery limit and redelivery window
//
// JetStream's MaxDeliver is the number of deliveries after which the server stops delivering a
// message: at the limit it neither redelivers it nor tells the consumer, and only the advisory
// $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<durable> records it — the event is then
// neither applied nor dead-lettered. So a [Source] creates its durable consumer with MaxDeliver
// unlimited ([MaxDeliverDefault], -1) and the consumer's retry policy decides when an event is
// dead-lettered instead. A bounded [SourceConfig].MaxDeliver must be at least
// Retry.MaxAttempts + [MaxDeliverHeadroom] ([idem.DeliveryLimitMargin]): NewSource checks it
// against SourceConfig.Retry, and idem.Consumer.Run checks [Source.DeliveryLimit] against the
// consumer's own policy ([idem.CheckSourceLimits]). The margin covers deliveries that end without
// a verdict (a lost lease, a give-back at shutdown or pause, a crash), which JetStream counts and
// the policy does not; an event that has more of them than the margin (repeated pauses during a
// long database outage, a crash loop) can still reach a bounded limit and be dropped, which is
// why unlimited is the default. Run also refuses a stream whose [Source.RedeliveryWindow] (its
// MaxAge, or unbounded without one) is longer than the consumer's RedeliveryWindow.
package idemnats
