package idemtype

import (
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/wire"
)

// Message is one event as a consumer receives it. EventID is assigned by the producer and kept
// across republishes and replays; it is what makes a redelivery recognisable.
type Message struct {
	// EventID is the producer-assigned identity of the event (required).
	EventID string
	// Tenant is the tenant the event belongs to. A consumer with an Authenticator overwrites it
	// with the tenant of the verified channel; an unverified payload field never decides it.
	Tenant string
	// Type names the kind of event ("payment.captured"); it takes part in the fingerprint.
	Type string
	// Payload is the event body, usually JSON.
	Payload []byte
	// Headers carries transport metadata (signatures, trace ids, replay markers).
	Headers map[string]string
	// Attempt is the 1-based delivery attempt as counted by the broker or queue table. Inside
	// Run it counts only the attempts that spend the retry budget: deliveries this consumer saw
	// end without a verdict (a lost lease, a give-back at shutdown or pause) are taken off.
	Attempt int
	// PublishedAt is when the broker first accepted the message. It bounds the event's age
	// (when OccurredAt is unknown) but not its retry budget, which counts from the first attempt.
	PublishedAt time.Time
	// OccurredAt is when the producer says the event happened; it bounds how old an event may be
	// before the retention horizon refuses it. Zero means unknown.
	OccurredAt time.Time
}

// Header returns the value of header name, or "" when it is absent.
func (m Message) Header(name string) string {
	if m.Headers == nil {
		return ""
	}
	return m.Headers[name]
}

// Clone returns a deep copy of m, so that a consumer can hand the message to code that may keep it.
func (m Message) Clone() Message {
	c := m
	if m.Payload != nil {
		c.Payload = append([]byte(nil), m.Payload...)
	}
	if m.Headers != nil {
		c.Headers = make(map[string]string, len(m.Headers))
		for k, v := range m.Headers {
			c.Headers[k] = v
		}
	}
	return c
}

// EventTime is the time the retention horizon is measured from: the earliest of the producer's
// occurrence time, the broker's publish time and, on a replay, the original event's time
// (wire.ReplayEventTime), since a replay resets the publish time and a late replay must not
// pass for a fresh event. Zero when none is known; an error when the replay header does not parse.
func (m Message) EventTime() (time.Time, error) {
	var rt time.Time
	if v := m.Header(wire.ReplayEventTime); v != "" {
		var err error
		if rt, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return time.Time{}, fmt.Errorf("header %s: %w", wire.ReplayEventTime, err)
		}
	}
	return earliest(m.OccurredAt, m.PublishedAt, rt), nil
}

// earliest returns the earliest of the non-zero times, zero when all are.
func earliest(ts ...time.Time) time.Time {
	var t time.Time
	for _, c := range ts {
		if !c.IsZero() && (t.IsZero() || c.Before(t)) {
			t = c
		}
	}
	return t
}

// Key identifies one effect: the same event processed by the same consumer (at the same effect
// version) for the same tenant. Two consumers, or two effect versions, have different keys for
// the same event on purpose.
type Key struct {
	Tenant   string
	Consumer string
	EventID  string
}

// String formats the key as tenant/consumer/event_id for logs and errors, with the tenant and
// the event id in their bounded form (BoundID).
func (k Key) String() string {
	return fmt.Sprintf("%s/%s/%s", BoundID(k.Tenant), k.Consumer, BoundID(k.EventID))
}

// ConsumerName splits a consumer name such as "ledger@v2" into its name and effect version.
// A name without "@" has version "".
func ConsumerName(full string) (name, version string) {
	name, version, _ = strings.Cut(full, "@")
	return name, version
}

// Outgoing is an event a producer enqueues in its own transaction (the transactional outbox);
// the relay publishes it later under the same EventID.
type Outgoing struct {
	// EventID is assigned by the producer and never changes (required).
	EventID string
	// Tenant the event belongs to.
	Tenant string
	// Topic is the destination subject, queue or URL key (required).
	Topic string
	// Key orders events: events with the same Key are published in enqueue order. Empty means
	// no ordering constraint beyond the event itself.
	Key string
	// Type names the kind of event.
	Type string
	// Payload is the event body.
	Payload []byte
	// Headers are published with the event.
	Headers map[string]string
	// OccurredAt is the producer's occurrence time; zero means the enqueue time.
	OccurredAt time.Time
}

// Message converts the outgoing event to the Message a sink publishes. A non-empty Key travels
// as the wire.Key header unless the producer set that header itself; o.Headers is not changed.
func (o Outgoing) Message() Message {
	headers := o.Headers
	if _, set := headers[wire.Key]; o.Key != "" && !set {
		headers = make(map[string]string, len(o.Headers)+1)
		for k, v := range o.Headers {
			headers[k] = v
		}
		headers[wire.Key] = o.Key
	}
	return Message{
		EventID:    o.EventID,
		Tenant:     o.Tenant,
		Type:       o.Type,
		Payload:    o.Payload,
		Headers:    headers,
		OccurredAt: o.OccurredAt,
	}
}

// Validate reports the first missing required field or invalid identity, naming it and the
// event id (bounded). The outbox refuses what a consumer would refuse (ValidateIdentity): an
// event that could never be applied must fail in the producer's transaction, not hold its key
// back in the outbox.
func (o Outgoing) Validate() error {
	switch {
	case o.EventID == "":
		return fmt.Errorf("idem: outgoing event (topic %q): EventID is empty", o.Topic)
	case o.Topic == "":
		return fmt.Errorf("idem: outgoing event %s: Topic is empty", BoundID(o.EventID))
	}
	if err := ValidateIdentity(o.Message()); err != nil {
		return fmt.Errorf("idem: outgoing event %s (topic %q): %w", BoundID(o.EventID), o.Topic, err)
	}
	return nil
}
