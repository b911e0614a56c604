package demo

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testenv"
)

// TestSQLiteRedisChaos runs the chaos demo over Redis Streams: every misbehaviour, no event
// applied twice or lost, and the run's keys deleted afterwards.
func TestSQLiteRedisChaos(t *testing.T) {
	redisURL := testenv.URL(t, testenv.RedisVar)
	path := filepath.Join(t.TempDir(), "demo.db")
	v, err := Run(context.Background(), chaos("sqlite://"+path, redisURL))
	require.NoError(t, err)
	requireChaosOK(t, v)
	require.Positive(t, v.DuplicatesIgnored, "the copies reached the consumer and were ignored there")

	opts, err := redis.ParseURL(redisURL)
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	keys, err := rdb.Keys(context.Background(), "idem:demo.payments."+v.RunID+"*").Result()
	require.NoError(t, err)
	require.Empty(t, keys, "the run's keys are deleted")
}
