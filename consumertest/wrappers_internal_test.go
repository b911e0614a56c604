package consumertest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retry"
)

// partitionedStore is a batch store with a partitioned inbox that can tell an ended
// transaction (tx 1); only those methods are called here.
type partitionedStore struct{ idemstore.BatchStore[int] }

func (partitionedStore) ClaimBucket() time.Duration    { return time.Hour }
func (partitionedStore) ClaimRetention() time.Duration { return 48 * time.Hour }
func (partitionedStore) TxEnded(tx int) bool           { return tx == 1 }

// limitedSource is a source whose broker drops a message after two deliveries and can
// redeliver for a week; only those methods are called here.
type limitedSource struct{ idem.Source }

func (limitedSource) DeliveryLimit() int                                    { return 2 }
func (limitedSource) RedeliveryWindow() time.Duration                       { return 7 * 24 * time.Hour }
func (limitedSource) Name() string                                          { return "limited" }
func (limitedSource) Lease() time.Duration                                  { return time.Second }
func (limitedSource) Close() error                                          { return nil }
func (limitedSource) Receive(context.Context, int) ([]idem.Delivery, error) { return nil, nil }

// TestWrappersKeepOptionalInterfaces: a suite wrapper must not hide what the consumer asks the
// store or source for, or the consumer takes another path over the wrapper than over the bare
// store (claims outside their partition, a batch that carries on after its transaction ended,
// a broker limit that goes unchecked).
func TestWrappersKeepOptionalInterfaces(t *testing.T) {
	t.Parallel()
	cut := CutDeadLetters[int](partitionedStore{})
	b, ok := cut.(idemstore.BucketedStore)
	require.True(t, ok)
	require.Equal(t, time.Hour, b.ClaimBucket())
	require.Equal(t, 48*time.Hour, b.ClaimRetention())
	c, ok := cut.(idemstore.TxEndChecker[int])
	require.True(t, ok)
	require.True(t, c.TxEnded(1))
	require.False(t, c.TxEnded(2))
	// The consumer sees the partitions through the wrapper: it refuses a Retention longer than
	// theirs, as over the bare store.
	_, err := idem.NewConsumer(cut, idem.ConsumerConfig[int]{Name: "ledger@v1", Handler: func(context.Context, int, idem.Message) error { return nil }})
	require.ErrorContains(t, err, "partition retention")

	// A store that is neither answers as one: not partitioned, cannot tell.
	plain := CutDeadLetters[int](struct{ idemstore.BatchStore[int] }{})
	require.Zero(t, plain.(idemstore.BucketedStore).ClaimBucket())
	require.False(t, plain.(idemstore.TxEndChecker[int]).TxEnded(1))

	// The source's limits reach CheckSourceLimits through SettleWatch.
	policy := retry.Policy{MaxAttempts: 5}
	require.Error(t, idem.CheckSourceLimits(&SettleWatch[int]{Source: limitedSource{}}, policy, 24*time.Hour))
	require.NoError(t, idem.CheckSourceLimits(&SettleWatch[int]{Source: struct{ idem.Source }{}}, policy, 24*time.Hour))
}
