package idemkafka

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/wire"
)

// Header names of the wire mapping. They are a contract between producers and consumers, so they
// are constants rather than configuration. Kafka headers carry any bytes, so unlike NATS no name
// or value is refused; a header repeated on a record decodes to its first value.
const (
	// HeaderEventID carries Message.EventID. A record without it (from a producer that does not
	// know idem) decodes with EventID "" unless SourceConfig.EventIDOf derives one; the consumer
	// dead-letters a message without id as invalid_payload.
	HeaderEventID = wire.EventID
	// HeaderTenant carries Message.Tenant.
	HeaderTenant = wire.Tenant
	// HeaderType carries Message.Type.
	HeaderType = wire.Type
	// HeaderOccurredAt carries Message.OccurredAt in RFC 3339 with nanoseconds, UTC.
	HeaderOccurredAt = wire.OccurredAt
	// HeaderKey, when present in Message.Headers, is the Kafka record key the Sink uses (see
	// KeyOf); it is published like any header, so a retry copy keeps it.
	HeaderKey = idem.HeaderKey
	// HeaderAttempt carries the attempt a retry copy is on (2 for the first retry). Kafka has no
	// delivery counter of its own; a record without it is on its first attempt.
	HeaderAttempt = wire.Attempt
	// HeaderRetryAt is set on a retry copy: the time (RFC 3339, UTC) before which the Source
	// does not deliver it, which is how a Nak's delay survives a restart.
	HeaderRetryAt = wire.RetryAt
	// HeaderPublishedAt is set on a retry copy: when the original record was first stored
	// (RFC 3339, UTC). It keeps Message.PublishedAt, and so the retry policy's elapsed budget,
	// counting from the first publish instead of restarting with every copy. A Source reads
	// HeaderAttempt, HeaderRetryAt and HeaderPublishedAt only from its retry topics: on the
	// main topic they are forged and ignored (a malformed one still makes the record
	// invalid_payload).
	HeaderPublishedAt = wire.PublishedAt
	// HeaderDecodeError is set by a Source on a record it could not decode (its EventID is then
	// empty, so the consumer dead-letters it as invalid_payload); it says what was wrong.
	HeaderDecodeError = wire.DecodeError
)

// mappedHeader reports whether name carries a Message field (or retry state) and so is not a
// free header: it is never copied from Message.Headers onto a record, nor back.
func mappedHeader(name string) bool {
	switch name {
	case HeaderEventID, HeaderTenant, HeaderType, HeaderOccurredAt, HeaderAttempt, HeaderRetryAt, HeaderPublishedAt, HeaderDecodeError:
		return true
	}
	return false
}

// KeyOf is the Kafka record key the Sink gives m by default: the Idem-Key header when the
// producer set one (the ordering key of the outbox row, for example the order id), otherwise
// "<tenant>/<event id>". Records with the same key go to the same partition, where Kafka keeps
// their order; the default spreads unrelated events over the partitions.
func KeyOf(m idem.Message) string {
	if k := m.Headers[HeaderKey]; k != "" {
		return k
	}
	return m.Tenant + "/" + m.EventID
}

// EncodeRecord builds the record a Sink publishes for m on topic with the given key. The mapped
// fields always win over a header of the same name in m.Headers, so decoding and republishing a
// message (a dead-letter replay) cannot change its fields or forge retry state. It refuses a
// message without EventID: nothing downstream could recognise its redelivery.
func EncodeRecord(topic string, key []byte, m idem.Message) (*kgo.Record, error) {
	if m.EventID == "" {
		return nil, fmt.Errorf("idemkafka: message (type %q) has no EventID", m.Type)
	}
	r := &kgo.Record{Topic: topic, Key: key, Value: m.Payload}
	r.Headers = make([]kgo.RecordHeader, 0, len(m.Headers)+4)
	add := func(k, v string) { r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	add(HeaderEventID, m.EventID)
	if m.Tenant != "" {
		add(HeaderTenant, m.Tenant)
	}
	if m.Type != "" {
		add(HeaderType, m.Type)
	}
	if !m.OccurredAt.IsZero() {
		t := m.OccurredAt.UTC()
		if !rfc3339Year(t) {
			return nil, fmt.Errorf("idemkafka: event %s: OccurredAt %v is outside the years 0000-9999 RFC 3339 can write", m.EventID, t)
		}
		add(HeaderOccurredAt, t.Format(time.RFC3339Nano))
	}
	for _, k := range sortedKeys(m.Headers) {
		if mappedHeader(k) {
			continue
		}
		add(k, m.Headers[k])
	}
	return r, nil
}

// Decoded is what a Source reads from one record: the message and the retry state of a copy.
type Decoded struct {
	// Message is the event; its Attempt is the record's HeaderAttempt (1 without it).
	Message idem.Message
	// RetryAt is when a retry copy becomes due; zero for an original record.
	RetryAt time.Time
	// Err says why the record does not decode; Message.EventID is then empty and
	// Message.Headers carries HeaderDecodeError, so the consumer dead-letters it.
	Err error
}

// DecodeRecord reads the idem.Message a record carries (see EncodeRecord). It is pure, so it
// can be fuzzed. A missing Idem-Event-Id is not an error: the message decodes with EventID "",
// which the consumer dead-letters as invalid_payload. A malformed mapped header makes Err wrap
// idem.ErrInvalidPayload, with the rest of the message still decoded. The value is used as the
// payload without copying.
func DecodeRecord(r *kgo.Record) Decoded {
	m := idem.Message{Payload: r.Value, Attempt: 1, PublishedAt: r.Timestamp}
	var d Decoded
	seen := make(map[string]bool, len(r.Headers))
	var attempt, retryAt, publishedAt, occurredAt string
	for _, h := range r.Headers {
		if seen[h.Key] {
			continue
		}
		seen[h.Key] = true
		v := string(h.Value)
		switch h.Key {
		case HeaderEventID:
			m.EventID = v
		case HeaderTenant:
			m.Tenant = v
		case HeaderType:
			m.Type = v
		case HeaderOccurredAt:
			occurredAt = v
		case HeaderAttempt:
			attempt = v
		case HeaderRetryAt:
			retryAt = v
		case HeaderPublishedAt:
			publishedAt = v
		case HeaderDecodeError:
		default:
			if m.Headers == nil {
				m.Headers = make(map[string]string, len(r.Headers))
			}
			m.Headers[h.Key] = v
		}
	}
	fail := func(format string, args ...any) {
		if d.Err == nil {
			d.Err = fmt.Errorf("%w: "+format, append([]any{idem.ErrInvalidPayload}, args...)...)
		}
	}
	if occurredAt != "" {
		if t, err := parseTime(occurredAt); err != nil {
			fail("header %s %q: %w", HeaderOccurredAt, occurredAt, err)
		} else {
			m.OccurredAt = t
		}
	}
	if publishedAt != "" {
		if t, err := parseTime(publishedAt); err != nil {
			fail("header %s %q: %w", HeaderPublishedAt, publishedAt, err)
		} else {
			m.PublishedAt = t
		}
	}
	if retryAt != "" {
		if t, err := parseTime(retryAt); err != nil {
			fail("header %s %q: %w", HeaderRetryAt, retryAt, err)
		} else {
			d.RetryAt = t
		}
	}
	if attempt != "" {
		n, err := strconv.Atoi(attempt)
		if err != nil || n < 1 {
			fail("header %s %q is not a positive integer", HeaderAttempt, attempt)
		} else {
			m.Attempt = n
		}
	}
	if d.Err != nil {
		if m.Headers == nil {
			m.Headers = make(map[string]string, 1)
		}
		m.Headers[HeaderDecodeError] = d.Err.Error()
		// The consumer dead-letters an event without id as invalid_payload; the id it had is
		// kept in Headers for the operator.
		if m.EventID != "" {
			m.Headers[HeaderEventID] = m.EventID
		}
		m.EventID = ""
	}
	d.Message = m
	return d
}

// parseTime parses an RFC 3339 time within the years RFC 3339 can write, in UTC.
func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("not RFC 3339: %w", err)
	}
	if t = t.UTC(); !rfc3339Year(t) {
		return time.Time{}, fmt.Errorf("outside the years 0000-9999 in UTC")
	}
	return t, nil
}

// rfc3339Year reports whether t (in UTC) formats as RFC 3339 that parses back.
func rfc3339Year(t time.Time) bool { return t.Year() >= 0 && t.Year() <= 9999 }

// formatTime writes t as RFC 3339 with nanoseconds in UTC.
func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// sortedKeys returns the keys of m in order, so a record's headers do not depend on map order.
func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
