package idemkafka_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
)

func TestCodecRoundTrip(t *testing.T) {
	t.Parallel()
	occurred := time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.FixedZone("x", 3600))
	stored := time.Date(2025, 3, 4, 6, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		in   idem.Message
		want idem.Message // Attempt and PublishedAt come from the record
	}{
		{
			name: "full",
			in: idem.Message{EventID: "evt-1", Tenant: "acme", Type: "payment.captured", Payload: []byte(`{"a":1}`),
				Headers: map[string]string{"Trace-Id": "t-1", "Bin": "\x00\xff\r\n"}, OccurredAt: occurred},
			want: idem.Message{EventID: "evt-1", Tenant: "acme", Type: "payment.captured", Payload: []byte(`{"a":1}`),
				Headers: map[string]string{"Trace-Id": "t-1", "Bin": "\x00\xff\r\n"}, OccurredAt: occurred.UTC(), Attempt: 1, PublishedAt: stored},
		},
		{
			name: "bare",
			in:   idem.Message{EventID: "evt-2"},
			want: idem.Message{EventID: "evt-2", Attempt: 1, PublishedAt: stored},
		},
		{
			name: "mapped headers in Headers do not override fields or forge retry state",
			in: idem.Message{EventID: "evt-3", Tenant: "real", Headers: map[string]string{
				idemkafka.HeaderTenant: "forged", idemkafka.HeaderEventID: "other", idemkafka.HeaderAttempt: "9",
				idemkafka.HeaderRetryAt: "2999-01-01T00:00:00Z", idemkafka.HeaderPublishedAt: "2000-01-01T00:00:00Z",
				idemkafka.HeaderDecodeError: "x", idemkafka.HeaderKey: "order-7",
			}},
			want: idem.Message{EventID: "evt-3", Tenant: "real", Headers: map[string]string{idemkafka.HeaderKey: "order-7"}, Attempt: 1, PublishedAt: stored},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := idemkafka.EncodeRecord("topic", []byte(idemkafka.KeyOf(tc.in)), tc.in)
			require.NoError(t, err)
			r.Timestamp = stored
			d := idemkafka.DecodeRecord(r)
			require.NoError(t, d.Err)
			require.True(t, d.RetryAt.IsZero())
			require.Equal(t, tc.want, d.Message)
		})
	}
}

func TestEncodeRefuses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		m    idem.Message
		want string
	}{
		{"no event id", idem.Message{Type: "t"}, "no EventID"},
		{"year beyond RFC 3339", idem.Message{EventID: "e", OccurredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, "0000-9999"},
	}
	for _, tc := range cases {
		_, err := idemkafka.EncodeRecord("t", nil, tc.m)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}

func TestDecodeRecord(t *testing.T) {
	t.Parallel()
	h := func(kv ...string) []kgo.RecordHeader {
		var out []kgo.RecordHeader
		for i := 0; i < len(kv); i += 2 {
			out = append(out, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return out
	}
	cases := []struct {
		name    string
		headers []kgo.RecordHeader
		wantID  string
		attempt int
		retryAt time.Time
		badWith string // a decode error mentioning this
	}{
		{name: "foreign record: no id, no error", headers: h("X", "1"), wantID: "", attempt: 1},
		{name: "retry copy", headers: h(idemkafka.HeaderEventID, "e", idemkafka.HeaderAttempt, "3", idemkafka.HeaderRetryAt, "2025-01-01T00:00:01Z"),
			wantID: "e", attempt: 3, retryAt: time.Date(2025, 1, 1, 0, 0, 1, 0, time.UTC)},
		{name: "repeated header: the first wins", headers: h(idemkafka.HeaderEventID, "first", idemkafka.HeaderEventID, "second"), wantID: "first", attempt: 1},
		{name: "attempt zero", headers: h(idemkafka.HeaderEventID, "e", idemkafka.HeaderAttempt, "0"), badWith: idemkafka.HeaderAttempt},
		{name: "attempt not a number", headers: h(idemkafka.HeaderEventID, "e", idemkafka.HeaderAttempt, "two"), badWith: idemkafka.HeaderAttempt},
		{name: "occurred at not a time", headers: h(idemkafka.HeaderEventID, "e", idemkafka.HeaderOccurredAt, "yesterday"), badWith: idemkafka.HeaderOccurredAt},
		{name: "retry at not a time", headers: h(idemkafka.HeaderEventID, "e", idemkafka.HeaderRetryAt, "soon"), badWith: idemkafka.HeaderRetryAt},
		{name: "published at not a time", headers: h(idemkafka.HeaderEventID, "e", idemkafka.HeaderPublishedAt, "-1"), badWith: idemkafka.HeaderPublishedAt},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := idemkafka.DecodeRecord(&kgo.Record{Topic: "orders", Partition: 2, Offset: 41, Headers: tc.headers})
			if tc.badWith != "" {
				require.ErrorIs(t, d.Err, idem.ErrInvalidPayload)
				require.ErrorContains(t, d.Err, tc.badWith)
				require.Empty(t, d.Message.EventID, "an undecodable record must reach the consumer without id, to be dead-lettered")
				require.Contains(t, d.Message.Headers[idemkafka.HeaderDecodeError], tc.badWith)
				return
			}
			require.NoError(t, d.Err)
			require.Equal(t, tc.wantID, d.Message.EventID)
			require.Equal(t, tc.attempt, d.Message.Attempt)
			require.True(t, tc.retryAt.Equal(d.RetryAt), "RetryAt %v, want %v", d.RetryAt, tc.retryAt)
		})
	}
}

func TestKeyOf(t *testing.T) {
	t.Parallel()
	require.Equal(t, "acme/e1", idemkafka.KeyOf(idem.Message{EventID: "e1", Tenant: "acme"}))
	require.Equal(t, "order-9", idemkafka.KeyOf(idem.Message{EventID: "e1", Tenant: "acme", Headers: map[string]string{idemkafka.HeaderKey: "order-9"}}))
}

// FuzzDecodeRecord feeds arbitrary headers and values through DecodeRecord: it never panics, a
// decoded message has an id exactly when it decoded without error, mapped headers never leak
// into Headers, and a decoded message re-encodes and decodes to itself.
func FuzzDecodeRecord(f *testing.F) {
	f.Add("Idem-Event-Id\x00e1\x00Idem-Tenant\x00acme\x00Idem-Occurred-At\x002025-03-04T05:06:07.1Z\x00Trace\x00x", []byte("v"), int64(7))
	f.Add("Idem-Attempt\x003\x00Idem-Retry-At\x002025-01-01T00:00:00Z", []byte(nil), int64(0))
	f.Add("Idem-Attempt\x00-1\x00Idem-Event-Id\x00a\x00Idem-Event-Id\x00b", []byte{0xff}, int64(1<<40))
	f.Add("Idem-Published-At\x009999-12-31T23:59:59-01:00", []byte("p"), int64(-1))
	f.Fuzz(func(t *testing.T, headers string, value []byte, offset int64) {
		parts := strings.Split(headers, "\x00")
		var hs []kgo.RecordHeader
		for i := 0; i+1 < len(parts); i += 2 {
			hs = append(hs, kgo.RecordHeader{Key: parts[i], Value: []byte(parts[i+1])})
		}
		r := &kgo.Record{Topic: "t", Partition: 1, Offset: offset, Headers: hs, Value: value, Timestamp: time.Unix(1, 0)}
		d := idemkafka.DecodeRecord(r)
		if d.Err != nil {
			if !errors.Is(d.Err, idem.ErrInvalidPayload) {
				t.Fatalf("decode error %v does not wrap ErrInvalidPayload", d.Err)
			}
			if d.Message.EventID != "" {
				t.Fatalf("undecodable record kept EventID %q", d.Message.EventID)
			}
			return
		}
		m := d.Message
		if !hasHeader(hs, idemkafka.HeaderEventID) && m.EventID != "" {
			t.Fatalf("a record without Idem-Event-Id got id %q", m.EventID)
		}
		if m.Attempt < 1 {
			t.Fatalf("Attempt %d", m.Attempt)
		}
		for k := range m.Headers {
			switch k {
			case idemkafka.HeaderEventID, idemkafka.HeaderTenant, idemkafka.HeaderType, idemkafka.HeaderOccurredAt,
				idemkafka.HeaderAttempt, idemkafka.HeaderRetryAt, idemkafka.HeaderPublishedAt, idemkafka.HeaderDecodeError:
				t.Fatalf("mapped header %s left in Headers", k)
			}
		}
		enc, err := idemkafka.EncodeRecord("t", nil, m)
		if err != nil {
			if m.EventID == "" {
				return // no id: nothing to republish
			}
			t.Fatalf("re-encoding %+v: %v", m, err)
		}
		enc.Timestamp = r.Timestamp
		again := idemkafka.DecodeRecord(enc)
		if again.Err != nil {
			t.Fatalf("re-decoding: %v", again.Err)
		}
		want := m
		want.Attempt, want.PublishedAt = 1, r.Timestamp // retry state is not republished
		if !sameMessage(want, again.Message) {
			t.Fatalf("round trip changed the message:\n got %+v\nwant %+v", again.Message, want)
		}
	})
}

func hasHeader(hs []kgo.RecordHeader, k string) bool {
	for _, h := range hs {
		if h.Key == k {
			return true
		}
	}
	return false
}

// sameMessage compares messages field by field (times with Equal, nil and empty alike).
func sameMessage(a, b idem.Message) bool {
	if a.EventID != b.EventID || a.Tenant != b.Tenant || a.Type != b.Type || string(a.Payload) != string(b.Payload) ||
		a.Attempt != b.Attempt || !a.OccurredAt.Equal(b.OccurredAt) || !a.PublishedAt.Equal(b.PublishedAt) || len(a.Headers) != len(b.Headers) {
		return false
	}
	for k, v := range a.Headers {
		if bv, ok := b.Headers[k]; !ok || bv != v {
			return false
		}
	}
	return true
}
