package connect

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseBrokerSQS(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	for _, tc := range []struct {
		raw, endpoint, region, keyID, err string
	}{
		{raw: "sqs://127.0.0.1:5000", endpoint: "http://127.0.0.1:5000", region: "us-east-1", keyID: "test"},
		{raw: "SQS://127.0.0.1:5000/", endpoint: "http://127.0.0.1:5000", region: "us-east-1", keyID: "test"},
		{raw: "sqs://sqs.eu-west-1.amazonaws.com:443?region=eu-west-1&tls=1", endpoint: "https://sqs.eu-west-1.amazonaws.com:443", region: "eu-west-1", keyID: "test"},
		{raw: "sqs://AKIA1:s3cret@127.0.0.1:5000?region=eu-central-1", endpoint: "http://127.0.0.1:5000", region: "eu-central-1", keyID: "AKIA1"},
		{raw: "sqs://", err: "has no host"},
		{raw: "sqs://AKIA1:s3cret@127.0.0.1:5000/orders", err: "has a path"},
		{raw: "sqs://AKIA1:s3cret@127.0.0.1:5000?tls=maybe", err: `tls="maybe"`},
		{raw: "sqs://AKIA1:s3cret@127.0.0.1:5000?queue=x", err: `unknown parameter "queue"`},
		{raw: "sqs://AKIA1:s3cret@127.0.0.1:5000?region=", err: "region is empty"},
		{raw: "sqs://AKIA1@127.0.0.1:5000", err: "KEY_ID:SECRET"},
	} {
		bu, err := ParseBroker(tc.raw)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.raw)
			require.NotContains(t, err.Error(), "s3cret", "the secret is masked")
			continue
		}
		require.NoError(t, err, tc.raw)
		require.Equal(t, BrokerSQS, bu.Kind)
		require.NotContains(t, bu.String(), "s3cret", "the secret is masked")
		e, err := ParseSQS(bu.URL)
		require.NoError(t, err)
		require.Equal(t, tc.endpoint, e.Endpoint, tc.raw)
		require.Equal(t, tc.region, e.Region, tc.raw)
		require.Equal(t, tc.keyID, e.Credentials.AccessKeyID, tc.raw)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAENV")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
	e, err := ParseSQS("sqs://127.0.0.1:5000")
	require.NoError(t, err)
	require.Equal(t, "AKIAENV", e.Credentials.AccessKeyID, "credentials from the environment")
}

// TestOpenBrokerSQSUnreachable: an endpoint nobody listens on fails OpenBroker, naming the
// broker once and masking its secret.
func TestOpenBrokerSQSUnreachable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := OpenBroker(ctx, "sqs://AKIA1:s3cret@127.0.0.1:1", nil, BrokerOptions{})
	require.ErrorContains(t, err, "is unreachable")
	require.NotContains(t, err.Error(), "s3cret")
	require.Equal(t, 1, strings.Count(err.Error(), "sqs://"), "the broker is named once: %v", err)
}
