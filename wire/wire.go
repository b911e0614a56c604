// Package wire owns every name idem puts on the wire: the message headers (broker headers,
// Pub/Sub and SQS attributes, Redis stream fields, HTTP headers) and the signature formats.
//
// A header name is a contract between a producer and a consumer that may run different
// versions, different transports, or other people's code, so each name is defined once, here,
// and the packages that write or read it refer to it (idemkafka.HeaderTenant, idemredis.FieldTenant,
// idemsqs.AttrTenant… are aliases of [Tenant]). Two things that differ get different names: the
// broker signature ([Signature], package idemauth) and the HTTP request signature
// ([HTTPSignature], package idemhttp) cover different inputs in different formats, so they
// travel in different headers and use different field tags and MAC domains; neither verifier
// accepts the other's.
//
// The package imports nothing, so any module can use it without a new dependency.
package wire

// Message fields. Every transport's sink writes them and every transport's source reads them, so
// that a message keeps its identity when it crosses from one broker to another.
const (
	// EventID carries Message.EventID. Written by every sink (and by idemhttp's sink on each
	// request); read by every source. A message without it gets an empty event id (or one a
	// source derives, e.g. from Nats-Msg-Id), which the consumer dead-letters as invalid_payload.
	EventID = "Idem-Event-Id"
	// Tenant carries Message.Tenant. Written by sinks; read by sources and by idemauth's
	// Verifier, which refuses a message whose claimed tenant is not the signing key's.
	Tenant = "Idem-Tenant"
	// Type carries Message.Type. Written by sinks; read by sources.
	Type = "Idem-Type"
	// OccurredAt carries Message.OccurredAt in RFC 3339 with nanoseconds, UTC. Written by sinks;
	// read by sources.
	OccurredAt = "Idem-Occurred-At"
	// Key carries an outgoing event's ordering key (Outgoing.Key). Written by Outgoing.Message
	// (so the outbox relay forwards it); read by the sinks of partitioned or grouped brokers
	// (Kafka's record key, Pub/Sub's ordering key, an SQS FIFO message group).
	Key = "Idem-Key"
)

// Transport state: names a transport writes for itself and reads back, never set by a producer.
const (
	// Attempt is the attempt the next delivery of a republished retry copy is on (absent means
	// 1). Written and read by the sources that retry by republishing: idemkafka (retry topic),
	// idemredis (retry stream) and idemamqp (delay queue), whose broker counters restart with
	// each copy.
	Attempt = "Idem-Attempt"
	// RetryAt is the time (RFC 3339, UTC) before which a retry copy is not delivered. Written
	// and read by idemkafka's Source, so a Nak's delay survives a restart.
	RetryAt = "Idem-Retry-At"
	// PublishedAt keeps the first publish time of a message on its retry copies, so the retry
	// budget does not restart with each copy. Written and read by idemkafka (RFC 3339) and
	// idemredis (milliseconds of the original entry id).
	PublishedAt = "Idem-Published-At"
	// DecodeError is set by a source on a message it could not decode (its event id is then
	// empty, so the consumer dead-letters it as invalid_payload): it says what was wrong. Read
	// by operators in the dead letter.
	DecodeError = "Idem-Decode-Error"
	// BrokerMsgID, in Message.Headers, replaces the sink's deduplication id (idemnats' Nats-Msg-Id,
	// idemredis' BrokerMsgID): a deliberate republish that must bypass broker deduplication.
	// Read by the sinks of idemnats, idemredis and idemamqp (which accepts and drops it); never
	// published.
	BrokerMsgID = "Idem-Broker-Msg-Id"
	// BodyEncoding says how an SQS body carries a payload SQS cannot carry as it is ("base64"
	// or "empty"). Written and read by idemsqs; absent means the body is the payload.
	BodyEncoding = "Idem-Body-Encoding"
)

// Dead letters and replays. The core writes them; operators, the CLI and the consumer read them.
const (
	// UntrustedTenant carries, on the dead letter of a message that failed authentication, the
	// tenant it claimed. Written by the consumer; the dead letter itself has no tenant.
	UntrustedTenant = "Idem-Untrusted-Tenant"
	// InvalidIdentity names the invalid identity field of a dead-lettered message and what is
	// wrong with it. Written by the consumer in place of the raw identity.
	InvalidIdentity = "Idem-Invalid-Identity"
	// EventIDSHA256 is the SHA-256 (hex) of an invalid raw event id, written next to
	// InvalidIdentity so an operator can match the dead letter with the producer's records.
	EventIDSHA256 = "Idem-Event-Id-Sha256"
	// ReplayPrefix starts every replay header below; a replay signature covers all of them.
	ReplayPrefix = "Idem-Replay"
	// ReplayOf carries the id of the dead letter a message replays. Written by Replay.
	ReplayOf = "Idem-Replay-Of"
	// ReplayedBy carries the operator who replayed it. Written by Replay.
	ReplayedBy = "Idem-Replayed-By"
	// ReplayEventTime carries the earliest known time of a replayed event; the consumer
	// measures the retention horizon from it. Written by Replay; read by the consumer.
	ReplayEventTime = "Idem-Replay-Event-Time"
	// ReplayNewEventOf carries the event id of the dead letter whose edited payload a replay
	// sends under a new event id (ReplayParams.AsNewEvent). Written by Replay.
	ReplayNewEventOf = "Idem-Replay-New-Event-Of"
	// WebhookProvider names the provider of a message idemwebhook's ingress built (and so of its
	// dead letters). Written by idemwebhook.
	WebhookProvider = "Idem-Webhook-Provider"
)

// HTTP: what idemhttp's sink sends with every request, besides the message fields above.
const (
	// IdempotencyKey carries idemhttp.IdempotencyKey(tenant, event id), on which the destination
	// deduplicates. Written by idemhttp's sink; read by the receiving service, e.g. through
	// idemkey's middleware, which reads it from any client.
	IdempotencyKey = "Idempotency-Key"
)

// Signatures. Each kind has its own header, its own field tag and its own MAC domain, so that a
// signature of one kind can never verify as another, even under the same secret.
const (
	// Signature carries a producer's broker-message signature: "kid=<key id>,t=<unix>,v2=<hex>"
	// (v1 is the former scheme, verified only while idemauth's AcceptV1Until allows it). Written
	// by idemauth.SignMessage; read by idemauth's Verifier and idemwebhook.Idem.
	Signature = "Idem-Signature"
	// ReplaySignature carries an operator's replay signature, same format as Signature with a
	// MAC made for the purpose "replay" under replay keys. Written by idemauth's
	// ReplaySigner; read by idemauth's Verifier.
	ReplaySignature = "Idem-Replay-Signature"
	// HTTPSignature carries idemhttp's request signature: "t=<unix>[,kid=<key id>],h1=<hex>"
	// over method, target, the Idem-* and Idempotency-Key headers and the body's SHA-256.
	// Written by idemhttp's sink; read by idemhttp.Verify. idemhttp formerly sent a body-only
	// "v1" signature under Idem-Signature; that old name is deliberately not accepted for HTTP
	// signatures, because a request also carries the broker Idem-Signature (which
	// idemwebhook.Idem verifies), so the old name is ambiguous.
	HTTPSignature = "Idem-Http-Signature"
)

// Signature formats: field tags and MAC domains (the first length-prefixed MAC input). A new
// scheme gets a new tag and a new domain.
const (
	// SignatureFieldV1 tags the former broker MAC in Signature.
	SignatureFieldV1 = "v1"
	// SignatureFieldV2 tags the broker MAC in Signature and ReplaySignature.
	SignatureFieldV2 = "v2"
	// HTTPSignatureFieldH1 tags the HTTP request MAC in HTTPSignature.
	HTTPSignatureFieldH1 = "h1"
	// SignatureDomainV1 starts the former broker MAC input.
	SignatureDomainV1 = "idem-signature-v1"
	// SignatureDomainV2 starts the broker (and replay) MAC input.
	SignatureDomainV2 = "idem-signature-v2"
	// HTTPSignatureDomainH1 starts the HTTP request MAC input.
	HTTPSignatureDomainH1 = "idem-http-signature-h1"
)
