package idempubsub_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempubsub"
)

// receiveAll receives until n deliveries arrived or within passed.
func receiveAll(t *testing.T, src idem.Source, n, max int, within time.Duration) []idem.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var got []idem.Delivery
	for len(got) < n {
		ds, err := src.Receive(ctx, max)
		require.NoError(t, err, "received %d of %d", len(got), n)
		got = append(got, ds...)
	}
	return got
}

func TestNewSourceConfig(t *testing.T) {
	t.Parallel()
	c := fake(t)
	topic := newTopic(t, c, false)
	sub := "projects/" + project + "/subscriptions/" + topic + ".lease"
	cases := []struct {
		name  string
		cfg   idempubsub.SourceConfig
		want  string
		lease time.Duration
	}{
		{"no subscription", idempubsub.SourceConfig{}, "Subscription is empty", 0},
		{"negative lease", idempubsub.SourceConfig{Subscription: sub, Lease: -time.Second}, "ack deadlines", 0},
		{"lease over 600s", idempubsub.SourceConfig{Subscription: sub, Lease: 601 * time.Second}, "ack deadlines", 0},
		{"negative flow control", idempubsub.SourceConfig{Subscription: sub, MaxOutstanding: -1}, "MaxOutstanding", 0},
		{"missing subscription", idempubsub.SourceConfig{Subscription: "nope"}, "subscriptions/nope", 0},
		{"default lease", idempubsub.SourceConfig{Subscription: sub}, "", idempubsub.LeaseDefault},
		{"fraction rounded up", idempubsub.SourceConfig{Subscription: sub, Lease: 1500 * time.Millisecond}, "", 2 * time.Second},
	}
	for _, tc := range cases {
		src, err := idempubsub.NewSource(context.Background(), c, tc.cfg)
		if tc.want == "" {
			require.NoError(t, err, tc.name)
			assert.Equal(t, tc.lease, src.Lease(), tc.name)
			assert.Equal(t, 10*time.Minute, src.RedeliveryWindow(), tc.name)
			assert.Equal(t, 0, src.DeliveryLimit(), tc.name)
			continue
		}
		require.Error(t, err, tc.name)
		assert.Contains(t, err.Error(), tc.want, tc.name)
	}
}

// TestOrderedSubscription: on a subscription with message ordering, a key's messages arrive in
// publish order, the next one only after the previous is acked.
func TestOrderedSubscription(t *testing.T) {
	t.Parallel()
	c := fake(t)
	topic := newTopic(t, c, true)
	src := openSource(t, c, topic, "ledger", 10*time.Second, true)
	sink := newSink(t, c)
	const n = 5
	for i := range n {
		m := idem.Message{EventID: fmt.Sprintf("e-%d", i), Payload: []byte("p"), Headers: map[string]string{idempubsub.AttrKey: "order-1"}}
		require.NoError(t, sink.Publish(context.Background(), topic, m))
	}
	for i := range n {
		ds := receiveAll(t, src, 1, 10, 5*time.Second)
		require.Len(t, ds, 1, "an ordered key has one message outstanding")
		assert.Equal(t, fmt.Sprintf("e-%d", i), ds[0].Message().EventID)
		require.NoError(t, ds[0].Ack(context.Background()))
	}
}

// TestSinkResumesKeyAfterFailure: a refused message pauses its ordering key in the publisher;
// Publish resumes it, so the key's next message is published.
func TestSinkResumesKeyAfterFailure(t *testing.T) {
	t.Parallel()
	c := fake(t)
	topic := newTopic(t, c, false)
	src := openSource(t, c, topic, "ledger", 10*time.Second, false)
	sink := newSink(t, c)
	key := map[string]string{idempubsub.AttrKey: "k"}
	bad := idem.Message{EventID: "bad", Payload: make([]byte, 11<<20), Headers: key}
	later := idem.Message{EventID: "later", Payload: []byte("l"), Headers: key}
	err := sink.Publish(context.Background(), topic, bad, later)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"bad"`)
	assert.Contains(t, err.Error(), `"later"`, "a key's messages after a failure fail too")

	require.NoError(t, sink.Publish(context.Background(), topic, later), "the key must be resumed after a failure")
	ds := receiveAll(t, src, 1, 10, 5*time.Second)
	require.Len(t, ds, 1)
	assert.Equal(t, "later", ds[0].Message().EventID)
}

// TestFlowControl: a source never holds more than MaxOutstanding unsettled deliveries; a
// settle makes room.
func TestFlowControl(t *testing.T) {
	t.Parallel()
	c := fake(t)
	topic := newTopic(t, c, false)
	sub := createSubscription(t, c, topic, "ledger", false)
	src, err := idempubsub.NewSource(context.Background(), c, idempubsub.SourceConfig{Subscription: sub, Lease: 10 * time.Second, MaxOutstanding: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	msgs := make([]idem.Message, 4)
	for i := range msgs {
		msgs[i] = idem.Message{EventID: fmt.Sprintf("f-%d", i), Payload: []byte("p")}
	}
	require.NoError(t, newSink(t, c).Publish(context.Background(), topic, msgs...))

	held := receiveAll(t, src, 2, 10, 5*time.Second)
	require.Len(t, held, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	ds, err := src.Receive(ctx, 10)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a full source must wait, got %d deliveries", len(ds))
	require.NoError(t, held[0].Ack(context.Background()))
	more := receiveAll(t, src, 1, 10, 5*time.Second)
	assert.Len(t, more, 1, "one settle makes room for one")
}

// TestDeadLetterPolicy: with a dead-letter policy the source reports its MaxDeliveryAttempts as
// its delivery limit, and Attempt is Pub/Sub's DeliveryAttempt.
func TestDeadLetterPolicy(t *testing.T) {
	t.Parallel()
	c := fake(t)
	topic := newTopic(t, c, false)
	dlq := newTopic(t, c, false)
	sub := "projects/" + project + "/subscriptions/" + topic + ".dl"
	_, err := c.SubscriptionAdminClient.CreateSubscription(context.Background(), &pubsubpb.Subscription{
		Name: sub, Topic: "projects/" + project + "/topics/" + topic, AckDeadlineSeconds: 10,
		MessageRetentionDuration: durationpb.New(time.Hour),
		DeadLetterPolicy:         &pubsubpb.DeadLetterPolicy{DeadLetterTopic: "projects/" + project + "/topics/" + dlq, MaxDeliveryAttempts: 7},
	})
	require.NoError(t, err)
	src, err := idempubsub.NewSource(context.Background(), c, idempubsub.SourceConfig{Subscription: sub, Lease: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	assert.Equal(t, 7, src.DeliveryLimit())
	assert.Equal(t, time.Hour, src.RedeliveryWindow())

	require.NoError(t, newSink(t, c).Publish(context.Background(), topic, idem.Message{EventID: "d-1", Payload: []byte("p")}))
	for attempt := 1; attempt <= 2; attempt++ {
		ds := receiveAll(t, src, 1, 1, 5*time.Second)
		assert.Equal(t, attempt, ds[0].Message().Attempt)
		if attempt == 1 {
			require.NoError(t, ds[0].Nak(context.Background(), 0))
		} else {
			require.NoError(t, ds[0].Term(context.Background()))
		}
	}
}

// TestReceiveAfterClose: Receive on a closed source fails instead of blocking.
func TestReceiveAfterClose(t *testing.T) {
	t.Parallel()
	c := fake(t)
	src := openSource(t, c, newTopic(t, c, false), "closed", 10*time.Second, false)
	require.NoError(t, src.Close())
	_, err := src.Receive(context.Background(), 1)
	require.Error(t, err)
	assert.False(t, errors.Is(err, context.Canceled))
}

// TestExtendAfterTheDeadlineIsLeaseLost: a handler whose extension comes after its ack
// deadline (a stalled process, a starved timer) has lost the message: Pub/Sub delivers it again
// meanwhile, and a ModifyAckDeadline on the old ack id is accepted without error. The source
// knows the deadline it set, so Extend reports idem.ErrLeaseLost and the consumer rolls the
// handler back instead of running on beside the redelivery.
func TestExtendAfterTheDeadlineIsLeaseLost(t *testing.T) {
	t.Parallel()
	c := fake(t)
	topic := newTopic(t, c, false)
	src := openSource(t, c, topic, "late", time.Second, false)
	require.NoError(t, newSink(t, c).Publish(context.Background(), topic, idem.Message{EventID: "late-1", Payload: []byte("p")}))
	first := receiveAll(t, src, 1, 1, 5*time.Second)[0]
	again := receiveAll(t, src, 1, 1, 10*time.Second)[0]
	require.Equal(t, "late-1", again.Message().EventID, "redelivered after the deadline")
	err := first.Extend(context.Background())
	require.ErrorIs(t, err, idem.ErrLeaseLost, "extending a delivery whose deadline passed")
	for _, delay := range []time.Duration{0, time.Minute} {
		// A late Nak would move the message its new owner holds: now, or a minute away.
		require.ErrorIs(t, first.Nak(context.Background(), delay), idem.ErrLeaseLost, "nak(%s) of a delivery whose deadline passed", delay)
	}
	require.NoError(t, again.Extend(context.Background()), "the current delivery still extends")
	require.NoError(t, again.Ack(context.Background()))
}
