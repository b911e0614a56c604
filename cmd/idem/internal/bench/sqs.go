package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemsqs"
)

// sqsRetention bounds how long the case's queue keeps messages, within the consumer's default
// RedeliveryWindow (Run refuses a longer one); the queue is deleted after the case anyway.
const sqsRetention = time.Hour

// pipelineSQS runs the pipeline over a fresh standard SQS queue, deleted afterwards.
func (e *env) pipelineSQS(ctx context.Context, workers, batch int) (Result, error) {
	return e.brokerPipeline(ctx, "pipeline_sqs", workers, batch, e.openSQS)
}

// openSQS creates the standard queue topic on the SQS broker of Options.SQSURL.
func (e *env) openSQS(ctx context.Context, topic string) (brokerCase, error) {
	bu, err := connect.ParseBroker(e.opts.SQSURL)
	if err != nil {
		return brokerCase{}, err
	}
	if bu.Kind != connect.BrokerSQS {
		return brokerCase{}, fmt.Errorf("broker %s is not sqs://", bu)
	}
	client, err := connect.NewSQSClient(bu)
	if err != nil {
		return brokerCase{}, err
	}
	out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName:  aws.String(topic),
		Attributes: map[string]string{"MessageRetentionPeriod": strconv.Itoa(int(sqsRetention / time.Second))},
	})
	if err != nil {
		return brokerCase{}, fmt.Errorf("create queue on %s: %w", bu, err)
	}
	url := aws.ToString(out.QueueUrl)
	drop := func() {
		_, _ = client.DeleteQueue(context.WithoutCancel(ctx), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	}
	src, err := idemsqs.NewSource(ctx, client, idemsqs.SourceConfig{QueueURL: url, Wait: time.Second})
	if err != nil {
		drop()
		return brokerCase{}, err
	}
	sink, err := idemsqs.NewSink(client, idemsqs.SinkConfig{})
	if err != nil {
		_ = src.Close()
		drop()
		return brokerCase{}, err
	}
	return brokerCase{
		src: src,
		publish: func(ctx context.Context, msgs []idem.Message) error {
			return sink.Publish(ctx, url, msgs...)
		},
		close: func() { _ = src.Close(); drop() },
	}, nil
}
