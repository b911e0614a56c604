package idemsqs

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/wire"
)

// Message attribute names of the wire mapping, shared with every idem transport's headers. They
// are a contract between producers and consumers, so they are constants rather than
// configuration.
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
	// AttrBodyEncoding says how the body carries the payload when it cannot carry it as it is:
	// "base64" for a payload that is not text SQS accepts (binary, invalid UTF-8, control
	// characters), "empty" for an empty payload (SQS refuses an empty body). Without it the
	// body is the payload, as any producer sends it.
	AttrBodyEncoding = wire.BodyEncoding
	// AttrKey, when present in Message.Headers, is the FIFO message group the Sink uses (see
	// KeyOf).
	AttrKey = idem.HeaderKey
	// AttrDecodeError is set by a Source on a message it could not decode.
	AttrDecodeError = wire.DecodeError
)

// Values of AttrBodyEncoding.
const (
	bodyBase64 = "base64"
	bodyEmpty  = "empty"
	// emptyBody is the body sent for an empty payload.
	emptyBody = "-"
)

// SQS's limits on message attributes and ids
// (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html).
const (
	// MaxAttributes is the most message attributes SQS accepts on one message; idem's mapped
	// fields take up to five of them, the headers share the rest.
	MaxAttributes     = 10
	maxAttrNameBytes  = 256
	maxBrokerIDBytes  = 128 // MessageGroupId and MessageDeduplicationId
	maxDedupEventPart = maxBrokerIDBytes - 17
)

// The attribute data types.
const (
	typeString = "String"
	typeBinary = "Binary"
)

// mapped reports whether name carries a Message field (or the body's encoding) and so is never
// copied from Message.Headers onto a message, nor back.
func mapped(name string) bool {
	switch name {
	case AttrEventID, AttrTenant, AttrType, AttrOccurredAt, AttrBodyEncoding, AttrDecodeError:
		return true
	}
	return false
}

// KeyOf is the key the Sink gives m as its FIFO MessageGroupId: the Idem-Key header when the
// producer set one (to its outbox row's Key, for that key's order), else "<tenant>/<event id>", which orders nothing
// but keeps one event's republishes in order.
func KeyOf(m idem.Message) string {
	if k := m.Headers[AttrKey]; k != "" {
		return k
	}
	return m.Tenant + "/" + m.EventID
}

// Encoded is the body and message attributes a Sink sends for one message.
type Encoded struct {
	Body       string
	Attributes map[string]types.MessageAttributeValue
}

// size estimates what the message counts against SQS's size limit: the body and every
// attribute's name, type and value.
func (e Encoded) size() int {
	n := len(e.Body)
	for k, v := range e.Attributes {
		n += len(k) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
	}
	return n
}

// Encode builds the body and attributes a Sink sends for m. The payload is the body when SQS
// accepts it as text, else it is base64-encoded and AttrBodyEncoding says so. The mapped fields
// and the free headers become String attributes (a header value that is not text SQS accepts
// becomes a Binary attribute; a header with an empty value is left out, since SQS refuses empty
// attribute values); mapped fields win over a header of the same name. It refuses a message
// without EventID (nothing downstream could recognise its redelivery), more attributes than SQS
// allows and attribute names SQS would refuse, so the error names the field instead of a
// broker status.
func Encode(m idem.Message) (Encoded, error) {
	if m.EventID == "" {
		return Encoded{}, errors.New("message has no EventID")
	}
	attrs := make(map[string]types.MessageAttributeValue, len(m.Headers)+5)
	for k, v := range m.Headers {
		if mapped(k) || v == "" {
			continue
		}
		if err := checkAttrName(k); err != nil {
			return Encoded{}, fmt.Errorf("event %q: %w", m.EventID, err)
		}
		attrs[k] = attrValue(v)
	}
	attrs[AttrEventID] = attrValue(m.EventID)
	if m.Tenant != "" {
		attrs[AttrTenant] = attrValue(m.Tenant)
	}
	if m.Type != "" {
		attrs[AttrType] = attrValue(m.Type)
	}
	if !m.OccurredAt.IsZero() {
		attrs[AttrOccurredAt] = attrValue(m.OccurredAt.UTC().Format(time.RFC3339Nano))
	}
	body := string(m.Payload)
	switch {
	case len(m.Payload) == 0:
		body = emptyBody
		attrs[AttrBodyEncoding] = attrValue(bodyEmpty)
	case !sqsText(body):
		body = base64.StdEncoding.EncodeToString(m.Payload)
		attrs[AttrBodyEncoding] = attrValue(bodyBase64)
	}
	if len(attrs) > MaxAttributes {
		return Encoded{}, fmt.Errorf("event %q: %d message attributes (idem's fields and the headers), SQS allows %d", m.EventID, len(attrs), MaxAttributes)
	}
	return Encoded{Body: body, Attributes: attrs}, nil
}

// attrValue is v as a String attribute, or a Binary one when SQS would refuse v as text.
func attrValue(v string) types.MessageAttributeValue {
	if sqsText(v) {
		return types.MessageAttributeValue{DataType: aws.String(typeString), StringValue: aws.String(v)}
	}
	return types.MessageAttributeValue{DataType: aws.String(typeBinary), BinaryValue: []byte(v)}
}

// sqsText reports whether s is text SQS takes in a body or a String attribute: valid UTF-8 of
// the characters XML allows (#x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD, #x10000 up).
func sqsText(s string) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			return false
		case r == 0x9, r == 0xA, r == 0xD:
		case r < 0x20, r > 0xD7FF && r < 0xE000, r == 0xFFFE, r == 0xFFFF:
			return false
		}
		i += size
	}
	return true
}

// checkAttrName refuses a message attribute name SQS would refuse: empty or over 256 bytes,
// characters other than letters, digits, '-', '_' and '.', a leading, trailing or doubled
// '.', or the reserved prefixes "AWS." and "Amazon.".
func checkAttrName(k string) error {
	switch {
	case k == "":
		return errors.New("empty header name")
	case len(k) > maxAttrNameBytes:
		return fmt.Errorf("header %q…: name over %d bytes", k[:32], maxAttrNameBytes)
	case strings.HasPrefix(k, ".") || strings.HasSuffix(k, ".") || strings.Contains(k, ".."):
		return fmt.Errorf("header %q: SQS refuses a name with a leading, trailing or doubled '.'", k)
	case strings.HasPrefix(strings.ToLower(k), "aws.") || strings.HasPrefix(strings.ToLower(k), "amazon."):
		return fmt.Errorf("header %q: names starting with AWS. or Amazon. are reserved by SQS", k)
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("header %q: SQS names take only letters, digits, '-', '_' and '.'", strconv.QuoteToASCII(k))
		}
	}
	return nil
}

// DeduplicationID is the MessageDeduplicationId a Sink gives m on a FIFO queue:
// "<event id>/<16 hex digits>", the digits being the start of SHA-256 over the tenant, type and
// payload (each length-prefixed). SQS drops a message whose deduplication id it saw on the queue
// within the last 5 minutes, so it drops only what is truly the same publish — same event and
// content — and lets through what the consumer must judge: a reused event id with other content
// (key reuse, dead-lettered by the consumer). An event id longer than 111 bytes or with
// characters SQS refuses in the id is replaced by "sha256:" and 32 hex digits of its own hash.
func DeduplicationID(m idem.Message) string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(m.Tenant), []byte(m.Type), m.Payload} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	return brokerID(m.EventID, maxDedupEventPart) + "/" + hex.EncodeToString(h.Sum(nil)[:8])
}

// GroupID is key as a MessageGroupId: key itself when SQS accepts it (1 to 128 characters,
// letters, digits and ASCII punctuation), else "sha256:" and 32 hex digits of its hash, so any
// key maps to one group.
func GroupID(key string) string { return brokerID(key, maxBrokerIDBytes) }

// brokerID is s when it is a valid SQS id part of at most max bytes, else its hash.
func brokerID(s string, max int) string {
	ok := s != "" && len(s) <= max
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] > 0x20 && s[i] < 0x7f // letters, digits and ASCII punctuation
	}
	if ok {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:16])
}

// Decode reads the idem.Message a received SQS message carries (see Encode). It is pure, so it
// can be fuzzed. Attempt is SQS's ApproximateReceiveCount (1 without it) and PublishedAt its
// SentTimestamp. A free attribute becomes a header (a Binary one as its bytes). A message that
// does not decode — no Idem-Event-Id, a malformed Idem-Occurred-At or body encoding — is still
// returned with everything else decoded, its EventID moved to the AttrEventID header and the
// reason in AttrDecodeError, so the consumer dead-letters it; the error wraps
// idem.ErrInvalidPayload.
func Decode(msg types.Message) (idem.Message, error) {
	m := idem.Message{Attempt: 1}
	if n, err := strconv.Atoi(msg.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil && n > 0 {
		m.Attempt = n
	}
	if ms, err := strconv.ParseInt(msg.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil && ms > 0 {
		m.PublishedAt = time.UnixMilli(ms)
	}
	var encoding, occurredAt string
	for k, v := range msg.MessageAttributes {
		s := attrString(v)
		switch k {
		case AttrEventID:
			m.EventID = s
		case AttrTenant:
			m.Tenant = s
		case AttrType:
			m.Type = s
		case AttrOccurredAt:
			occurredAt = s
		case AttrBodyEncoding:
			encoding = s
		case AttrDecodeError:
		default:
			if m.Headers == nil {
				m.Headers = make(map[string]string, len(msg.MessageAttributes))
			}
			m.Headers[k] = s
		}
	}
	var errs []error
	body := aws.ToString(msg.Body)
	switch encoding {
	case "":
		m.Payload = []byte(body)
	case bodyBase64:
		p, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			errs = append(errs, fmt.Errorf("body with %s %s: %w", AttrBodyEncoding, encoding, err))
		}
		m.Payload = p
	case bodyEmpty:
	default:
		errs = append(errs, fmt.Errorf("attribute %s %q is none of %s, %s", AttrBodyEncoding, encoding, bodyBase64, bodyEmpty))
		m.Payload = []byte(body)
	}
	if occurredAt != "" {
		t, err := time.Parse(time.RFC3339Nano, occurredAt)
		if err != nil {
			errs = append(errs, fmt.Errorf("attribute %s: %w", AttrOccurredAt, err))
		}
		m.OccurredAt = t
	}
	if m.EventID == "" {
		errs = append(errs, fmt.Errorf("no %s attribute", AttrEventID))
	}
	if len(errs) == 0 {
		return m, nil
	}
	err := fmt.Errorf("%w: %w", idem.ErrInvalidPayload, errors.Join(errs...))
	if m.Headers == nil {
		m.Headers = make(map[string]string, 2)
	}
	if m.EventID != "" {
		m.Headers[AttrEventID] = m.EventID
	}
	m.Headers[AttrDecodeError] = err.Error()
	m.EventID = ""
	return m, err
}

// attrString is an attribute's value as a string: a String or Number value as it is, a Binary
// value as its bytes.
func attrString(v types.MessageAttributeValue) string {
	if v.StringValue != nil {
		return *v.StringValue
	}
	return string(v.BinaryValue)
}
