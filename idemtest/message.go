package idemtest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// TenantDefault is the tenant Message sets unless WithTenant says otherwise.
const TenantDefault = "tenant-test"

// MessageOption changes one field of the message Message builds.
type MessageOption func(*idem.Message)

// WithEventID sets the event id (default a random, unique "evt-…").
func WithEventID(id string) MessageOption { return func(m *idem.Message) { m.EventID = id } }

// WithTenant sets the tenant (default TenantDefault).
func WithTenant(tenant string) MessageOption { return func(m *idem.Message) { m.Tenant = tenant } }

// WithOccurredAt sets the occurrence time (default now).
func WithOccurredAt(t time.Time) MessageOption { return func(m *idem.Message) { m.OccurredAt = t } }

// WithHeader adds one header.
func WithHeader(name, value string) MessageOption {
	return func(m *idem.Message) {
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		m.Headers[name] = value
	}
}

// WithAttempt sets the delivery attempt (default 1).
func WithAttempt(n int) MessageOption { return func(m *idem.Message) { m.Attempt = n } }

// Message builds a valid message of type typ: a unique event id, TenantDefault, OccurredAt and
// PublishedAt now, attempt 1. payload may be []byte or json.RawMessage (used as is), nil (no
// payload) or any other value, a string included (encoded as JSON, which the default
// fingerprint expects; an encoding error fails the test). opts change fields.
func Message(t testing.TB, typ string, payload any, opts ...MessageOption) idem.Message {
	t.Helper()
	var body []byte
	switch p := payload.(type) {
	case nil:
	case []byte:
		body = append([]byte(nil), p...)
	case json.RawMessage:
		body = append([]byte(nil), p...)
	default:
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("idemtest: Message %s: encode payload: %v", typ, err)
		}
		body = b
	}
	now := time.Now().UTC()
	m := idem.Message{
		EventID:     NewEventID(),
		Tenant:      TenantDefault,
		Type:        typ,
		Payload:     body,
		Attempt:     1,
		OccurredAt:  now,
		PublishedAt: now,
	}
	for _, o := range opts {
		o(&m)
	}
	return m
}

// NewEventID returns a random event id, unique across tests run in parallel and processes.
func NewEventID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics on an unusable source)
	return "evt-" + hex.EncodeToString(b[:])
}
