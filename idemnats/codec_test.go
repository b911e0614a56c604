package idemnats_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
)

// wire serialises h the way the NATS client does and parses it back the way it does on receipt,
// so that round trips go through the real header format.
func wire(tb testing.TB, h nats.Header) nats.Header {
	tb.Helper()
	var b bytes.Buffer
	b.WriteString("NATS/1.0\r\n")
	for k, vs := range h {
		for _, v := range vs {
			b.WriteString(k + ": " + strings.NewReplacer("\r", " ", "\n", " ").Replace(strings.Trim(v, " \t\r\n")) + "\r\n")
		}
	}
	b.WriteString("\r\n")
	got, err := nats.DecodeHeadersMsg(b.Bytes())
	require.NoError(tb, err, "header block %q", b.String())
	return got
}

// sameMessage compares two messages field by field (times with Equal, nil and empty alike).
func sameMessage(tb testing.TB, want, got idem.Message) {
	tb.Helper()
	require.Equal(tb, want.EventID, got.EventID, "EventID")
	require.Equal(tb, want.Tenant, got.Tenant, "Tenant")
	require.Equal(tb, want.Type, got.Type, "Type")
	require.True(tb, bytes.Equal(want.Payload, got.Payload), "Payload %q, want %q", got.Payload, want.Payload)
	if len(want.Headers) == 0 {
		require.Empty(tb, got.Headers, "Headers")
	} else {
		require.Equal(tb, want.Headers, got.Headers, "Headers")
	}
	require.Equal(tb, want.Attempt, got.Attempt, "Attempt")
	require.True(tb, want.PublishedAt.Equal(got.PublishedAt), "PublishedAt %v, want %v", got.PublishedAt, want.PublishedAt)
	require.True(tb, want.OccurredAt.Equal(got.OccurredAt), "OccurredAt %v, want %v", got.OccurredAt, want.OccurredAt)
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	berlin := time.FixedZone("CEST", 2*60*60)
	tests := []struct {
		name string
		msg  idem.Message
	}{
		{name: "minimal", msg: idem.Message{EventID: "evt-1"}},
		{name: "every field", msg: idem.Message{
			EventID:    "order-17:paid",
			Tenant:     "acme",
			Type:       "payment.captured",
			Payload:    []byte(`{"amount_cents":1250}`),
			Headers:    map[string]string{"Trace-Id": "abc", "x-lower": "v", "Idem-Signature": "sha256=00ff"},
			OccurredAt: time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.UTC),
		}},
		{name: "occurred in another zone", msg: idem.Message{EventID: "e", OccurredAt: time.Date(2025, 1, 1, 0, 30, 0, 0, berlin)}},
		{name: "unicode values and binary payload", msg: idem.Message{
			EventID: "évènement-1", Tenant: "mañana", Type: "тип", Payload: []byte{0, 0xff, '\r', '\n'},
			Headers: map[string]string{"Note": "inner  spaces\tand tabs kept"},
		}},
		{name: "empty header value", msg: idem.Message{EventID: "e", Headers: map[string]string{"Empty": ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			nm, err := idemnats.EncodeMessage("orders.paid", tt.msg)
			require.NoError(t, err)
			require.Equal(t, "orders.paid", nm.Subject)
			require.Equal(t, idemnats.BrokerMsgID("orders.paid", tt.msg), nm.Header.Get(jetstream.MsgIDHeader),
				"JetStream's message id is the event id scoped by subject and content")
			md := &jetstream.MsgMetadata{NumDelivered: 3, Timestamp: time.Date(2025, 3, 4, 5, 6, 8, 0, time.UTC)}
			got, err := idemnats.DecodeHeaders(wire(t, nm.Header), nm.Data, md)
			require.NoError(t, err)
			want := tt.msg
			want.Attempt, want.PublishedAt = 3, md.Timestamp
			sameMessage(t, want, got)
			if !tt.msg.OccurredAt.IsZero() {
				require.Equal(t, time.UTC, got.OccurredAt.Location(), "OccurredAt decodes in UTC")
			}
		})
	}
}

func TestDecodeHeaders(t *testing.T) {
	t.Parallel()
	stamp := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		h       nats.Header
		md      *jetstream.MsgMetadata
		want    idem.Message
		wantErr string
	}{
		{
			name: "no message id decodes with an empty EventID and no error",
			h:    nats.Header{"Idem-Type": {"t"}},
			want: idem.Message{Type: "t"},
		},
		{
			name: "multi-valued headers decode to their first value",
			h:    nats.Header{"Nats-Msg-Id": {"a", "b"}, "Idem-Tenant": {"t1", "t2"}, "X": {"1", "2"}},
			want: idem.Message{EventID: "a", Tenant: "t1", Headers: map[string]string{"X": "1"}},
		},
		{
			name: "header names are case-sensitive, like the server's",
			h:    nats.Header{"nats-msg-id": {"lower"}, "Nats-Msg-Id": {"e"}},
			want: idem.Message{EventID: "e", Headers: map[string]string{"nats-msg-id": "lower"}},
		},
		{
			name: "metadata gives Attempt and PublishedAt",
			h:    nats.Header{"Nats-Msg-Id": {"e"}},
			md:   &jetstream.MsgMetadata{NumDelivered: 7, Timestamp: stamp},
			want: idem.Message{EventID: "e", Attempt: 7, PublishedAt: stamp},
		},
		{
			name: "other Nats- headers are kept as metadata",
			h:    nats.Header{"Nats-Msg-Id": {"e"}, "Nats-Stream-Source": {"SRC 1"}},
			want: idem.Message{EventID: "e", Headers: map[string]string{"Nats-Stream-Source": "SRC 1"}},
		},
		{
			name:    "malformed occurrence time is invalid payload naming the event",
			h:       nats.Header{"Nats-Msg-Id": {"e9"}, "Idem-Type": {"t"}, "Idem-Occurred-At": {"yesterday"}},
			want:    idem.Message{EventID: "e9", Type: "t"},
			wantErr: "event e9: header Idem-Occurred-At",
		},
		{
			name:    "occurrence time past year 9999 in UTC",
			h:       nats.Header{"Nats-Msg-Id": {"e"}, "Idem-Occurred-At": {"9999-12-31T23:59:59-01:00"}},
			want:    idem.Message{EventID: "e"},
			wantErr: "outside the years",
		},
		{
			name: "nil headers",
			h:    nil,
			want: idem.Message{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := idemnats.DecodeHeaders(tt.h, nil, tt.md)
			if tt.wantErr != "" {
				require.ErrorIs(t, err, idem.ErrInvalidPayload)
				require.ErrorContains(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
			}
			sameMessage(t, tt.want, got)
		})
	}
}

func TestEncodeMessage(t *testing.T) {
	t.Parallel()
	t.Run("mapped fields win over headers of the same name", func(t *testing.T) {
		t.Parallel()
		nm, err := idemnats.EncodeMessage("s", idem.Message{
			EventID: "e", Tenant: "real",
			Headers: map[string]string{
				"Idem-Tenant": "claimed", "Idem-Type": "forged", "Nats-Msg-Id": "other",
				"Idem-Decode-Error": "old", "Nats-Rollup": "all", "nats-expected-stream": "X", "Keep": "k",
			},
		})
		require.NoError(t, err)
		wantID := idemnats.BrokerMsgID("s", idem.Message{EventID: "e", Tenant: "real"})
		require.Equal(t, nats.Header{"Nats-Msg-Id": {wantID}, "Idem-Event-Id": {"e"}, "Idem-Tenant": {"real"}, "Keep": {"k"}}, nm.Header)
	})
	errs := []struct {
		name    string
		msg     idem.Message
		wantErr string
	}{
		{name: "no event id", msg: idem.Message{Type: "t"}, wantErr: `message (type "t") has no EventID`},
		{name: "event id with a line break", msg: idem.Message{EventID: "a\nb"}, wantErr: "line break"},
		{name: "header value with a line break", msg: idem.Message{EventID: "e7", Headers: map[string]string{"H": "a\r\nInjected: x"}}, wantErr: `event e7: header "H"`},
		{name: "header value with trailing space", msg: idem.Message{EventID: "e", Headers: map[string]string{"H": "a "}}, wantErr: "whitespace"},
		{name: "header name with a colon", msg: idem.Message{EventID: "e", Headers: map[string]string{"A:B": "v"}}, wantErr: `header "A:B": name contains ':'`},
		{name: "header name with a space", msg: idem.Message{EventID: "e", Headers: map[string]string{"A B": "v"}}, wantErr: "name contains"},
		{name: "empty header name", msg: idem.Message{EventID: "e", Headers: map[string]string{"": "v"}}, wantErr: "empty header name"},
		{name: "tenant with a line break", msg: idem.Message{EventID: "e", Tenant: "a\nb"}, wantErr: "Tenant contains a line break"},
		{name: "occurrence beyond RFC 3339", msg: idem.Message{EventID: "e", OccurredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, wantErr: "OccurredAt"},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := idemnats.EncodeMessage("s", tt.msg)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestReplayAndBrokerMsgIDBypassDedup(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		headers map[string]string
		wantID  string
	}{
		{"plain", nil, idemnats.BrokerMsgID("s", idem.Message{EventID: "evt-1"})},
		{"replay", map[string]string{idem.HeaderReplayOf: "42"}, "evt-1/replay/42"},
		{"explicit", map[string]string{idemnats.HeaderBrokerMsgID: "evt-1#dup"}, "evt-1#dup"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nm, err := idemnats.EncodeMessage("s", idem.Message{EventID: "evt-1", Headers: tc.headers})
			require.NoError(t, err)
			require.Equal(t, tc.wantID, nm.Header.Get(jetstream.MsgIDHeader))
			require.Empty(t, nm.Header.Get(idemnats.HeaderBrokerMsgID), "the override is not forwarded")
			m, err := idemnats.DecodeHeaders(nm.Header, nil, nil)
			require.NoError(t, err)
			require.Equal(t, "evt-1", m.EventID, "the event id survives whatever the broker id is")
		})
	}
}

// TestBrokerMsgID: the broker message id is the same for a true republish and differs for
// anything the consumer must judge (key reuse, another subject, another tenant), so the
// stream's duplicate window never hides key reuse; it is bounded whatever the event id.
func TestBrokerMsgID(t *testing.T) {
	t.Parallel()
	base := idem.Message{EventID: "evt-1", Tenant: "acme", Type: "order.created", Payload: []byte(`{"n":1}`),
		Headers: map[string]string{"Trace-Id": "a"}, OccurredAt: time.Unix(1, 0)}
	id := idemnats.BrokerMsgID("orders.a", base)
	require.Regexp(t, `^evt-1/[0-9a-f]{16}$`, id)

	republish := base.Clone()
	republish.Headers["Trace-Id"] = "b"
	republish.OccurredAt = time.Unix(2, 0)
	republish.Attempt = 3
	require.Equal(t, id, idemnats.BrokerMsgID("orders.a", republish),
		"volatile fields (headers, times, attempt) do not change the broker id: a republish is dropped")

	differ := map[string]func(m *idem.Message) string{
		"payload": func(m *idem.Message) string { m.Payload = []byte(`{"n":2}`); return "orders.a" },
		"type":    func(m *idem.Message) string { m.Type = "order.cancelled"; return "orders.a" },
		"tenant":  func(m *idem.Message) string { m.Tenant = "globex"; return "orders.a" },
		"subject": func(*idem.Message) string { return "orders.b" },
		// Length prefixes keep field boundaries: moving a byte from type to payload changes it.
		"boundary": func(m *idem.Message) string {
			m.Type, m.Payload = "order.created{", []byte(`"n":1}`)
			return "orders.a"
		},
	}
	for name, mutate := range differ {
		m := base.Clone()
		subject := mutate(&m)
		require.NotEqual(t, id, idemnats.BrokerMsgID(subject, m), "another %s must give another broker id", name)
	}

	long := base
	long.EventID = strings.Repeat("x", 5000)
	longID := idemnats.BrokerMsgID("orders.a", long)
	require.Regexp(t, `^sha256:[0-9a-f]{32}/[0-9a-f]{16}$`, longID)
	long.EventID = strings.Repeat("x", 4999) + "y"
	require.NotEqual(t, longID, idemnats.BrokerMsgID("orders.a", long), "long ids are hashed, not cut")
}
