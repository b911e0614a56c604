package idemamqp_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemamqp"
	"github.com/idemkit/idem/retry"
)

// delivered turns a publishing into the delivery a consumer would get for it.
func delivered(p amqp.Publishing, redelivered bool) amqp.Delivery {
	return amqp.Delivery{
		Headers: p.Headers, MessageId: p.MessageId, Timestamp: p.Timestamp, Type: p.Type,
		AppId: p.AppId, DeliveryMode: p.DeliveryMode, Body: p.Body, Redelivered: redelivered,
	}
}

func TestCodecRoundTrip(t *testing.T) {
	t.Parallel()
	occurred := time.Date(2026, 3, 4, 5, 6, 7, 890, time.UTC)
	m := idem.Message{
		EventID: "evt-1", Tenant: "acme", Type: "payment.captured", Payload: []byte{0, 1, 0xff},
		Headers: map[string]string{
			"Trace-Id": "t-1",
			// Mapped names in Headers never override the fields or the transport state.
			idemamqp.HeaderTenant: "evil", idemamqp.HeaderAttempt: "9", "x-death": "forged",
		},
		OccurredAt: occurred,
	}
	p, err := idemamqp.EncodeMessage(m)
	require.NoError(t, err)
	require.Equal(t, "evt-1", p.MessageId, "the event id is the message_id")
	require.Equal(t, amqp.Persistent, p.DeliveryMode)
	require.NotContains(t, p.Headers, "x-death")
	require.NotContains(t, p.Headers, idemamqp.HeaderAttempt)

	got, err := idemamqp.DecodeDelivery(delivered(p, false))
	require.NoError(t, err)
	require.Equal(t, m.EventID, got.EventID)
	require.Equal(t, "acme", got.Tenant)
	require.Equal(t, m.Type, got.Type)
	require.Equal(t, m.Payload, got.Payload)
	require.True(t, occurred.Equal(got.OccurredAt))
	require.Equal(t, map[string]string{"Trace-Id": "t-1"}, got.Headers)
	require.Equal(t, 1, got.Attempt)
	require.WithinDuration(t, time.Now(), got.PublishedAt, 2*time.Second)
}

func TestEncodeRefuses(t *testing.T) {
	t.Parallel()
	for name, m := range map[string]idem.Message{
		"no event id":      {Payload: []byte("x")},
		"long event id":    {EventID: strings.Repeat("e", 256)},
		"long header":      {EventID: "e", Headers: map[string]string{strings.Repeat("h", 256): "v"}},
		"empty header":     {EventID: "e", Headers: map[string]string{"": "v"}},
		"year past 9999":   {EventID: "e", OccurredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"year before 0000": {EventID: "e", OccurredAt: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		_, err := idemamqp.EncodeMessage(m)
		require.Error(t, err, name)
	}
}

func TestDecodeAttempt(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name        string
		headers     amqp.Table
		redelivered bool
		want        int
	}{
		{"first delivery", nil, false, 1},
		{"classic redelivery", nil, true, 2},
		{"republished by a nak", amqp.Table{idemamqp.HeaderAttempt: int64(3)}, false, 3},
		{"republished, then redelivered", amqp.Table{idemamqp.HeaderAttempt: int64(3)}, true, 4},
		{"quorum counts returns", amqp.Table{idemamqp.HeaderDeliveryCount: int64(2)}, true, 3},
		{"quorum count over a nak", amqp.Table{idemamqp.HeaderAttempt: int32(2), idemamqp.HeaderDeliveryCount: int64(1)}, true, 3},
	}
	for _, tc := range cases {
		got, err := idemamqp.DecodeDelivery(amqp.Delivery{MessageId: "e", Headers: tc.headers, Redelivered: tc.redelivered})
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, got.Attempt, tc.name)
	}
}

func TestDecodeInvalid(t *testing.T) {
	t.Parallel()
	cases := map[string]amqp.Table{
		"tenant not a string":  {idemamqp.HeaderTenant: int64(7)},
		"occurred-at garbage":  {idemamqp.HeaderOccurredAt: "yesterday"},
		"attempt zero":         {idemamqp.HeaderAttempt: int64(0)},
		"attempt not a number": {idemamqp.HeaderAttempt: "many"},
	}
	for name, h := range cases {
		m, err := idemamqp.DecodeDelivery(amqp.Delivery{MessageId: "e", Headers: h, Body: []byte("b")})
		require.ErrorIs(t, err, idem.ErrInvalidPayload, name)
		require.Equal(t, "e", m.EventID, "%s: the rest still decodes", name)
	}
	// Without message_id the event id comes from the header; without either it is empty.
	m, err := idemamqp.DecodeDelivery(amqp.Delivery{Headers: amqp.Table{idemamqp.HeaderEventID: []byte("from-header")}})
	require.NoError(t, err)
	require.Equal(t, "from-header", m.EventID)
	m, err = idemamqp.DecodeDelivery(amqp.Delivery{})
	require.NoError(t, err)
	require.Empty(t, m.EventID)
}

func TestDelayTier(t *testing.T) {
	t.Parallel()
	tiers := []time.Duration{time.Second, 5 * time.Second, time.Minute}
	for _, tc := range []struct{ delay, want time.Duration }{
		{-time.Second, 0},
		{0, 0},
		{time.Millisecond, time.Second},
		{time.Second, time.Second},
		{time.Second + 1, 5 * time.Second},
		{59 * time.Second, time.Minute},
		{time.Hour, time.Minute}, // past the largest tier: the largest
	} {
		require.Equal(t, tc.want, idemamqp.DelayTier(tiers, tc.delay), "delay %v", tc.delay)
	}
	require.Equal(t, "orders.idem-delay.5000ms", idemamqp.DelayQueueName("orders", 5*time.Second))
}

func TestSourceConfigValidation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  idemamqp.SourceConfig
		want string // a fragment naming the field
	}{
		{"queue", idemamqp.SourceConfig{}, "Queue is empty"},
		{"type", idemamqp.SourceConfig{Queue: "q", QueueType: "stream"}, "QueueType"},
		{"limit on classic", idemamqp.SourceConfig{Queue: "q", DeliveryLimit: 50}, "only quorum queues"},
		{"limit below attempts", idemamqp.SourceConfig{Queue: "q", QueueType: idemamqp.QueueQuorum, DeliveryLimit: 3, Retry: retry.Policy{MaxAttempts: 5}}, "below the retry policy's 5 attempts"},
		{"limit below default attempts", idemamqp.SourceConfig{Queue: "q", QueueType: idemamqp.QueueQuorum, DeliveryLimit: 2}, "DeliveryLimit is 2"},
		{"tiers order", idemamqp.SourceConfig{Queue: "q", DelayTiers: []time.Duration{time.Second, time.Second}}, "DelayTiers[1]"},
		{"tier too small", idemamqp.SourceConfig{Queue: "q", DelayTiers: []time.Duration{time.Microsecond}}, "DelayTiers[0]"},
		{"lease over timeout", idemamqp.SourceConfig{Queue: "q", Lease: time.Hour}, "Lease (1h0m0s) is not below ConsumerTimeout"},
		{"prefetch", idemamqp.SourceConfig{Queue: "q", Prefetch: -1}, "Prefetch"},
		{"args clash", idemamqp.SourceConfig{Queue: "q", QueueArgs: amqp.Table{"x-queue-type": "quorum"}}, "QueueArgs sets x-queue-type"},
		{"reconnect", idemamqp.SourceConfig{Queue: "q", ReconnectMin: time.Second, ReconnectMax: time.Millisecond}, "ReconnectMin/ReconnectMax"},
		{"binding exchange", idemamqp.SourceConfig{Queue: "q", Bindings: []idemamqp.Binding{{RoutingKey: "k"}}}, "Bindings[0].Exchange is empty"},
		{"binding kind", idemamqp.SourceConfig{Queue: "q", Bindings: []idemamqp.Binding{{Exchange: "x", Kind: "x-delayed-message"}}}, "Bindings[0].Kind"},
	}
	for _, tc := range cases {
		_, err := idemamqp.NewSource(t.Context(), func(context.Context) (*amqp.Connection, error) {
			return nil, errors.New("must not dial: the config is invalid")
		}, tc.cfg)
		require.ErrorContains(t, err, tc.want, tc.name)
		require.ErrorContains(t, err, "invalid SourceConfig", tc.name)
	}
	// A quorum queue with a limit at the policy's attempts is fine.
	cfg := idemamqp.SourceConfig{Queue: "q", QueueType: idemamqp.QueueQuorum, DeliveryLimit: 8}.WithDefaults()
	require.Equal(t, idemamqp.LeaseDefault, cfg.Lease)
	require.Equal(t, idemamqp.ConsumerTimeoutDefault, cfg.ConsumerTimeout)
	require.Equal(t, idemamqp.PrefetchDefault, cfg.Prefetch)
	require.Equal(t, idemamqp.DelayTiersDefault, cfg.DelayTiers)
}

// TestDialErrorMasksPassword: a failed dial names the broker without its password.
func TestDialErrorMasksPassword(t *testing.T) {
	t.Parallel()
	dial := idemamqp.DialURL("amqp://app:s3cret@127.0.0.1:1/prod", "test")
	_, err := idemamqp.NewSink(t.Context(), dial, idemamqp.SinkConfig{})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")
	require.Contains(t, err.Error(), "127.0.0.1:1")
	require.Equal(t, 1, strings.Count(err.Error(), "idemamqp:"), "the prefix appears once: %v", err)
}
