package idemsqs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqs"
	"github.com/idemkit/idem/retry"
)

// openSource opens a Source on url with a short long poll.
func openSource(tb testing.TB, c *sqs.Client, url string, lease time.Duration) *idemsqs.Source {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, err := idemsqs.NewSource(ctx, c, idemsqs.SourceConfig{QueueURL: url, Lease: lease, Wait: time.Second})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = src.Close() })
	return src
}

// receiveOne receives one delivery within d.
func receiveOne(tb testing.TB, src *idemsqs.Source, d time.Duration) idem.Delivery {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ds, err := src.Receive(ctx, 1)
	require.NoError(tb, err)
	require.Len(tb, ds, 1)
	return ds[0]
}

// TestSourceLimits: the queue's redrive policy is the source's delivery limit, which Run checks
// against the retry policy (so SQS never moves to its dead-letter queue a message idem would
// still retry), and its retention is the redelivery window.
func TestSourceLimits(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	dlq := newQueue(t, c, nil)
	attrs, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(dlq), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	require.NoError(t, err)
	arn := attrs.Attributes[string(types.QueueAttributeNameQueueArn)]
	redrive := func(n string) map[string]string {
		return map[string]string{"RedrivePolicy": `{"deadLetterTargetArn":"` + arn + `","maxReceiveCount":` + n + `}`}
	}
	policy := retry.Policy{MaxAttempts: 8}
	cases := []struct {
		name   string
		attrs  map[string]string
		limit  int
		window time.Duration
		want   string // CheckSourceLimits's complaint, "" for none
	}{
		{name: "no redrive", attrs: nil, window: 10 * time.Minute},
		{name: "redrive above the policy", attrs: redrive("13"), limit: 13, window: 10 * time.Minute},
		{name: "redrive as a string", attrs: redrive(`"20"`), limit: 20, window: 10 * time.Minute},
		{name: "redrive within the policy", attrs: redrive("5"), limit: 5, window: 10 * time.Minute, want: "delivery limit is 5, want unlimited or at least 13"},
		{name: "retention past the window", attrs: map[string]string{"MessageRetentionPeriod": "345600"}, window: 96 * time.Hour, want: "RedeliveryWindow"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := openSource(t, c, newQueue(t, c, tc.attrs), 5*time.Second)
			require.Equal(t, tc.limit, src.DeliveryLimit())
			require.Equal(t, tc.window, src.RedeliveryWindow())
			err := idem.CheckSourceLimits(src, policy, 24*time.Hour)
			if tc.want == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tc.want)
			}
		})
	}
}

// TestSourceConfig: settings SQS cannot honour are refused before any call.
func TestSourceConfig(t *testing.T) {
	t.Parallel()
	c := clientFor("http://127.0.0.1:1") // never called
	cases := []struct {
		cfg  idemsqs.SourceConfig
		want string
	}{
		{idemsqs.SourceConfig{}, "QueueURL is empty"},
		{idemsqs.SourceConfig{QueueURL: "q", Lease: 13 * time.Hour}, "Lease is 13h0m0s"},
		{idemsqs.SourceConfig{QueueURL: "q", Lease: -time.Second}, "Lease is -1s"},
		{idemsqs.SourceConfig{QueueURL: "q", Wait: 21 * time.Second}, "Wait is 21s"},
	}
	for _, tc := range cases {
		_, err := idemsqs.NewSource(context.Background(), c, tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := idemsqs.NewSource(context.Background(), nil, idemsqs.SourceConfig{QueueURL: "q"})
	require.ErrorContains(t, err, "client is nil")
	require.Equal(t, 2*time.Second, idemsqs.SourceConfig{Lease: 1500 * time.Millisecond}.WithDefaults().Lease, "SQS counts whole seconds")
}

// TestForeignMessage: a message sent without idem's attributes (a producer that does not know
// idem) is delivered with no event id and the reason, for the consumer to dead-letter, instead
// of failing the Receive.
func TestForeignMessage(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	url := newQueue(t, c, nil)
	_, err := c.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(`{"order":1}`)})
	require.NoError(t, err)
	d := receiveOne(t, openSource(t, c, url, 5*time.Second), 5*time.Second)
	m := d.Message()
	require.Empty(t, m.EventID)
	require.Contains(t, m.Headers[idemsqs.AttrDecodeError], "no Idem-Event-Id attribute")
	require.Equal(t, `{"order":1}`, string(m.Payload))
	require.NotEmpty(t, d.(*idemsqs.Delivery).MessageID())
	require.NoError(t, d.Term(context.Background()))
}

// TestSettleAfterDelete: once the message is deleted (acked by this or another worker), a
// visibility change on it fails with idem.ErrLeaseLost, so a handler still extending its lease
// learns that the message is gone.
func TestSettleAfterDelete(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	url := newQueue(t, c, nil)
	sink, err := idemsqs.NewSink(c, idemsqs.SinkConfig{})
	require.NoError(t, err)
	require.NoError(t, sink.Publish(context.Background(), url, idem.Message{EventID: "e-gone", Payload: []byte("p")}))
	d := receiveOne(t, openSource(t, c, url, 5*time.Second), 5*time.Second)
	require.NoError(t, d.Ack(context.Background()))
	for name, fn := range map[string]func(context.Context) error{
		"Extend":     d.Extend,
		"Nak(delay)": func(ctx context.Context) error { return d.Nak(ctx, 5*time.Second) },
	} {
		err := fn(context.Background())
		require.True(t, errors.Is(err, idem.ErrLeaseLost), "%s after Ack = %v, want idem.ErrLeaseLost", name, err)
	}
}

// TestLostLeaseIsFenced: once a delivery's visibility timeout passed, the message may have gone
// to another worker, and SQS may accept the stale receipt handle. So Extend and Nak refuse
// (idem.ErrLeaseLost, naming the passed deadline) without asking SQS: here the message, still
// invisible in SQS, does not come back after the refused Nak(0). Ack still deletes: the claim
// committed, and deleting a message another worker holds only spares it a duplicate.
func TestLostLeaseIsFenced(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	url := newQueue(t, c, nil)
	sink, err := idemsqs.NewSink(c, idemsqs.SinkConfig{})
	require.NoError(t, err)
	require.NoError(t, sink.Publish(context.Background(), url, idem.Message{EventID: "e-fenced", Payload: []byte("p")}))
	src := openSource(t, c, url, 30*time.Second)
	d := receiveOne(t, src, 5*time.Second).(*idemsqs.Delivery)

	idemsqs.SetLeaseUntil(d, time.Now().Add(-time.Second))
	for _, tc := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"Extend", d.Extend},
		{"Nak(0)", func(ctx context.Context) error { return d.Nak(ctx, 0) }},
		{"Nak(delay)", func(ctx context.Context) error { return d.Nak(ctx, 5*time.Second) }},
	} {
		err := tc.fn(context.Background())
		require.True(t, errors.Is(err, idem.ErrLeaseLost), "%s after the lease passed = %v, want idem.ErrLeaseLost", tc.name, err)
		require.ErrorContains(t, err, "visibility timeout passed", tc.name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	ds, err := src.Receive(ctx, 1)
	require.Empty(t, ds, "the refused Nak(0) left the message invisible (err %v)", err)
	require.NoError(t, d.Ack(context.Background()))
	err = d.Extend(context.Background())
	require.True(t, errors.Is(err, idem.ErrLeaseLost), "Extend after Ack = %v", err)
	require.ErrorContains(t, err, "already settled")
}

// TestTwelveHours: SQS keeps a message invisible at most 12 hours after its receive. Near that
// bound a long Nak is cut to what is left (the message comes back early), and an Extend past it
// fails with idem.ErrLeaseLost without asking SQS.
func TestTwelveHours(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	url := newQueue(t, c, nil)
	sink, err := idemsqs.NewSink(c, idemsqs.SinkConfig{})
	require.NoError(t, err)
	require.NoError(t, sink.Publish(context.Background(), url, idem.Message{EventID: "e-12h", Payload: []byte("p")}))
	src := openSource(t, c, url, 30*time.Second)
	d := receiveOne(t, src, 5*time.Second).(*idemsqs.Delivery)

	idemsqs.SetReceived(d, time.Now().Add(-idemsqs.LeaseMax+2*time.Second))
	naked := time.Now()
	require.NoError(t, d.Nak(context.Background(), time.Hour))
	again := receiveOne(t, src, 10*time.Second)
	require.Less(t, time.Since(naked), 8*time.Second, "Nak(1h) 2s before the bound keeps the message away for about 2s")
	require.Equal(t, 2, again.Message().Attempt)

	idemsqs.SetReceived(again.(*idemsqs.Delivery), time.Now().Add(-idemsqs.LeaseMax))
	err = again.Extend(context.Background())
	require.True(t, errors.Is(err, idem.ErrLeaseLost), "Extend past 12 hours = %v, want idem.ErrLeaseLost", err)
	require.NoError(t, again.Ack(context.Background()))
}
