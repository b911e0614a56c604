package e2e_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemdlq"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/storetest"
)

// TestNATSDeadLetterReplaysToItsSubject: the dead letter of a NATS delivery records the subject
// the message arrived on, so a replay through NATS needs no topic (idem dlq replay --broker
// nats:// without --topic), reaches the consumer there, and the audit says where it went.
func TestNATSDeadLetterReplaysToItsSubject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, h := sqliteBundle(t), natsHarness(t)
	topic := h.NewTopic(t)
	require.NoError(t, b.CreateWallet(ctx, "w1"))
	var broken atomic.Bool
	broken.Store(true)
	credit := storetest.CreditHandler(b)
	c, err := idem.NewConsumer(b.Store, idem.ConsumerConfig[*sql.Tx]{
		Name: "ledger@v1", Owner: "payments",
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			if broken.Load() {
				return idem.Permanent(errors.New("bug in the handler"))
			}
			return credit(ctx, tx, msg)
		},
		ShutdownTimeout: 5 * time.Second,
		Failure: idem.FailureConfig{
			Retry: retry.Policy{MaxAttempts: 3, MaxElapsed: time.Minute, Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond},
		},
		Claims: idem.ClaimConfig{
			Retention:        48 * time.Hour,
			RedeliveryWindow: 24 * time.Hour,
		},
		Observe: idem.ObserveConfig{
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		},
	})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx, h.Source(t, topic, "ledger", 2*time.Second)) }()
	t.Cleanup(func() { cancel(); <-done })

	sink := h.Sink(t)
	require.NoError(t, sink.Publish(ctx, topic, storetest.PaymentMessage("acme", "evt-r", storetest.Payment{Wallet: "w1", Amount: 7})))
	var dl idem.DeadLetter
	require.Eventually(t, func() bool {
		dls, err := b.Store.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Consumer: "ledger@v1"})
		if err != nil || len(dls) == 0 {
			return false
		}
		dl = dls[0]
		return true
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, topic, dl.Topic, "the subject it arrived on")
	require.Equal(t, "payments", dl.Owner)

	broken.Store(false) // the fix is deployed
	res, err := idemdlq.NewReplayer(b.Store, sink, idemdlq.ReplayerConfig{}).Replay(ctx, idemdlq.ReplayParams{ArrivalTopic: true,
		Selection: idemdlq.Selection{IDs: []int64{dl.ID}, Actor: "ops", Limit: 1}})
	require.NoError(t, err)
	require.Equal(t, []int64{dl.ID}, res.Replayed)
	require.Eventually(t, func() bool {
		n, err := b.LedgerRows(ctx, "evt-r")
		return err == nil && n == 1
	}, 20*time.Second, 20*time.Millisecond, "the replay reached the consumer on its subject")
	audit, err := b.Store.ListAudit(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, "replay", audit[0].Action)
	require.Equal(t, topic, audit[0].Destination)
}
