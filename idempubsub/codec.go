package idempubsub

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/wire"
)

// Attribute names of the wire mapping, shared with every idem transport's headers. They are a
// contract between producers and consumers, so they are constants rather than configuration.
const (
	// AttrEventID carries Message.EventID. A message without it is delivered with an empty
	// EventID and the reason in AttrDecodeError, so the consumer dead-letters it.
	AttrEventID = wire.EventID
	// AttrTenant carries Message.Tenant.
	AttrTenant = wire.Tenant
	// AttrType carries Message.Type.
	AttrType = wire.Type
	// AttrOccurredAt carries Message.OccurredAt in RFC 3339 with nanoseconds, UTC.
	AttrOccurredAt = wire.OccurredAt
	// AttrKey, when present in Message.Headers, is the ordering key the Sink uses (see KeyOf).
	AttrKey = idem.HeaderKey
	// AttrDecodeError is set by a Source on a message it could not decode.
	AttrDecodeError = wire.DecodeError
)

// Pub/Sub's limits on attributes (https://cloud.google.com/pubsub/quotas#resource_limits).
const (
	maxAttributes     = 100
	maxAttrKeyBytes   = 256
	maxAttrValueBytes = 1024
)

// mapped reports whether name carries a Message field and so is never copied from
// Message.Headers onto a message, nor back.
func mapped(name string) bool {
	switch name {
	case AttrEventID, AttrTenant, AttrType, AttrOccurredAt, AttrDecodeError:
		return true
	}
	return false
}

// KeyOf is the ordering key the Sink gives m: the Idem-Key header when the producer set one (the
// outbox's Outgoing.Key), else "<tenant>/<event id>", which orders nothing but keeps one event's
// republishes in order.
func KeyOf(m idem.Message) string {
	if k := m.Headers[AttrKey]; k != "" {
		return k
	}
	return m.Tenant + "/" + m.EventID
}

// Encode builds the Pub/Sub message a Sink publishes for m: the payload as data, the mapped fields
// and the free headers as attributes, and the ordering key key. Mapped fields win over a header of
// the same name. It refuses a message without EventID (nothing downstream could recognise its
// redelivery) and attributes Pub/Sub would refuse (empty or "goog"-prefixed names, sizes over its
// limits, invalid UTF-8), so the error names the field instead of a broker status.
func Encode(m idem.Message, key string) (*pubsub.Message, error) {
	if m.EventID == "" {
		return nil, errors.New("message has no EventID")
	}
	attrs := make(map[string]string, len(m.Headers)+4)
	for k, v := range m.Headers {
		if mapped(k) {
			continue
		}
		attrs[k] = v
	}
	attrs[AttrEventID] = m.EventID
	if m.Tenant != "" {
		attrs[AttrTenant] = m.Tenant
	}
	if m.Type != "" {
		attrs[AttrType] = m.Type
	}
	if !m.OccurredAt.IsZero() {
		attrs[AttrOccurredAt] = m.OccurredAt.UTC().Format(time.RFC3339Nano)
	}
	if len(attrs) > maxAttributes {
		return nil, fmt.Errorf("event %q: %d attributes, Pub/Sub allows %d", m.EventID, len(attrs), maxAttributes)
	}
	for k, v := range attrs {
		if err := checkAttr(k, v); err != nil {
			return nil, fmt.Errorf("event %q: %w", m.EventID, err)
		}
	}
	if !utf8.ValidString(key) {
		return nil, fmt.Errorf("event %q: ordering key is not valid UTF-8", m.EventID)
	}
	return &pubsub.Message{Data: m.Payload, Attributes: attrs, OrderingKey: key}, nil
}

// checkAttr refuses an attribute Pub/Sub would refuse.
func checkAttr(k, v string) error {
	switch {
	case k == "":
		return errors.New("empty attribute name")
	case strings.HasPrefix(strings.ToLower(k), "goog"):
		return fmt.Errorf("attribute %q: names starting with goog are reserved by Pub/Sub", k)
	case len(k) > maxAttrKeyBytes:
		return fmt.Errorf("attribute %q: name over %d bytes", k[:32], maxAttrKeyBytes)
	case len(v) > maxAttrValueBytes:
		return fmt.Errorf("attribute %q: value of %d bytes, over %d", k, len(v), maxAttrValueBytes)
	case !utf8.ValidString(k) || !utf8.ValidString(v):
		return fmt.Errorf("attribute %q: not valid UTF-8", k)
	}
	return nil
}

// Decode reads the message a Source received: id is Pub/Sub's message id, published its publish
// time, attempt the delivery attempt. On error it still returns what it could decode, so the
// Source can deliver it for the consumer to dead-letter.
func Decode(data []byte, attrs map[string]string, published time.Time, attempt int) (idem.Message, error) {
	m := idem.Message{Payload: data, Attempt: attempt, PublishedAt: published}
	for k, v := range attrs {
		if mapped(k) {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(attrs))
		}
		m.Headers[k] = v
	}
	m.EventID = attrs[AttrEventID]
	m.Tenant = attrs[AttrTenant]
	m.Type = attrs[AttrType]
	if s, ok := attrs[AttrOccurredAt]; ok {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return m, fmt.Errorf("attribute %s: %w", AttrOccurredAt, err)
		}
		m.OccurredAt = t
	}
	if m.EventID == "" {
		return m, fmt.Errorf("no %s attribute", AttrEventID)
	}
	return m, nil
}
