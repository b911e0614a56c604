package connect

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseBrokerRedis(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw, want, err string
	}{
		{raw: "redis://127.0.0.1:6379/0"},
		{raw: "redis://app:s3cret@127.0.0.1:6379/2"},
		{raw: "rediss://app:s3cret@redis.internal:6380/0"},
		{raw: "REDIS://app:s3cret@host:6379/0", want: "redis://app:s3cret@host:6379/0"},
		{raw: "redis://app:s3cret@host:6379/notadb", err: "invalid database number"},
		{raw: "redis://app:s3cret@host:6379/1/2", err: "invalid URL path"},
	} {
		bu, err := ParseBroker(tc.raw)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.raw)
			require.NotContains(t, err.Error(), "s3cret", "the password is masked")
			continue
		}
		require.NoError(t, err, tc.raw)
		require.Equal(t, BrokerRedis, bu.Kind)
		want := tc.want
		if want == "" {
			want = strings.TrimSpace(tc.raw)
		}
		require.Equal(t, want, bu.URL)
		require.NotContains(t, bu.String(), "s3cret", "the password is masked")
	}
}

// TestOpenBrokerRedisUnreachable: a Redis nobody listens on fails OpenBroker at once, naming
// the broker once and masking its password.
func TestOpenBrokerRedisUnreachable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := OpenBroker(ctx, "redis://app:s3cret@127.0.0.1:1/0", nil, BrokerOptions{})
	require.ErrorContains(t, err, "is unreachable")
	require.NotContains(t, err.Error(), "s3cret")
	require.Equal(t, 1, strings.Count(err.Error(), "redis://"), "the broker is named once: %v", err)
}
