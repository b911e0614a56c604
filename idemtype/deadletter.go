package idemtype

import "time"

// Reason classifies why a delivery was dead-lettered; operators filter and count by it.
type Reason string

// The dead-letter reasons.
const (
	ReasonInvalidPayload   Reason = "invalid_payload"
	ReasonUnauthenticated  Reason = "unauthenticated"
	ReasonKeyReuse         Reason = "key_reuse"
	ReasonPermanentError   Reason = "permanent_error"
	ReasonRetriesExhausted Reason = "retries_exhausted"
	ReasonHandlerPanic     Reason = "handler_panic"
	ReasonTooOld           Reason = "too_old"
)

// Reasons lists every reason, for validation of operator input.
var reasons = []Reason{ReasonInvalidPayload, ReasonUnauthenticated, ReasonKeyReuse,
	ReasonPermanentError, ReasonRetriesExhausted, ReasonHandlerPanic, ReasonTooOld}

// Reasons returns every dead-letter reason.
func Reasons() []Reason { return append([]Reason(nil), reasons...) }

// Valid reports whether r is a known reason.
func (r Reason) Valid() bool {
	for _, x := range reasons {
		if x == r {
			return true
		}
	}
	return false
}

// DeadLetterStatus is where a dead letter is in its life.
type DeadLetterStatus string

// The dead-letter statuses.
const (
	DeadLetterPending   DeadLetterStatus = "pending"
	DeadLetterReplayed  DeadLetterStatus = "replayed"
	DeadLetterDiscarded DeadLetterStatus = "discarded"
)

// AuditAction names the operator action that moves a dead letter to s ("replay" for replayed,
// "discard" for discarded); ok is false for any other status, which no operator action sets.
func (s DeadLetterStatus) AuditAction() (action string, ok bool) {
	switch s {
	case DeadLetterReplayed:
		return "replay", true
	case DeadLetterDiscarded:
		return "discard", true
	}
	return "", false
}

// Valid reports whether s is a known status.
func (s DeadLetterStatus) Valid() bool {
	return s == DeadLetterPending || s == DeadLetterReplayed || s == DeadLetterDiscarded
}

// DeadLetter is a delivery that will not be retried: the original message, why, and what
// happened to it since. Error is already redacted and bounded when it is stored.
type DeadLetter struct {
	ID          int64
	Consumer    string // full name with effect version, "ledger@v1"
	Message     Message
	Fingerprint Fingerprint
	Reason      Reason
	Error       string
	Attempts    int
	FirstFailed time.Time
	LastFailed  time.Time
	Status      DeadLetterStatus
	// Source names where the message came from (queue, stream or outbox topic), for replay.
	Source string
	// RecoveredAt is when a replay of this dead letter was processed (zero until then).
	RecoveredAt time.Time
	// Owner is the owner of the consumer that wrote it (ConsumerConfig.Owner; "" when none).
	Owner string
	// Topic is the topic the message arrived on when its delivery reported it (a TopicReporter:
	// the JetStream subject), where a replay goes by default; "" when unknown.
	Topic string
}

// ConsumerVersion returns the effect version part of Consumer ("v1" for "ledger@v1").
func (d DeadLetter) ConsumerVersion() string {
	_, v := ConsumerName(d.Consumer)
	return v
}
