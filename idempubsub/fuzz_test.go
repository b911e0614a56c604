package idempubsub_test

import (
	"maps"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempubsub"
)

// FuzzCodec: whatever Encode accepts decodes to the same message, and Decode never panics on
// attributes from any producer.
func FuzzCodec(f *testing.F) {
	f.Add("e-1", "t", "order.created", []byte(`{"a":1}`), "Trace-Id", "x", int64(1700000000123456789))
	f.Add("", "", "", []byte{0, 0xff}, "Idem-Event-Id", "forged", int64(0))
	f.Add("é", "goog", "", []byte(nil), "googclient", "v", int64(-1))
	f.Fuzz(func(t *testing.T, id, tenant, typ string, payload []byte, hk, hv string, occurred int64) {
		m := idem.Message{EventID: id, Tenant: tenant, Type: typ, Payload: payload, Headers: map[string]string{hk: hv}}
		if occurred != 0 {
			m.OccurredAt = time.Unix(0, occurred).UTC()
		}
		pm, err := idempubsub.Encode(m, idempubsub.KeyOf(m))
		if err != nil {
			_, _ = idempubsub.Decode(payload, map[string]string{hk: hv, idempubsub.AttrOccurredAt: hv}, time.Now(), 1)
			return
		}
		got, err := idempubsub.Decode(pm.Data, pm.Attributes, time.Now(), 1)
		if err != nil {
			t.Fatalf("Decode(Encode(%+v)): %v", m, err)
		}
		if got.EventID != m.EventID || got.Tenant != m.Tenant || got.Type != m.Type || string(got.Payload) != string(m.Payload) || !got.OccurredAt.Equal(m.OccurredAt) {
			t.Fatalf("round trip changed the message: sent %+v, got %+v", m, got)
		}
		want := maps.Clone(m.Headers)
		switch hk {
		case idempubsub.AttrEventID, idempubsub.AttrTenant, idempubsub.AttrType, idempubsub.AttrOccurredAt, idempubsub.AttrDecodeError:
			delete(want, hk) // mapped names never pass as headers
		}
		if len(want) == 0 {
			want = nil
		}
		if !maps.Equal(got.Headers, want) {
			t.Fatalf("headers: sent %v, got %v", want, got.Headers)
		}
	})
}
