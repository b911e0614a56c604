package demo

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSQLitePubSubChaos runs the chaos demo over the in-process Pub/Sub server it starts
// (pubsub://embedded): every misbehaviour, no event applied twice or lost.
func TestSQLitePubSubChaos(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.db")
	v, err := Run(context.Background(), chaos("sqlite://"+path, "pubsub://embedded"))
	require.NoError(t, err)
	requireChaosOK(t, v)
	require.Equal(t, "pubsub://embedded", v.Broker)
	require.Positive(t, v.DuplicatesIgnored, "the copies reached the consumer and were ignored there")
}
