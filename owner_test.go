package idem_test

import (
	"context"
	"strings"
	"testing"

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
