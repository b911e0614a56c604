package e2e_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/consumertest"
	"github.com/idemkit/idem/idemdlq"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/storetest"
)

// subscriptionStore is a store whose queue table has subscriptions.
type subscriptionStore[TTx any] interface {
	idemstore.Store[TTx]
	idemstore.QueueTxStore[TTx]
	idemstore.QueueSubscriptionStore
}

// checkSubscriptionReplay: of two subscriptions of one topic, the e-mail one dead-letters an
// event the ledger one applied. Replaying the dead letter (no topic named: its source) reaches
// the e-mail subscription alone: the e-mail consumer applies it, and the ledger consumer never
// sees the event again.
func checkSubscriptionReplay[TTx any](t *testing.T, store subscriptionStore[TTx], b storetest.Bundle[TTx]) {
	ctx := context.Background()
	require.NoError(t, b.CreateWallet(ctx, "w1"))
	require.NoError(t, b.CreateWallet(ctx, "w2"))
	topic := testdb.Name("q_")
	var failing atomic.Bool
	failing.Store(true)
	email := func(ctx context.Context, tx TTx, msg idem.Message) error {
		if failing.Load() {
			return idem.Permanent(errors.New("mail server refused the template"))
		}
		var p storetest.Payment
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return idem.Permanent(err)
		}
		n, err := b.Credit(ctx, tx, msg.EventID, "w2", p.Amount)
		if err != nil {
			return err
		}
		return idem.ExpectRows(n, 1)
	}
	recs := map[string]*consumertest.Recorder{}
	for _, c := range []struct {
		name, sub string
		h         idem.Handler[TTx]
	}{{"ledger@v1", "ledger", storetest.CreditHandler(b)}, {"email@v1", "email", email}} {
		src, err := idemqueue.NewSource(store, idemqueue.SourceConfig{Queue: topic, Subscription: c.sub, Lease: time.Second, MaxWait: 100 * time.Millisecond})
		require.NoError(t, err)
		require.NoError(t, src.Subscribe(ctx))
		require.Equal(t, "queue:"+topic+"#"+c.sub, src.Name())
		recs[c.name] = &consumertest.Recorder{}
		consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[TTx]{
			Name: c.name, Handler: c.h,
			ShutdownTimeout: 5 * time.Second,
			Failure: idem.FailureConfig{
				Retry: retry.Policy{MaxAttempts: 3, MaxElapsed: time.Minute, Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond},
			},
			Claims: idem.ClaimConfig{
				Retention:        48 * time.Hour,
				RedeliveryWindow: 24 * time.Hour,
			},
			Observe: idem.ObserveConfig{
				Observer: recs[c.name],
			},
		})
		require.NoError(t, err)
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- consumer.Run(runCtx, src) }()
		t.Cleanup(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}

	require.NoError(t, idemqueue.NewSink(store).Publish(ctx, topic, storetest.PaymentMessage("acme", "evt-r", storetest.Payment{Wallet: "w1", Amount: 7})))
	var dls []idem.DeadLetter
	require.Eventually(t, func() bool {
		var err error
		if dls, err = store.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Consumer: "email@v1"}); err != nil {
			return false
		}
		bal, err := b.Balance(ctx, "w1")
		return err == nil && len(dls) == 1 && bal == 7
	}, 20*time.Second, 20*time.Millisecond, "the ledger applies the event, the e-mail consumer dead-letters it")
	require.Equal(t, "queue:"+topic+"#email", dls[0].Source)

	failing.Store(false)
	res, err := idemdlq.NewReplayer(store, idemqueue.NewSink(store), idemdlq.ReplayerConfig{}).Replay(ctx, idemdlq.ReplayParams{
		Selection: idemdlq.Selection{IDs: []int64{dls[0].ID}, Actor: "test"},
	})
	require.NoError(t, err)
	require.Equal(t, []int64{dls[0].ID}, res.Replayed)
	require.Eventually(t, func() bool {
		bal, err := b.Balance(ctx, "w2")
		return err == nil && bal == 7
	}, 20*time.Second, 20*time.Millisecond, "the e-mail consumer applies the replay")
	time.Sleep(1500 * time.Millisecond) // longer than a lease: a copy for the ledger would show
	require.Len(t, recs["ledger@v1"].Events("evt-r"), 1, "the ledger consumer saw the event once: the replay was not sent to its subscription")
	bal, err := b.Balance(ctx, "w1")
	require.NoError(t, err)
	require.EqualValues(t, 7, bal)
	n, err := b.LedgerRows(ctx, "evt-r")
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "one ledger row per consumer")
}

func TestQueueSubscriptionReplay(t *testing.T) {
	t.Parallel()
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		store, b := testdb.SQLite(t)
		checkSubscriptionReplay[*sql.Tx](t, store, b)
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		store, b := testdb.Postgres(t)
		checkSubscriptionReplay[pgx.Tx](t, store, b)
	})
}
