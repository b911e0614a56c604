package connect

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseBrokerAMQP(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw, err string
	}{
		{raw: "amqp://guest:s3cret@127.0.0.1:5672/"},
		{raw: "amqps://app:s3cret@rabbit.internal:5671/prod"},
		{raw: "AMQP://guest:s3cret@host/"},
		{raw: "amqp://", err: "has no host"},
		{raw: "amqp://u:s3cret@/vhost", err: "has no host"},
		{raw: "amqp://u:s3cret@host/%zz", err: "invalid URL escape"},
	} {
		bu, err := ParseBroker(tc.raw)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.raw)
			require.NotContains(t, err.Error(), "s3cret", "the password is masked")
			continue
		}
		require.NoError(t, err, tc.raw)
		require.Equal(t, BrokerAMQP, bu.Kind)
		require.Equal(t, strings.TrimSpace(tc.raw), bu.URL)
		require.NotContains(t, bu.String(), "s3cret", "the password is masked")
	}
}
