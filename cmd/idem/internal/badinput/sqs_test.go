package badinput_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemsqs"
	"github.com/idemkit/idem/internal/testenv"
)

// sqsMaxMessage is SQS's default MaximumMessageSize, below the catalogue's oversized payload:
// SQS refuses that one at publish.
const sqsMaxMessage = 256 << 10

// sqsQueue is a fresh standard queue on the SQS test server (IDEM_SQS_URL, or a moto_server the
// test starts), deleted when t ends. A standard queue does not deduplicate, so a reused event id
// is simply sent again.
func sqsQueue(t *testing.T) transport {
	t.Helper()
	c := sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(testenv.SQS(t)),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		}),
	})
	var b [8]byte
	_, _ = rand.Read(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Messages are kept 10 minutes, within the consumer's RedeliveryWindow.
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName:  aws.String("idembad-" + hex.EncodeToString(b[:])),
		Attributes: map[string]string{"MessageRetentionPeriod": "600"},
	})
	require.NoError(t, err)
	url := aws.ToString(out.QueueUrl)
	src, err := idemsqs.NewSource(ctx, c, idemsqs.SourceConfig{QueueURL: url, Lease: lease, Wait: time.Second})
	require.NoError(t, err)
	sink, err := idemsqs.NewSink(c, idemsqs.SinkConfig{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = src.Close()
		_ = sink.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}); err != nil {
			t.Errorf("delete queue %s: %v", url, err)
		}
	})
	tr := transport{
		source:  src,
		publish: sinkPublish(sink, url),
		publishWithoutID: func(t *testing.T, m idem.Message) {
			t.Helper()
			_, err := idemsqs.Encode(m)
			require.Error(t, err, "the sink refuses an empty event id")
			m.EventID = "placeholder"
			e, err := idemsqs.Encode(m)
			require.NoError(t, err)
			delete(e.Attributes, idemsqs.AttrEventID) // as a producer that does not know idem sends
			_, err = c.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(e.Body), MessageAttributes: e.Attributes})
			require.NoError(t, err)
		},
		maxPayload: sqsMaxMessage,
	}
	tr.publishAgain = func(t *testing.T, m idem.Message) { tr.publish(t, m) }
	return tr
}

// TestBadInputSQS runs the catalogue through SQS on SQLite.
func TestBadInputSQS(t *testing.T) {
	t.Parallel()
	tr := sqsQueue(t)
	_, b := testdb.SQLite(t)
	runCatalogue[*sql.Tx](t, b, tr)
}
