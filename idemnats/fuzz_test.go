package idemnats_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
)

// FuzzDecodeHeaders feeds raw NATS header blocks (as they arrive on the wire) through the
// client's parser and DecodeHeaders. Decoding must never panic, must map the reserved headers
// to fields and nothing else, and a decoded message the Sink accepts must decode to the same
// message again after a trip over the wire.
func FuzzDecodeHeaders(f *testing.F) {
	f.Add([]byte("NATS/1.0\r\nNats-Msg-Id: evt-1\r\nIdem-Tenant: acme\r\nIdem-Type: payment.captured\r\nIdem-Occurred-At: 2025-03-04T05:06:07.123456789Z\r\nTrace-Id: abc\r\n\r\n"),
		[]byte(`{"amount_cents":1250}`), uint64(1), int64(1741064767000000000))
	f.Add([]byte("NATS/1.0\r\nIdem-Type: t\r\n\r\n"), []byte(nil), uint64(0), int64(0))
	f.Add([]byte("NATS/1.0\r\nNats-Msg-Id: a\r\nNats-Msg-Id: b\r\nX: 1\r\nX: 2\r\n\r\n"), []byte("p"), uint64(3), int64(-1))
	f.Add([]byte("NATS/1.0\r\nNats-Msg-Id: e\r\nIdem-Occurred-At: 9999-12-31T23:59:59-01:00\r\n\r\n"), []byte{0xff}, uint64(1<<63), int64(1))
	f.Fuzz(func(t *testing.T, block, data []byte, delivered uint64, stamp int64) {
		h, err := nats.DecodeHeadersMsg(block)
		if err != nil {
			return
		}
		md := &jetstream.MsgMetadata{NumDelivered: delivered, Timestamp: time.Unix(0, stamp).UTC()}
		m, err := idemnats.DecodeHeaders(h, data, md)
		if err != nil && !errors.Is(err, idem.ErrInvalidPayload) {
			t.Fatalf("decode error %v does not wrap ErrInvalidPayload", err)
		}
		wantID := h.Get(idemnats.HeaderEventID)
		if wantID == "" {
			wantID = h.Get(idemnats.HeaderMsgID)
		}
		if m.EventID != wantID || m.Tenant != h.Get(idemnats.HeaderTenant) || m.Type != h.Get(idemnats.HeaderType) {
			t.Fatalf("fields %q/%q/%q do not match headers %v", m.EventID, m.Tenant, m.Type, h)
		}
		if m.Attempt < 0 {
			t.Fatalf("Attempt %d from NumDelivered %d", m.Attempt, delivered)
		}
		for k := range m.Headers {
			switch k {
			case idemnats.HeaderEventID, idemnats.HeaderMsgID, idemnats.HeaderBrokerMsgID, idemnats.HeaderTenant, idemnats.HeaderType, idemnats.HeaderOccurredAt:
				t.Fatalf("mapped header %s left in Headers", k)
			}
		}
		if err != nil {
			return
		}

		nm, err := idemnats.EncodeMessage("s", m)
		if err != nil {
			return // no EventID, or a header the sink refuses to publish lossily
		}
		again, err := idemnats.DecodeHeaders(wire(t, nm.Header), nm.Data, md)
		if err != nil {
			t.Fatalf("re-decoding %v: %v", nm.Header, err)
		}
		want := m
		want.Headers = nil
		for k, v := range m.Headers {
			if strings.HasPrefix(strings.ToLower(k), "nats-") || k == idemnats.HeaderDecodeError {
				continue // not republished
			}
			if want.Headers == nil {
				want.Headers = map[string]string{}
			}
			want.Headers[k] = v
		}
		sameMessage(t, want, again)
	})
}
