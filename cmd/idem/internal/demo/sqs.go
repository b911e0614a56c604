package demo

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemsqs"
)

// sqsRetention is how long the run's queue keeps messages: within idem's default
// RedeliveryWindow, which Run checks, and far longer than a run.
const sqsRetention = time.Hour

// sqsBroker creates the standard queue "idem-demo-payments-<run id>" on the SQS endpoint of bu
// and receives from it. SQS does not deduplicate a standard queue, so the demo's copies and
// key-reuse messages are sent as they are and the consumer's claims drop them. Closing it deletes
// the queue.
func sqsBroker(ctx context.Context, bu connect.BrokerURL, runID string) (*broker, error) {
	client, err := connect.NewSQSClient(bu)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	name := "idem-demo-payments-" + runID
	out, err := client.CreateQueue(sctx, &sqs.CreateQueueInput{
		QueueName:  aws.String(name),
		Attributes: map[string]string{"MessageRetentionPeriod": strconv.Itoa(int(sqsRetention / time.Second))},
	})
	if err != nil {
		return nil, fmt.Errorf("create queue %s: %w", name, err)
	}
	url := aws.ToString(out.QueueUrl)
	deleteQueue := func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = client.DeleteQueue(cctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	}
	src, err := idemsqs.NewSource(sctx, client, idemsqs.SourceConfig{QueueURL: url, Lease: lease, Wait: time.Second})
	if err != nil {
		deleteQueue()
		return nil, err
	}
	sink, err := idemsqs.NewSink(client, idemsqs.SinkConfig{})
	if err != nil {
		_ = src.Close()
		deleteQueue()
		return nil, err
	}
	return &broker{
		topic:  name,
		source: src,
		sink:   sink,
		again: func(ctx context.Context, topic string, msgs []idem.Message) (int, int, error) {
			if err := sink.Publish(ctx, topic, msgs...); err != nil {
				return 0, 0, err
			}
			return len(msgs), 0, nil
		},
		backlog: func(ctx context.Context) (int, error) {
			out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
				QueueUrl: aws.String(url),
				AttributeNames: []types.QueueAttributeName{
					types.QueueAttributeNameApproximateNumberOfMessages,
					types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
					types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
				},
			})
			if err != nil {
				return 0, err
			}
			n := 0
			for _, v := range out.Attributes {
				c, err := strconv.Atoi(v)
				if err != nil {
					return 0, fmt.Errorf("queue %s: attribute %q is not a count", name, v)
				}
				n += c
			}
			return n, nil
		},
		close: func() {
			_ = src.Close()
			_ = sink.Close()
			deleteQueue()
		},
	}, nil
}
