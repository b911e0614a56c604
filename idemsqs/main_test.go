package idemsqs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testenv"
)

// TestMain stops the moto_server the tests started and checks that nothing leaked.
func TestMain(m *testing.M) { testenv.Main(m) }

// newClient returns an SQS client for the test server (IDEM_SQS_URL, or a moto_server the tests
// start), with the static credentials and region moto accepts.
func newClient(tb testing.TB) *sqs.Client {
	tb.Helper()
	return clientFor(testenv.SQS(tb))
}

// clientFor is an SQS client for endpoint with static test credentials.
func clientFor(endpoint string) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "idemsqs tests"}, nil
		}),
	})
}

// newQueue creates a queue with a random name (".fifo" added when attrs make it FIFO) and
// deletes it when tb ends. Retention is 10 minutes, within idem's default RedeliveryWindow.
func newQueue(tb testing.TB, c *sqs.Client, attrs map[string]string) string {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "idem-" + hex.EncodeToString(b[:])
	all := map[string]string{"MessageRetentionPeriod": "600"}
	for k, v := range attrs {
		all[k] = v
	}
	if all["FifoQueue"] == "true" {
		name += ".fifo"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: all})
	require.NoError(tb, err)
	url := aws.ToString(out.QueueUrl)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	})
	return url
}
