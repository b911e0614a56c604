package idemamqp_test

import (
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemamqp"
)

// FuzzCodec: any message the Sink accepts decodes to the same fields, headers and first
// attempt; decoding never panics, whatever the mapped headers hold, an error always wraps
// idem.ErrInvalidPayload, and the attempt is never below 1.
func FuzzCodec(f *testing.F) {
	f.Add("evt-1", "acme", "payment.captured", "Trace-Id", "abc", []byte(`{"a":1}`), int64(1741064767123456789), "3", false)
	f.Add("", "", "", "", "", []byte(nil), int64(0), "", true)
	f.Add("e", "t", "", "x-death", "v", []byte{0xff}, int64(-62135596800000000), "0", true)
	f.Add("e", "", "", "Idem-Tenant", "evil", []byte("p"), int64(253402300799999999999/1000), "x", false)
	f.Fuzz(func(t *testing.T, id, tenant, typ, hk, hv string, payload []byte, occurred int64, attempt string, redelivered bool) {
		m := idem.Message{EventID: id, Tenant: tenant, Type: typ, Payload: payload, Headers: map[string]string{hk: hv}}
		if occurred != 0 {
			m.OccurredAt = time.Unix(0, occurred).UTC()
		}
		if p, err := idemamqp.EncodeMessage(m); err == nil {
			got, err := idemamqp.DecodeDelivery(delivered(p, false))
			if err != nil {
				t.Fatalf("an encoded message does not decode: %v", err)
			}
			if got.EventID != id || got.Tenant != tenant || got.Type != typ || string(got.Payload) != string(payload) || !got.OccurredAt.Equal(m.OccurredAt) {
				t.Fatalf("round trip changed the fields: %+v from %+v", got, m)
			}
			if got.Attempt != 1 {
				t.Fatalf("first delivery decodes as attempt %d", got.Attempt)
			}
			for k, v := range got.Headers {
				if k != hk || v != hv {
					t.Fatalf("header %q=%q appeared from %q=%q", k, v, hk, hv)
				}
			}
		}
		// Arbitrary values in the mapped headers of a foreign producer's message.
		d := amqp.Delivery{MessageId: id, Redelivered: redelivered, Body: payload, Headers: amqp.Table{
			idemamqp.HeaderTenant: []byte(tenant), idemamqp.HeaderOccurredAt: hv, idemamqp.HeaderAttempt: attempt,
			idemamqp.HeaderDeliveryCount: occurred, hk: payload,
		}}
		got, err := idemamqp.DecodeDelivery(d)
		if err != nil && !errors.Is(err, idem.ErrInvalidPayload) {
			t.Fatalf("decode error %v does not wrap ErrInvalidPayload", err)
		}
		if got.Attempt < 1 {
			t.Fatalf("Attempt %d", got.Attempt)
		}
	})
}
