package idemnats

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/wire"
)

// Header names of the wire mapping. They are a contract between producers and consumers, so they
// are constants rather than configuration: a sink and a source configured differently would
// silently lose event ids. Matching is case-sensitive, as it is in the NATS server.
const (
	// HeaderMsgID is JetStream's message id header. A sink sets it to BrokerMsgID: the event
	// id scoped by the subject and the content, so the stream drops a true republish within its
	// Duplicates window while a reused id with other content, or the same id on another subject
	// of the stream, still reaches the consumer (which dead-letters key reuse). A dead-letter
	// replay must get through as well: its message id is "<event id>/replay/<dead letter id>"
	// while its event id stays the same.
	HeaderMsgID = jetstream.MsgIDHeader
	// HeaderEventID carries Message.EventID. A message without it (published by a producer that
	// does not know idem) takes its event id from Nats-Msg-Id.
	HeaderEventID = wire.EventID
	// HeaderBrokerMsgID, when present in Message.Headers, replaces the broker message id: a
	// deliberate republish that must bypass the stream's deduplication (tests, demos). It is not
	// forwarded as a header.
	HeaderBrokerMsgID = wire.BrokerMsgID
	// HeaderTenant carries Message.Tenant.
	HeaderTenant = wire.Tenant
	// HeaderType carries Message.Type.
	HeaderType = wire.Type
	// HeaderOccurredAt carries Message.OccurredAt in RFC 3339 with nanoseconds, UTC.
	HeaderOccurredAt = wire.OccurredAt
	// HeaderDecodeError is set by a Source on a message it could not decode (its EventID is then
	// empty, so the consumer dead-letters it as invalid_payload); it says what was wrong.
	HeaderDecodeError = wire.DecodeError
)

// serverHeaderPrefix marks headers that instruct the NATS server (Nats-Expected-*, Nats-Rollup,
// Nats-TTL, …); they are never forwarded from Message.Headers.
const serverHeaderPrefix = "Nats-"

// mappedHeader reports whether name carries a Message field and so is not a free header.
func mappedHeader(name string) bool {
	switch name {
	case HeaderEventID, HeaderMsgID, HeaderBrokerMsgID, HeaderTenant, HeaderType, HeaderOccurredAt:
		return true
	}
	return false
}

// EncodeMessage builds the NATS message a Sink publishes for m on subject. The mapped fields
// always win: a header in m.Headers named like one of them (Idem-Tenant, …) or in the server's
// Nats- namespace is not published, so that decoding and republishing a message (a dead-letter
// replay) can neither change its fields nor replay server instructions such as Nats-Rollup. It
// refuses a message without EventID, since the broker could not deduplicate it, and headers
// that NATS cannot carry unchanged.
func EncodeMessage(subject string, m idem.Message) (*nats.Msg, error) {
	if m.EventID == "" {
		return nil, fmt.Errorf("idemnats: message (type %q) has no EventID: JetStream could not deduplicate it", m.Type)
	}
	if err := checkHeaderValue(m.EventID); err != nil {
		return nil, fmt.Errorf("idemnats: event %q: EventID %w", m.EventID, err)
	}
	h := make(nats.Header, len(m.Headers)+4)
	for k, v := range m.Headers {
		if mappedHeader(k) || k == HeaderDecodeError || hasPrefixFold(k, serverHeaderPrefix) {
			continue
		}
		if err := checkHeaderKey(k); err != nil {
			return nil, fmt.Errorf("idemnats: event %s: header %q: %w", m.EventID, k, err)
		}
		if err := checkHeaderValue(v); err != nil {
			return nil, fmt.Errorf("idemnats: event %s: header %q %w", m.EventID, k, err)
		}
		h[k] = []string{v}
	}
	h[HeaderEventID] = []string{m.EventID}
	msgID := BrokerMsgID(subject, m)
	if id := m.Headers[HeaderBrokerMsgID]; id != "" {
		msgID = id
	} else if id := m.Headers[idem.HeaderReplayOf]; id != "" {
		msgID = m.EventID + "/replay/" + id
	}
	if err := checkHeaderValue(msgID); err != nil {
		return nil, fmt.Errorf("idemnats: event %s: broker message id %w", m.EventID, err)
	}
	h[HeaderMsgID] = []string{msgID}
	if m.Tenant != "" {
		if err := checkHeaderValue(m.Tenant); err != nil {
			return nil, fmt.Errorf("idemnats: event %s: Tenant %w", m.EventID, err)
		}
		h[HeaderTenant] = []string{m.Tenant}
	}
	if m.Type != "" {
		if err := checkHeaderValue(m.Type); err != nil {
			return nil, fmt.Errorf("idemnats: event %s: Type %w", m.EventID, err)
		}
		h[HeaderType] = []string{m.Type}
	}
	if !m.OccurredAt.IsZero() {
		t := m.OccurredAt.UTC()
		if !rfc3339Year(t) {
			return nil, fmt.Errorf("idemnats: event %s: OccurredAt %v is outside the years 0000-9999 RFC 3339 can write", m.EventID, t)
		}
		h[HeaderOccurredAt] = []string{t.Format(time.RFC3339Nano)}
	}
	return &nats.Msg{Subject: subject, Header: h, Data: m.Payload}, nil
}

// maxMsgIDEventID bounds the event id part of a broker message id; a longer event id is
// replaced by its hash, so that the header stays small whatever the producer sends.
const maxMsgIDEventID = 128

// BrokerMsgID is the Nats-Msg-Id a Sink gives m on subject: "<event id>/<16 hex digits>", the
// digits being the start of SHA-256 over the subject, tenant, type and payload (each
// length-prefixed). JetStream deduplicates on the whole id within the stream's Duplicates
// window, so it drops only what is truly the same publish — same event, subject and content —
// and lets through what the consumer must judge: a reused event id with other content (key
// reuse, dead-lettered by the consumer) and the same event id on two subjects of one stream
// (two events for JetStream, one per subscriber). An event id longer than 128 bytes is replaced
// by "sha256:" and the first 32 hex digits of its own hash, which bounds the header.
func BrokerMsgID(subject string, m idem.Message) string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(subject), []byte(m.Tenant), []byte(m.Type), m.Payload} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	sum := h.Sum(nil)
	id := m.EventID
	if len(id) > maxMsgIDEventID {
		idSum := sha256.Sum256([]byte(id))
		id = "sha256:" + hex.EncodeToString(idSum[:16])
	}
	return id + "/" + hex.EncodeToString(sum[:8])
}

// DecodeHeaders builds the idem.Message carried by a JetStream message's headers, data and
// delivery metadata (md may be nil: Attempt and PublishedAt stay zero). It is pure, so it can be
// fuzzed. A missing Nats-Msg-Id is not an error: the message decodes with EventID "" and the
// consumer dead-letters it as invalid_payload. A malformed Idem-Occurred-At is an error wrapping
// idem.ErrInvalidPayload; the message is still returned with everything else decoded. data is
// used as the payload without copying.
func DecodeHeaders(h nats.Header, data []byte, md *jetstream.MsgMetadata) (idem.Message, error) {
	m := idem.Message{
		EventID: first(h, HeaderEventID),
		Tenant:  first(h, HeaderTenant),
		Type:    first(h, HeaderType),
		Payload: data,
	}
	if m.EventID == "" {
		m.EventID = first(h, HeaderMsgID)
	}
	if md != nil {
		m.Attempt = int(min(md.NumDelivered, math.MaxInt))
		m.PublishedAt = md.Timestamp
	}
	for k, vs := range h {
		if mappedHeader(k) || len(vs) == 0 {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(h))
		}
		m.Headers[k] = vs[0]
	}
	if s := first(h, HeaderOccurredAt); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return m, fmt.Errorf("%w: event %s: header %s %q is not RFC 3339: %w",
				idem.ErrInvalidPayload, m.EventID, HeaderOccurredAt, s, err)
		}
		if t = t.UTC(); !rfc3339Year(t) {
			return m, fmt.Errorf("%w: event %s: header %s %q is outside the years 0000-9999 in UTC",
				idem.ErrInvalidPayload, m.EventID, HeaderOccurredAt, s)
		}
		m.OccurredAt = t
	}
	return m, nil
}

// rfc3339Year reports whether t (in UTC) formats as RFC 3339 that parses back: its year has
// four digits.
func rfc3339Year(t time.Time) bool { return t.Year() >= 0 && t.Year() <= 9999 }

// DecodeMessage is DecodeHeaders over a received JetStream message, with its delivery metadata.
func DecodeMessage(msg jetstream.Msg) (idem.Message, error) {
	md, err := msg.Metadata()
	if err != nil {
		m, _ := DecodeHeaders(msg.Headers(), msg.Data(), nil)
		return m, fmt.Errorf("%w: event %s on %s: delivery metadata: %w", idem.ErrInvalidPayload, m.EventID, msg.Subject(), err)
	}
	return DecodeHeaders(msg.Headers(), msg.Data(), md)
}

// first returns the first value of header name, or "".
func first(h nats.Header, name string) string {
	if vs := h[name]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// checkHeaderKey refuses names the NATS client will not publish: it accepts printable ASCII
// except the separators "()/,:;<=>?@[\]{} (nats.go's rule, stricter than ADR-4).
func checkHeaderKey(k string) error {
	if k == "" {
		return errors.New("empty header name")
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return fmt.Errorf("name contains %q, which a NATS header name cannot carry", c)
		}
	}
	return nil
}

// checkHeaderValue refuses values that would not come back unchanged: the client turns line
// breaks into spaces and trims leading and trailing spaces and tabs.
func checkHeaderValue(v string) error {
	if strings.ContainsAny(v, "\r\n") {
		return errors.New("contains a line break, which a NATS header value cannot carry")
	}
	if v != "" && (isSpace(v[0]) || isSpace(v[len(v)-1])) {
		return errors.New("starts or ends with whitespace, which a NATS header value drops")
	}
	return nil
}

// isSpace matches the ASCII whitespace textproto.TrimString removes.
func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// hasPrefixFold is strings.HasPrefix ignoring ASCII case.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
