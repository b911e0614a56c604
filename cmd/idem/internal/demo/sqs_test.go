package demo

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/internal/testenv"
)

// TestSQLiteSQSChaos runs the chaos demo over SQS (IDEM_SQS_URL, or a moto_server the test
// starts): every misbehaviour, no event applied twice or lost, and the run's queue deleted
// afterwards.
func TestSQLiteSQSChaos(t *testing.T) {
	broker := "sqs://" + strings.TrimPrefix(testenv.SQS(t), "http://")
	path := filepath.Join(t.TempDir(), "demo.db")
	o := chaos("sqlite://"+path, broker)
	// moto_server answers every SQS call from one Python process: on a loaded 2-core machine a
	// run went at 10 events/s, so the drain gets minutes rather than the in-process brokers' 40 s.
	o.Timeout = 3 * time.Minute
	v, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireChaosOK(t, v)
	require.Positive(t, v.DuplicatesIgnored, "the copies reached the consumer and were ignored there")

	bu, err := connect.ParseBroker(broker)
	require.NoError(t, err)
	client, err := connect.NewSQSClient(bu)
	require.NoError(t, err)
	out, err := client.ListQueues(context.Background(), &sqs.ListQueuesInput{QueueNamePrefix: aws.String("idem-demo-payments-" + v.RunID)})
	require.NoError(t, err)
	require.Empty(t, out.QueueUrls, "the run's queue is deleted")
}
