package idemsqs_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqs"
)

// Publish an event with the Sink and receive it with the Source. It needs an SQS endpoint, so it
// compiles but does not run as a test; in production the client comes from
// sqs.NewFromConfig(cfg) with cfg from config.LoadDefaultConfig, and a consumer runs the source
// with consumer.Run(ctx, src).
func Example() {
	ctx := context.Background()
	client := sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String("http://127.0.0.1:5000"), // e.g. moto_server -p 5000
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		}),
	})
	// Keep messages no longer than the consumer's RedeliveryWindow (24 hours by default).
	q, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName:  aws.String("orders"),
		Attributes: map[string]string{"MessageRetentionPeriod": "86400"},
	})
	if err != nil {
		log.Fatal(err)
	}

	sink, _ := idemsqs.NewSink(client, idemsqs.SinkConfig{})
	defer sink.Close()
	err = sink.Publish(ctx, "orders", idem.Message{EventID: "evt-1", Type: "order.created", Payload: []byte(`{}`)})
	fmt.Println("published:", err)

	src, err := idemsqs.NewSource(ctx, client, idemsqs.SourceConfig{QueueURL: aws.ToString(q.QueueUrl), Lease: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	ds, _ := src.Receive(ctx, 10)
	m := ds[0].Message()
	fmt.Println("event", m.EventID, m.Type, m.Attempt)
	fmt.Println("acked:", ds[0].Ack(ctx))
}
