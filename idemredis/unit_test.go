package idemredis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
)

func TestSourceConfigValidation(t *testing.T) {
	t.Parallel()
	// A client that never connects: validation fails before any command.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	for _, tc := range []struct {
		name string
		cfg  idemredis.SourceConfig
		err  string
	}{
		{"no stream", idemredis.SourceConfig{Group: "g"}, "SourceConfig.Stream is required"},
		{"no group", idemredis.SourceConfig{Stream: "s"}, "SourceConfig.Group is required"},
		{"bad start", idemredis.SourceConfig{Stream: "s", Group: "g", Start: "1-0"}, "SourceConfig.Start"},
		{"short lease", idemredis.SourceConfig{Stream: "s", Group: "g", Lease: time.Millisecond}, "shorter than LeaseMin"},
		{"long lease", idemredis.SourceConfig{Stream: "s", Group: "g", Lease: 25 * time.Hour}, "longer than LeaseMax"},
		{"short poll", idemredis.SourceConfig{Stream: "s", Group: "g", Poll: time.Millisecond}, "shorter than PollMin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := idemredis.NewSource(context.Background(), rdb, tc.cfg)
			require.ErrorContains(t, err, tc.err)
			require.True(t, strings.HasPrefix(err.Error(), "idemredis: "), err.Error())
		})
	}
	d := idemredis.SourceConfig{}.WithDefaults()
	require.Equal(t, idemredis.SourceConfig{Prefix: idemredis.PrefixDefault, Start: idemredis.StartOldest,
		Lease: idemredis.LeaseDefault, Poll: idemredis.PollDefault}, d)
}

func TestSinkConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  idemredis.SinkConfig
		err  string
	}{
		{"tiny window", idemredis.SinkConfig{DedupWindow: time.Microsecond}, "shorter than a millisecond"},
		{"negative max length", idemredis.SinkConfig{MaxLen: -1}, "MaxLen -1 is negative"},
		{"negative max payload", idemredis.SinkConfig{MaxPayload: -1}, "MaxPayload -1 is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := idemredis.NewSink(nil, tc.cfg)
			require.ErrorContains(t, err, tc.err)
		})
	}
	sink, err := idemredis.NewSink(nil, idemredis.SinkConfig{DedupWindow: -1})
	require.NoError(t, err, "a negative window turns deduplication off")
	require.Equal(t, "idem:orders", sink.StreamKey("orders"))
}

// fieldMap turns EncodeMessage's flat list into the map a stream entry decodes from.
func fieldMap(t *testing.T, flat []string) map[string]string {
	t.Helper()
	require.Zero(t, len(flat)%2)
	m := make(map[string]string, len(flat)/2)
	for i := 0; i < len(flat); i += 2 {
		_, dup := m[flat[i]]
		require.False(t, dup, "field %q written twice", flat[i])
		m[flat[i]] = flat[i+1]
	}
	return m
}

func TestCodecRoundTrip(t *testing.T) {
	t.Parallel()
	occurred := time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.FixedZone("x", 3600))
	for _, tc := range []struct {
		name string
		in   idem.Message
	}{
		{"full", idem.Message{EventID: "e1", Tenant: "acme", Type: "payment.captured", Payload: []byte(`{"a":1}`),
			OccurredAt: occurred, Headers: map[string]string{"Trace-Id": "t", "x": "line\nbreak"}}},
		{"binary payload", idem.Message{EventID: "e2", Payload: []byte{0, 1, 0xff, '\r', '\n'}}},
		{"empty payload", idem.Message{EventID: "e3"}},
		{"replay", idem.Message{EventID: "e4", Headers: map[string]string{idem.HeaderReplayOf: "42"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flat, err := idemredis.EncodeMessage(tc.in)
			require.NoError(t, err)
			got, err := idemredis.DecodeFields("1741064767123-0", fieldMap(t, flat), 1, false)
			require.NoError(t, err)
			require.Equal(t, tc.in.EventID, got.EventID)
			require.Equal(t, tc.in.Tenant, got.Tenant)
			require.Equal(t, tc.in.Type, got.Type)
			require.Equal(t, string(tc.in.Payload), string(got.Payload))
			require.True(t, got.OccurredAt.Equal(tc.in.OccurredAt), "OccurredAt %v, want %v", got.OccurredAt, tc.in.OccurredAt)
			require.Equal(t, 1, got.Attempt)
			require.Equal(t, time.UnixMilli(1741064767123).UTC(), got.PublishedAt)
			for k, v := range tc.in.Headers {
				require.Equal(t, v, got.Headers[k], "header %q", k)
			}
		})
	}
}

func TestEncodeMappedFieldsWin(t *testing.T) {
	t.Parallel()
	flat, err := idemredis.EncodeMessage(idem.Message{EventID: "real", Tenant: "acme", Payload: []byte("p"), Headers: map[string]string{
		idemredis.FieldEventID: "forged", idemredis.FieldTenant: "globex", idemredis.FieldPayload: "other",
		idemredis.FieldAttempt: "7", idemredis.HeaderBrokerMsgID: "x", "Keep": "k",
	}})
	require.NoError(t, err)
	require.Equal(t, map[string]string{idemredis.FieldEventID: "real", idemredis.FieldTenant: "acme", idemredis.FieldPayload: "p", "Keep": "k"}, fieldMap(t, flat))

	_, err = idemredis.EncodeMessage(idem.Message{EventID: "e", Headers: map[string]string{"": "v"}})
	require.ErrorContains(t, err, "empty name")
	_, err = idemredis.EncodeMessage(idem.Message{Type: "t"})
	require.ErrorContains(t, err, "no EventID")
	_, err = idemredis.EncodeMessage(idem.Message{EventID: "e", OccurredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	require.ErrorContains(t, err, "outside the years")
}

func TestDecodeFields(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		fields      map[string]string
		count       int64
		retry       bool
		wantAttempt int
		wantErr     string
	}{
		{"first delivery", map[string]string{idemredis.FieldEventID: "e"}, 1, false, 1, ""},
		{"third delivery", map[string]string{idemredis.FieldEventID: "e"}, 3, false, 3, ""},
		{"attempt ignored outside retry stream", map[string]string{idemredis.FieldEventID: "e", idemredis.FieldAttempt: "5"}, 1, false, 1, ""},
		{"retry stream", map[string]string{idemredis.FieldEventID: "e", idemredis.FieldAttempt: "5"}, 2, true, 6, ""},
		{"bad attempt", map[string]string{idemredis.FieldEventID: "e", idemredis.FieldAttempt: "x"}, 1, true, 1, "not an attempt number"},
		{"huge attempt", map[string]string{idemredis.FieldEventID: "e", idemredis.FieldAttempt: "99999999999"}, 1, true, 1, "not an attempt number"},
		{"bad time", map[string]string{idemredis.FieldEventID: "e", idemredis.FieldOccurredAt: "yesterday"}, 1, false, 1, "not RFC 3339"},
		{"year beyond", map[string]string{idemredis.FieldEventID: "e", idemredis.FieldOccurredAt: "9999-12-31T23:59:59-01:00"}, 1, false, 1, "outside the years"},
		{"no event id", map[string]string{"payload": "p"}, 1, false, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := idemredis.DecodeFields("5-0", tc.fields, tc.count, tc.retry)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.True(t, errors.Is(err, idem.ErrInvalidPayload))
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantAttempt, m.Attempt)
			require.Equal(t, tc.fields[idemredis.FieldEventID], m.EventID)
		})
	}
}

func TestBrokerMsgIDScope(t *testing.T) {
	t.Parallel()
	base := idem.Message{EventID: "e1", Tenant: "t", Type: "x", Payload: []byte("p")}
	id := idemredis.BrokerMsgID("idem:a", base)
	require.True(t, strings.HasPrefix(id, "e1/"), id)
	require.Equal(t, id, idemredis.BrokerMsgID("idem:a", base.Clone()), "deterministic")
	for name, other := range map[string]string{
		"stream":  idemredis.BrokerMsgID("idem:b", base),
		"payload": idemredis.BrokerMsgID("idem:a", idem.Message{EventID: "e1", Tenant: "t", Type: "x", Payload: []byte("q")}),
		"tenant":  idemredis.BrokerMsgID("idem:a", idem.Message{EventID: "e1", Tenant: "u", Type: "x", Payload: []byte("p")}),
		"type":    idemredis.BrokerMsgID("idem:a", idem.Message{EventID: "e1", Tenant: "t", Type: "y", Payload: []byte("p")}),
	} {
		require.NotEqual(t, id, other, "another %s is another publish", name)
	}
	replay := base.Clone()
	replay.Headers = map[string]string{idem.HeaderReplayOf: "42"}
	require.Equal(t, "e1/replay/42", idemredis.BrokerMsgID("idem:a", replay))
	forced := base.Clone()
	forced.Headers = map[string]string{idemredis.HeaderBrokerMsgID: "mine"}
	require.Equal(t, "mine", idemredis.BrokerMsgID("idem:a", forced))
	long := idemredis.BrokerMsgID("idem:a", idem.Message{EventID: strings.Repeat("x", 1000)})
	require.Less(t, len(long), 100, "a long event id is hashed")
}
