// Package idemsqs is the Amazon SQS transport for idem: a [Source] that long-polls a queue and a
// [Sink] that sends in batches, with message groups and deduplication ids on FIFO queues. It
// uses aws-sdk-go-v2/service/sqs and is tested against moto_server, an SQS-compatible server
// that speaks the SDK's JSON protocol.
//
// The wire mapping uses the attribute names every idem transport uses for its headers:
//
//	EventID     ↔ Idem-Event-Id      (a message without it is dead-lettered as invalid_payload)
//	Tenant      ↔ Idem-Tenant
//	Type        ↔ Idem-Type
//	OccurredAt  ↔ Idem-Occurred-At   (RFC 3339 with nanoseconds, UTC)
//	Payload     ↔ body               (base64 with Idem-Body-Encoding when it is not text SQS takes)
//	Headers     ↔ every other message attribute, one to one (SQS allows 10 in all)
//	Attempt     ←  ApproximateReceiveCount, less receives a cancelled Receive gave back
//	PublishedAt ←  SentTimestamp
//
// A delivery's lease is its visibility timeout: the Source receives with VisibilityTimeout
// Lease, Extend and Nak(delay) are ChangeMessageVisibility, Ack and Term are DeleteMessage (Term
// after the consumer wrote idem's dead letter). The queue's redrive policy is checked against
// the consumer's retry policy ([Source.DeliveryLimit]), so SQS never moves to its dead-letter
// queue a message idem would still retry.
//
// docs/sqs.md describes delivery, the visibility timeout, delays, FIFO queues and the limits.
package idemsqs
