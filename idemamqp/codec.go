package idemamqp

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/wire"
)

// Header names of the wire mapping, shared with the other idem transports (idemnats, idemhttp)
// so that a message keeps its fields when it crosses from one broker to another. They are a
// contract between producers and consumers, hence constants rather than configuration.
const (
	// HeaderEventID carries Message.EventID for producers that cannot set message_id; the
	// message_id property wins when both are present.
	HeaderEventID = wire.EventID
	// HeaderTenant carries Message.Tenant.
	HeaderTenant = wire.Tenant
	// HeaderType carries Message.Type (the AMQP type property carries it too, for tooling).
	HeaderType = wire.Type
	// HeaderOccurredAt carries Message.OccurredAt in RFC 3339 with nanoseconds, UTC.
	HeaderOccurredAt = wire.OccurredAt
	// HeaderAttempt is the attempt the next delivery of a republished message is: a Source sets
	// it when a Nak sends the message through a delay queue (or straight back), since a
	// republish is a new queue message whose broker counters start again. Absent means 1.
	HeaderAttempt = wire.Attempt
	// HeaderDecodeError is set by a Source on a message it could not decode (its EventID is then
	// empty, so the consumer dead-letters it as invalid_payload); it says what was wrong.
	HeaderDecodeError = wire.DecodeError
	// HeaderBrokerMsgID is the idemnats header for a deliberate copy that must bypass broker
	// deduplication. RabbitMQ does not deduplicate, so it is accepted and not forwarded.
	HeaderBrokerMsgID = wire.BrokerMsgID
	// HeaderDeliveryCount is the quorum queue's count of earlier deliveries of one queue message.
	HeaderDeliveryCount = "x-delivery-count"
)

// appID is the AMQP app-id of messages an idem Sink publishes.
const appID = "idem"

// mappedHeader reports whether name carries a Message field or transport state, so it is
// neither published from Message.Headers nor decoded into them.
func mappedHeader(name string) bool {
	switch name {
	case HeaderEventID, HeaderTenant, HeaderType, HeaderOccurredAt, HeaderAttempt,
		HeaderDecodeError, HeaderBrokerMsgID:
		return true
	}
	return brokerHeader(name)
}

// brokerHeader reports whether name is one the broker writes on dead-lettering and redelivery
// (x-death, x-first-death-*, x-last-death-*, x-delivery-count). They describe a queue message,
// not the event, so they are dropped on a republish and never reach Message.Headers.
func brokerHeader(name string) bool {
	return name == "x-death" || name == HeaderDeliveryCount ||
		strings.HasPrefix(name, "x-first-death-") || strings.HasPrefix(name, "x-last-death-")
}

// EncodeMessage builds the publishing a Sink sends for m: the event id as message_id, the
// mapped fields as Idem-* headers, m.Headers as string headers, the payload as body, the
// current time as timestamp and persistent delivery. A header in m.Headers named like a mapped
// one is not published, so that decoding and republishing a message (a dead-letter replay)
// cannot change its fields. It refuses a message without EventID and names or ids longer than
// the 255 bytes an AMQP short string holds. Its errors have no package prefix: the Sink wraps
// them.
func EncodeMessage(m idem.Message) (amqp.Publishing, error) {
	if m.EventID == "" {
		return amqp.Publishing{}, fmt.Errorf("message (type %q) has no EventID", m.Type)
	}
	if len(m.EventID) > 255 {
		return amqp.Publishing{}, fmt.Errorf("EventID is %d bytes, more than the 255 of message_id", len(m.EventID))
	}
	h := make(amqp.Table, len(m.Headers)+3)
	for k, v := range m.Headers {
		if mappedHeader(k) {
			continue
		}
		if k == "" || len(k) > 255 {
			return amqp.Publishing{}, fmt.Errorf("header name %.64q is %d bytes, want 1 to 255", k, len(k))
		}
		h[k] = v
	}
	if m.Tenant != "" {
		h[HeaderTenant] = m.Tenant
	}
	typ := ""
	if m.Type != "" {
		h[HeaderType] = m.Type
		if len(m.Type) <= 255 {
			typ = m.Type
		}
	}
	if !m.OccurredAt.IsZero() {
		t := m.OccurredAt.UTC()
		if t.Year() < 0 || t.Year() > 9999 {
			return amqp.Publishing{}, fmt.Errorf("OccurredAt %v is outside the years 0000-9999 RFC 3339 can write", t)
		}
		h[HeaderOccurredAt] = t.Format(time.RFC3339Nano)
	}
	return amqp.Publishing{
		Headers:      h,
		MessageId:    m.EventID,
		Type:         typ,
		AppId:        appID,
		Timestamp:    time.Now(),
		DeliveryMode: amqp.Persistent,
		Body:         m.Payload,
	}, nil
}

// DecodeDelivery builds the idem.Message a delivery carries. It is pure, so it can be fuzzed.
// Attempt is Idem-Attempt (1 when absent) plus the earlier deliveries of this queue message:
// the quorum queue's x-delivery-count, or 1 when the classic queue flags it redelivered (a lower
// bound: a classic queue does not count). A message without an event id decodes with EventID ""
// and the consumer dead-letters it as invalid_payload; a malformed mapped header is an error
// wrapping idem.ErrInvalidPayload, with everything else still decoded.
func DecodeDelivery(d amqp.Delivery) (idem.Message, error) {
	m := idem.Message{
		EventID:     d.MessageId,
		Payload:     d.Body,
		PublishedAt: d.Timestamp,
	}
	var errs []error
	str := func(name string) string {
		v, ok := d.Headers[name]
		if !ok {
			return ""
		}
		s, ok := headerString(v)
		if !ok {
			errs = append(errs, fmt.Errorf("header %s is a %T, want a string", name, v))
		}
		return s
	}
	if m.EventID == "" {
		m.EventID = str(HeaderEventID)
	}
	m.Tenant = str(HeaderTenant)
	m.Type = str(HeaderType)
	if m.Type == "" {
		m.Type = d.Type
	}
	if s := str(HeaderOccurredAt); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("header %s %.64q is not RFC 3339", HeaderOccurredAt, s))
		case t.UTC().Year() < 0 || t.UTC().Year() > 9999:
			errs = append(errs, fmt.Errorf("header %s %.64q is outside the years 0000-9999 in UTC", HeaderOccurredAt, s))
		default:
			m.OccurredAt = t.UTC()
		}
	}
	m.Attempt = 1
	if v, ok := d.Headers[HeaderAttempt]; ok {
		n, ok := headerInt(v)
		if !ok || n < 1 {
			errs = append(errs, fmt.Errorf("header %s is %v, want a positive integer", HeaderAttempt, v))
		} else {
			m.Attempt = n
		}
	}
	if n, ok := headerInt(d.Headers[HeaderDeliveryCount]); ok && n > 0 {
		m.Attempt = saturatingAdd(m.Attempt, n)
	} else if d.Redelivered {
		m.Attempt = saturatingAdd(m.Attempt, 1)
	}
	for k, v := range d.Headers {
		if mappedHeader(k) {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(d.Headers))
		}
		if s, ok := headerString(v); ok {
			m.Headers[k] = s
		} else {
			m.Headers[k] = fmt.Sprint(v)
		}
	}
	if len(errs) > 0 {
		return m, fmt.Errorf("%w: %w", idem.ErrInvalidPayload, errors.Join(errs...))
	}
	return m, nil
}

// headerString returns a header value that is text (a long string, or bytes holding UTF-8).
func headerString(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		if utf8.Valid(v) {
			return string(v), true
		}
	}
	return "", false
}

// headerInt returns an integer header value of any AMQP integer width, or a decimal string.
func headerInt(v any) (int, bool) {
	switch v := v.(type) {
	case int:
		return v, true
	case int8:
		return int(v), true
	case int16:
		return int(v), true
	case int32:
		return int(v), true
	case int64:
		return int(min(v, int64(^uint(0)>>1))), true
	case uint8:
		return int(v), true
	case uint16:
		return int(v), true
	case uint32:
		return int(v), true
	case string:
		n, err := strconv.Atoi(v)
		return n, err == nil
	}
	return 0, false
}

// saturatingAdd is a+b for non-negative ints, stopping at the largest int.
func saturatingAdd(a, b int) int {
	if a > int(^uint(0)>>1)-b {
		return int(^uint(0) >> 1)
	}
	return a + b
}

// republishing is the copy of d that a Nak sends back through a delay queue or straight to the
// work queue: the same body and properties, the broker's counters dropped and Idem-Attempt set
// to attempt, the number the next delivery will carry.
func republishing(d amqp.Delivery, attempt int) amqp.Publishing {
	h := make(amqp.Table, len(d.Headers)+1)
	for k, v := range d.Headers {
		if !brokerHeader(k) {
			h[k] = v
		}
	}
	h[HeaderAttempt] = int64(attempt)
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
