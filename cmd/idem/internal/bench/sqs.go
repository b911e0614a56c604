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
	bu, err := connect.ParseBroker(e.opts.SQSURL)
	if err != nil {
		return Result{}, fmt.Errorf("pipeline_sqs: %w", err)
	}
	if bu.Kind != connect.BrokerSQS {
		return Result{}, fmt.Errorf("pipeline_sqs: broker %s is not sqs://", bu)
	}
	client, err := connect.NewSQSClient(bu)
	if err != nil {
		return Result{}, fmt.Errorf("pipeline_sqs: %w", err)
	}
	out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName:  aws.String("idembench-" + randHex(4)),
		Attributes: map[string]string{"MessageRetentionPeriod": strconv.Itoa(int(sqsRetention / time.Second))},
	})
	if err != nil {
		return Result{}, fmt.Errorf("pipeline_sqs: create queue on %s: %w", bu, err)
	}
	url := aws.ToString(out.QueueUrl)
	defer func() {
		_, _ = client.DeleteQueue(context.WithoutCancel(ctx), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	}()
	src, err := idemsqs.NewSource(ctx, client, idemsqs.SourceConfig{QueueURL: url, Wait: time.Second})
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = src.Close() }()
	sink, err := idemsqs.NewSink(client, idemsqs.SinkConfig{})
	if err != nil {
		return Result{}, err
	}
	return e.pipeline(ctx, "pipeline_sqs", workers, batch, src, func(ctx context.Context, msgs []idem.Message) error {
		return sink.Publish(ctx, url, msgs...)
	})
}
