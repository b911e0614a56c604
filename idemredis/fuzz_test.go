package idemredis_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
)

// FuzzCodec: whatever a producer writes into a stream entry decodes without panicking, into a
// message whose Attempt is at least 1; and what decodes cleanly re-encodes (as a dead-letter
// replay does) and decodes again to the same fields.
func FuzzCodec(f *testing.F) {
	f.Add("1741064767123-0", "evt-1", "acme", "payment.captured", "2025-03-04T05:06:07.123456789Z", []byte(`{"a":1}`), "Trace-Id", "abc", "", int64(1), false)
	f.Add("0-1", "", "", "", "", []byte{0xff, 0}, "", "", "3", int64(2), true)
	f.Add("x", "e", "", "", "9999-12-31T23:59:59-01:00", []byte("p"), "Idem-Attempt", "9", "-1", int64(0), true)
	f.Add("18446744073709551615-0", "e", "", "", "yesterday", []byte(""), "payload", "p2", "99999999999", int64(1<<62), true)
	f.Fuzz(func(t *testing.T, id, eventID, tenant, typ, occurred string, payload []byte, hk, hv, attempt string, count int64, retry bool) {
		fields := map[string]string{idemredis.FieldPayload: string(payload)}
		for k, v := range map[string]string{
			idemredis.FieldEventID: eventID, idemredis.FieldTenant: tenant, idemredis.FieldType: typ,
			idemredis.FieldOccurredAt: occurred, idemredis.FieldAttempt: attempt,
		} {
			if v != "" {
				fields[k] = v
			}
		}
		if hk != "" {
			fields[hk] = hv
		}
		m, err := idemredis.DecodeFields(id, fields, count, retry)
		if m.Attempt < 1 {
			t.Fatalf("Attempt = %d, want at least 1", m.Attempt)
		}
		if err != nil || m.EventID == "" {
			return
		}
		flat, err := idemredis.EncodeMessage(m)
		if err != nil {
			t.Fatalf("a cleanly decoded message does not re-encode: %v", err)
		}
		again := make(map[string]string, len(flat)/2)
		for i := 0; i+1 < len(flat); i += 2 {
			again[flat[i]] = flat[i+1]
		}
		back, err := idemredis.DecodeFields(id, again, 1, false)
		if err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if back.EventID != m.EventID || back.Tenant != m.Tenant || back.Type != m.Type ||
			string(back.Payload) != string(m.Payload) || !back.OccurredAt.Equal(m.OccurredAt) {
			t.Fatalf("round trip changed the message: %+v -> %+v", m, back)
		}
		for k, v := range m.Headers {
			if back.Headers[k] != v {
				t.Fatalf("header %q = %q after the round trip, want %q", k, back.Headers[k], v)
			}
		}
		_ = idemredis.BrokerMsgID("idem:s", idem.Message{EventID: m.EventID, Payload: m.Payload, OccurredAt: time.Time{}})
	})
}
