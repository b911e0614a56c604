package demo

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSQLiteKafkaChaos runs the chaos demo over the in-process Kafka cluster it starts
// (kafka://embedded): every misbehaviour, no event applied twice or lost.
func TestSQLiteKafkaChaos(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.db")
	v, err := Run(context.Background(), chaos("sqlite://"+path, "kafka://embedded"))
	require.NoError(t, err)
	requireChaosOK(t, v)
	require.Equal(t, "kafka://embedded", v.Broker)
	require.Positive(t, v.DuplicatesIgnored, "the copies reached the consumer and were ignored there")
}
