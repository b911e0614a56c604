package idem

import "github.com/idemkit/idem/idemtype"

// The values that cross the store seam are defined in package idemtype, so that package
// idemstore can declare the seam without importing idem; idem names each of them here, so
// application code reads and writes idem.Message and never needs idemtype.

// Message is one event as a consumer receives it. EventID is assigned by the producer and kept
// across republishes and replays; it is what makes a redelivery recognisable. Its fields:
// EventID (required), Tenant, Type, Payload, Headers, Attempt (1-based), PublishedAt and
// OccurredAt; [idemtype.Message] documents each.
type Message = idemtype.Message

// Key identifies one effect: the same event processed by the same consumer (at the same effect
// version) for the same tenant.
type Key = idemtype.Key

// Outgoing is an event a producer enqueues in its own transaction (the transactional outbox);
// the relay publishes it later under the same EventID. Its fields: EventID and Topic
// (required), Tenant, Key (the ordering key), Type, Payload, Headers and OccurredAt;
// [idemtype.Outgoing] documents each.
type Outgoing = idemtype.Outgoing

// Fingerprint is the SHA-256 of an event's relevant content; the same key with another
// fingerprint is key reuse.
type Fingerprint = idemtype.Fingerprint

// Class says what to do with a failed delivery.
type Class = idemtype.Class

// The classes.
const (
	ClassUnknown   = idemtype.ClassUnknown
	ClassTransient = idemtype.ClassTransient
	ClassPermanent = idemtype.ClassPermanent
)

// Reason classifies why a delivery was dead-lettered; operators filter and count by it.
type Reason = idemtype.Reason

// The dead-letter reasons.
const (
	ReasonInvalidPayload   = idemtype.ReasonInvalidPayload
	ReasonUnauthenticated  = idemtype.ReasonUnauthenticated
	ReasonKeyReuse         = idemtype.ReasonKeyReuse
	ReasonPermanentError   = idemtype.ReasonPermanentError
	ReasonRetriesExhausted = idemtype.ReasonRetriesExhausted
	ReasonHandlerPanic     = idemtype.ReasonHandlerPanic
	ReasonTooOld           = idemtype.ReasonTooOld
)

// Reasons returns every dead-letter reason.
func Reasons() []Reason { return idemtype.Reasons() }

// DeadLetter is a delivery that will not be retried: the original message, why, and what
// happened to it since ([idemtype.DeadLetter] documents its fields).
type DeadLetter = idemtype.DeadLetter

// DeadLetterStatus is where a dead letter is in its life.
type DeadLetterStatus = idemtype.DeadLetterStatus

// The dead-letter statuses.
const (
	DeadLetterPending   = idemtype.DeadLetterPending
	DeadLetterReplayed  = idemtype.DeadLetterReplayed
	DeadLetterDiscarded = idemtype.DeadLetterDiscarded
)

// Errors defined with the seam's values; errors.Is matches them under either name.
var (
	// ErrInvalidPayload reports a message that failed validation before its fields were used.
	ErrInvalidPayload = idemtype.ErrInvalidPayload
	// ErrLeaseLost reports that a delivery's lease expired or was taken by another worker; the
	// handler's transaction is rolled back and the delivery is left to its new owner.
	ErrLeaseLost = idemtype.ErrLeaseLost
	// ErrNotFound reports an id (dead letter, queue job) that does not exist.
	ErrNotFound = idemtype.ErrNotFound
)

// Bounds of a message's identity fields (see ValidateIdentity).
const (
	// MaxEventIDBytes bounds Message.EventID.
	MaxEventIDBytes = idemtype.MaxEventIDBytes
	// MaxTenantBytes bounds Message.Tenant.
	MaxTenantBytes = idemtype.MaxTenantBytes
	// MaxTypeBytes bounds Message.Type.
	MaxTypeBytes = idemtype.MaxTypeBytes
	// BoundIDBytes is how much of an identity BoundID shows before it cuts.
	BoundIDBytes = idemtype.BoundIDBytes
)

// The identity fields an IdentityError names.
const (
	FieldEventID = idemtype.FieldEventID
	FieldTenant  = idemtype.FieldTenant
	FieldType    = idemtype.FieldType
)

// IdentityError reports an event id, tenant or type that cannot serve as an identity; it wraps
// ErrInvalidPayload.
type IdentityError = idemtype.IdentityError

// ValidateIdentity checks the identity fields of msg (see [idemtype.ValidateIdentity]) and
// returns the first *IdentityError.
func ValidateIdentity(msg Message) error { return idemtype.ValidateIdentity(msg) }

// BoundID returns the printable, bounded form of an identity (event id, tenant, type) for
// errors, logs and metrics (see [idemtype.BoundID]).
func BoundID(s string) string { return idemtype.BoundID(s) }

// ConsumerName splits a consumer name such as "ledger@v2" into its name and effect version.
func ConsumerName(full string) (name, version string) { return idemtype.ConsumerName(full) }
