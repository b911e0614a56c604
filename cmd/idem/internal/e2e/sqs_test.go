package e2e_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/consumertest"
	"github.com/idemkit/idem/idemsqs"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/storetest"
	"github.com/idemkit/idem/transporttest"
)

// sqsHarness runs over the SQS test server (IDEM_SQS_URL, or a moto_server the tests start): a
// standard queue per check, kept 10 minutes so the Source's RedeliveryWindow stays within the
// consumer's. Every source of a queue competes for its messages, as a durable consumer's do.
func sqsHarness(tb testing.TB) transporttest.Harness {
	tb.Helper()
	client := sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(testenv.SQS(tb)),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		}),
	})
	var mu sync.Mutex
	urls := map[string]string{}
	return transporttest.Harness{
		Features: transporttest.Features{Takeover: true, DelayedNak: true, Persistent: true},
		NewTopic: func(tb testing.TB) string {
			topic := testdb.Name("sqs_")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(topic), Attributes: map[string]string{"MessageRetentionPeriod": "600"}})
			if err != nil {
				tb.Fatalf("create queue %s: %v", topic, err)
			}
			url := aws.ToString(out.QueueUrl)
			tb.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, _ = client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
			})
			mu.Lock()
			urls[topic] = url
			mu.Unlock()
			return topic
		},
		Source: func(tb testing.TB, topic, _ string, lease time.Duration) idem.Source {
			mu.Lock()
			url := urls[topic]
			mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			src, err := idemsqs.NewSource(ctx, client, idemsqs.SourceConfig{QueueURL: url, Lease: lease, Wait: 2 * time.Second})
			if err != nil {
				tb.Fatalf("source on %s: %v", topic, err)
			}
			tb.Cleanup(func() { _ = src.Close() })
			return src
		},
		Sink: func(tb testing.TB) idem.Sink {
			sink, err := idemsqs.NewSink(client, idemsqs.SinkConfig{})
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { _ = sink.Close() })
			return sink
		},
	}
}

func TestRuntimeSQLiteSQS(t *testing.T) {
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		_, b := testdb.SQLite(tb)
		return b, sqsHarness(tb)
	})
}

func TestRuntimeBatchedSQLiteSQS(t *testing.T) {
	wholeMatrix(t, "TestRuntimeSQLiteSQS and TestRuntimeBatchedMySQLNATS")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		_, b := testdb.SQLite(tb)
		return b, sqsHarness(tb)
	}, consumertest.Batched(10))
}
