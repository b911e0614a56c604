package idemsqs_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqs"
)

// TestFIFODedup: on a FIFO queue the same publish sent three times (alone twice, then twice in
// one batch) is stored once, while a reused event id with other content is stored too, for the
// consumer to judge as key reuse; each carries the group of its key and the deduplication id of
// its event id and content.
func TestFIFODedup(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	url := newQueue(t, c, map[string]string{"FifoQueue": "true"})
	sink, err := idemsqs.NewSink(c, idemsqs.SinkConfig{})
	require.NoError(t, err)
	ctx := context.Background()
	m := idem.Message{EventID: "e-dup", Tenant: "t", Type: "order.created", Payload: []byte(`{"n":1}`), Headers: map[string]string{idemsqs.AttrKey: "order-1"}}
	reused := m.Clone()
	reused.Payload = []byte(`{"n":2}`)
	require.NoError(t, sink.Publish(ctx, url, m))
	require.NoError(t, sink.Publish(ctx, url, m))
	require.NoError(t, sink.Publish(ctx, url, m, m))
	require.NoError(t, sink.Publish(ctx, url, reused))

	var got []types.Message
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && len(got) < 3 {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		require.NoError(t, err)
		for _, sm := range out.Messages {
			got = append(got, sm)
			_, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: sm.ReceiptHandle})
			require.NoError(t, err)
		}
	}
	require.Len(t, got, 2, "the first publish and the reused event id, nothing else")
	for i, want := range []idem.Message{m, reused} {
		dm, err := idemsqs.Decode(got[i])
		require.NoError(t, err)
		require.Equal(t, string(want.Payload), string(dm.Payload), "message %d in publish order", i)
		require.Equal(t, "order-1", got[i].Attributes["MessageGroupId"])
		require.Equal(t, idemsqs.DeduplicationID(want), got[i].Attributes["MessageDeduplicationId"])
	}
}

// TestFIFOGroupOrder: a key's messages come in publish order and one at a time: while one is
// held, the next of its key is not delivered, but another key's is.
func TestFIFOGroupOrder(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	url := newQueue(t, c, map[string]string{"FifoQueue": "true"})
	sink, err := idemsqs.NewSink(c, idemsqs.SinkConfig{})
	require.NoError(t, err)
	key := func(k string) map[string]string { return map[string]string{idemsqs.AttrKey: k} }
	for _, m := range []idem.Message{
		{EventID: "a-1", Payload: []byte("a1"), Headers: key("a")},
		{EventID: "a-2", Payload: []byte("a2"), Headers: key("a")},
		{EventID: "b-1", Payload: []byte("b1"), Headers: key("b")},
		{EventID: "a-3", Payload: []byte("a3"), Headers: key("a")},
	} {
		require.NoError(t, sink.Publish(context.Background(), url, m))
	}
	src := openSource(t, c, url, 10*time.Second)
	// receive collects what arrives within d, one delivery per call, without settling it.
	receive := func(d time.Duration) []idem.Delivery {
		var out []idem.Delivery
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		for {
			ds, err := src.Receive(ctx, 1)
			if err != nil {
				return out
			}
			out = append(out, ds...)
		}
	}
	ids := func(ds []idem.Delivery) []string {
		var s []string
		for _, d := range ds {
			s = append(s, d.Message().EventID)
		}
		return s
	}
	held := receive(2 * time.Second)
	require.ElementsMatch(t, []string{"a-1", "b-1"}, ids(held), "one message of each key while they are held")
	for _, want := range []string{"a-2", "a-3"} {
		for _, d := range held {
			require.NoError(t, d.Ack(context.Background()))
		}
		held = receive(2 * time.Second)
		require.Equal(t, []string{want}, ids(held))
	}
	require.NoError(t, held[0].Ack(context.Background()))
}
