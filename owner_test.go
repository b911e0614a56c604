package idem_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestValidateOwner(t *testing.T) {
	t.Parallel()
	tests := []struct {
		owner string
		ok    bool
	}{
		{"", true},
		{"payments", true},
		{"ledger-oncall", true},
		{"team_7", true},
		{strings.Repeat("a", idem.MaxOwnerBytes), true},
		{strings.Repeat("a", idem.MaxOwnerBytes+1), false},
		{"Payments", false},
		{"7team", false},
		{"-team", false},
		{"pay ments", false},
		{"team\n", false},
		{"tenant=acme", false},
		{"équipe", false},
	}
	for _, tt := range tests {
		t.Run(tt.owner, func(t *testing.T) {
			t.Parallel()
			err := idem.ValidateOwner(tt.owner)
			if tt.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, "Owner")
		})
	}
}

func TestNewConsumerRefusesBadOwner(t *testing.T) {
	t.Parallel()
	_, err := idem.NewConsumer[*memTx](newMemStore(), idem.ConsumerConfig[*memTx]{
		Name:    "ledger@v1",
		Owner:   "Payments Team",
		Handler: func(context.Context, *memTx, idem.Message) error { return nil },
	})
	require.ErrorContains(t, err, `Owner "Payments Team"`)
}

func TestHandlerTimeout(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	c, err := idem.NewConsumer[*memTx](store, idem.ConsumerConfig[*memTx]{
		Name: "ledger@v1",
		Handler: func(ctx context.Context, _ *memTx, msg idem.Message) error {
			if msg.EventID == "slow" {
				<-ctx.Done() // a handler stuck on a lock until its context ends
				return ctx.Err()
			}
			return nil
		},
		Failure: idem.FailureConfig{
			HandlerTimeout: 20 * time.Millisecond,
		},
	})
	require.NoError(t, err)
	start := time.Now()
	r := c.Process(context.Background(), idem.Message{EventID: "slow", Payload: []byte(`{}`)})
	err = r.Err
	require.ErrorIs(t, err, idem.ErrHandlerTimeout)
	require.ErrorContains(t, err, "HandlerTimeout 20ms")
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, idem.OutcomeFailed, r.Outcome)
	require.Equal(t, idem.ClassTransient, r.Class)
	require.Zero(t, store.claimCount(), "the claim rolled back")

	r = c.Process(context.Background(), idem.Message{EventID: "fast", Payload: []byte(`{}`)})
	err = r.Err
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeProcessed, r.Outcome)

	_, err = idem.NewConsumer[*memTx](store, idem.ConsumerConfig[*memTx]{Name: "ledger@v1",
		Failure: idem.FailureConfig{
			HandlerTimeout: -time.Second,
		},
		Handler: func(context.Context, *memTx, idem.Message) error { return nil }})
	require.ErrorContains(t, err, "Failure.HandlerTimeout is -1s")
}
