package idemredis

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/wire"
)

// Field names of the wire mapping: a stream entry is a flat list of fields, and these carry the
// message's fields while every other field is a header. They are the header names the other
// idem transports use, so a message keeps its fields when it crosses from one broker to another,
// and they are constants because a sink and a source configured differently would silently lose
// event ids. Redis field names and values are binary-safe, so any header round-trips unchanged.
const (
	// FieldEventID carries Message.EventID.
	FieldEventID = wire.EventID
	// FieldTenant carries Message.Tenant.
	FieldTenant = wire.Tenant
	// FieldType carries Message.Type.
	FieldType = wire.Type
	// FieldOccurredAt carries Message.OccurredAt in RFC 3339 with nanoseconds, UTC.
	FieldOccurredAt = wire.OccurredAt
	// FieldPayload carries Message.Payload.
	FieldPayload = "payload"
	// FieldAttempt is the attempt of the first delivery of an entry a Source re-added to its
	// group's retry stream after a Nak(delay): a new entry, whose delivery count starts again.
	// Absent means 1. It is read only on retry streams, so a producer cannot forge it.
	FieldAttempt = wire.Attempt
	// FieldPublishedAt, on a retry-stream entry, keeps the millisecond time of the original
	// entry's id, so PublishedAt does not move with each retry.
	FieldPublishedAt = wire.PublishedAt
	// HeaderDecodeError is set by a Source on a message it could not decode (its EventID is then
	// empty, so the consumer dead-letters it as invalid_payload); it says what was wrong.
	HeaderDecodeError = wire.DecodeError
	// HeaderBrokerMsgID, when present in Message.Headers, replaces the sink's deduplication id
	// (BrokerMsgID): a deliberate republish that must bypass deduplication. It is not published.
	HeaderBrokerMsgID = wire.BrokerMsgID
)

// mappedField reports whether name carries a Message field or transport state, so it is neither
// published from Message.Headers nor decoded into them.
func mappedField(name string) bool {
	switch name {
	case FieldEventID, FieldTenant, FieldType, FieldOccurredAt, FieldPayload, FieldAttempt,
		FieldPublishedAt, HeaderDecodeError, HeaderBrokerMsgID:
		return true
	}
	return false
}

// EncodeMessage returns the fields of the stream entry a Sink adds for m, as XADD takes them
// (name, value, name, value, …). The mapped fields always win: a header in m.Headers named like
// one of them is not published, so that decoding and republishing a message (a dead-letter
// replay) cannot change its fields. It refuses a message without EventID, since neither the
// sink's deduplication nor the consumer could identify it. Its errors have no package prefix:
// the Sink wraps them.
func EncodeMessage(m idem.Message) ([]string, error) {
	if m.EventID == "" {
		return nil, fmt.Errorf("message (type %q) has no EventID", m.Type)
	}
	f := make([]string, 0, 2*(len(m.Headers)+5))
	f = append(f, FieldEventID, m.EventID)
	if m.Tenant != "" {
		f = append(f, FieldTenant, m.Tenant)
	}
	if m.Type != "" {
		f = append(f, FieldType, m.Type)
	}
	if !m.OccurredAt.IsZero() {
		t := m.OccurredAt.UTC()
		if !rfc3339Year(t) {
			return nil, fmt.Errorf("event %s: OccurredAt %v is outside the years 0000-9999 RFC 3339 can write", m.EventID, t)
		}
		f = append(f, FieldOccurredAt, t.Format(time.RFC3339Nano))
	}
	f = append(f, FieldPayload, string(m.Payload))
	for k, v := range m.Headers {
		if mappedField(k) {
			continue
		}
		if k == "" {
			return nil, fmt.Errorf("event %s: a header has an empty name", m.EventID)
		}
		f = append(f, k, v)
	}
	return f, nil
}

// DecodeFields builds the idem.Message a stream entry carries. id is the entry's id (its
// millisecond part is PublishedAt), count its delivery count from the group's pending list,
// and retry whether it comes from a retry stream (only there are Idem-Attempt and
// Idem-Published-At honoured). It is pure, so it can be fuzzed. A missing Idem-Event-Id is not
// an error: the message decodes with EventID "" and the consumer dead-letters it as
// invalid_payload. A malformed Idem-Occurred-At or Idem-Attempt is an error wrapping
// idem.ErrInvalidPayload; the message is still returned with everything else decoded.
func DecodeFields(id string, fields map[string]string, count int64, retry bool) (idem.Message, error) {
	m := idem.Message{
		EventID: fields[FieldEventID],
		Tenant:  fields[FieldTenant],
		Type:    fields[FieldType],
		Payload: []byte(fields[FieldPayload]),
		Attempt: int(max(count, 1)),
	}
	if ms, ok := entryMillis(id); ok {
		m.PublishedAt = time.UnixMilli(ms).UTC()
	}
	for k, v := range fields {
		if mappedField(k) {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(fields))
		}
		m.Headers[k] = v
	}
	if retry {
		if s, ok := fields[FieldPublishedAt]; ok {
			if ms, err := strconv.ParseInt(s, 10, 64); err == nil && ms >= 0 {
				m.PublishedAt = time.UnixMilli(ms).UTC()
			}
		}
		if s, ok := fields[FieldAttempt]; ok {
			base, err := strconv.Atoi(s)
			if err != nil || base < 1 || base > maxAttempt {
				return m, fmt.Errorf("%w: event %s: field %s %q is not an attempt number",
					idem.ErrInvalidPayload, m.EventID, FieldAttempt, s)
			}
			m.Attempt = min(base+m.Attempt-1, maxAttempt)
		}
	}
	if s := fields[FieldOccurredAt]; s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return m, fmt.Errorf("%w: event %s: field %s %q is not RFC 3339: %w",
				idem.ErrInvalidPayload, m.EventID, FieldOccurredAt, s, err)
		}
		if t = t.UTC(); !rfc3339Year(t) {
			return m, fmt.Errorf("%w: event %s: field %s %q is outside the years 0000-9999 in UTC",
				idem.ErrInvalidPayload, m.EventID, FieldOccurredAt, s)
		}
		m.OccurredAt = t
	}
	return m, nil
}

// maxAttempt bounds an attempt read from the wire, so arithmetic on it cannot overflow.
const maxAttempt = 1 << 30

// entryMillis returns the millisecond part of a stream entry id ("1700000000000-0").
func entryMillis(id string) (int64, bool) {
	ms, _, ok := strings.Cut(id, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	return n, err == nil && n >= 0
}

// rfc3339Year reports whether t (in UTC) formats as RFC 3339 that parses back: its year has
// four digits.
func rfc3339Year(t time.Time) bool { return t.Year() >= 0 && t.Year() <= 9999 }

// maxDedupEventID bounds the event id part of a deduplication id; a longer event id is replaced
// by its hash, so that the key stays small whatever the producer sends.
const maxDedupEventID = 128

// BrokerMsgID is the deduplication id a Sink gives m on stream: "<event id>/<16 hex digits>",
// the digits being the start of SHA-256 over the stream key, tenant, type and payload (each
// length-prefixed), as idemnats does for Nats-Msg-Id. The sink drops a publish whose id it saw
// within the dedup window, so only what is truly the same publish — same event, stream and
// content — is dropped, while a reused event id with other content (key reuse, which the
// consumer dead-letters) and the same event id on two streams get through. A dead-letter replay
// gets "<event id>/replay/<dead letter id>", and Idem-Broker-Msg-Id in the headers overrides it.
func BrokerMsgID(stream string, m idem.Message) string {
	if id := m.Headers[HeaderBrokerMsgID]; id != "" {
		return id
	}
	id := m.EventID
	if len(id) > maxDedupEventID {
		idSum := sha256.Sum256([]byte(id))
		id = "sha256:" + hex.EncodeToString(idSum[:16])
	}
	if r := m.Headers[idem.HeaderReplayOf]; r != "" {
		return id + "/replay/" + r
	}
	h := sha256.New()
	for _, part := range [][]byte{[]byte(stream), []byte(m.Tenant), []byte(m.Type), m.Payload} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	return id + "/" + hex.EncodeToString(h.Sum(nil)[:8])
}
