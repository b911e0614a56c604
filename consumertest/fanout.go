package consumertest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storetest"
)

// ExerciseFanOut checks two consumers of one topic, each on a source of its own name (a
// queue-table subscription, a consumer group, a durable): a ledger consumer that credits wallet
// w1 and an e-mail consumer that credits w2, each event published twice. Each consumer applies
// every event once, and a second process of the ledger consumer, on a source of the same name,
// competes with the first without applying anything twice. The harness must declare
// transporttest.Features.FanOut and open its sources so that they receive what is published
// after they were opened. It is separate from Exercise so that only such transports run it.
func ExerciseFanOut[TTx any](t *testing.T, setup Setup[TTx], opts ...Option) {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	t.Run("FanOutEachConsumerAppliesOnce", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, setup, o)
		if !e.h.Features.FanOut {
			t.Skip("transport does not declare Features.FanOut")
		}
		testFanOut(e)
	})
}

func testFanOut[TTx any](e *env[TTx]) {
	require.NoError(e.t, e.b.CreateWallet(e.ctx, "w2"))
	email := func(ctx context.Context, tx TTx, msg idem.Message) error {
		var p storetest.Payment
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return idem.Permanent(err)
		}
		n, err := e.b.Credit(ctx, tx, msg.EventID, "w2", p.Amount)
		if err != nil {
			return err
		}
		return idem.ExpectRows(n, 1)
	}
	// Every source is open before the first publish: each receives what comes after it.
	ledgerSrc, ledgerSrc2, emailSrc := e.source("ledger"), e.source("ledger"), e.source("email")
	var stops []func() error
	for _, c := range []struct {
		name string
		h    idem.Handler[TTx]
		src  idem.Source
	}{
		{"ledger@v1", storetest.CreditHandler(e.b), ledgerSrc},
		{"ledger@v1", storetest.CreditHandler(e.b), ledgerSrc2},
		{"email@v1", email, emailSrc},
	} {
		consumer, err := idem.NewConsumer(e.b.Store, e.config(c.name, c.h))
		require.NoError(e.t, err)
		stops = append(stops, e.run(consumer, c.src))
	}

	const n = 20
	for i := range n {
		m := storetest.PaymentMessage("acme", fmt.Sprintf("evt-%d", i), storetest.Payment{Wallet: "w1", Amount: 1})
		e.publish(m, m) // the same event twice: a republish
	}
	balance := func(w string) int64 {
		bal, err := e.b.Balance(e.ctx, w)
		require.NoError(e.t, err)
		return bal
	}
	e.eventually(30*time.Second, "every event applied by both consumers", func() bool {
		return balance("w1") >= n && balance("w2") >= n
	})
	// Longer than a lease: a copy not yet settled, or settled wrongly, would show now.
	time.Sleep(e.lease + 500*time.Millisecond)
	for _, stop := range stops {
		require.NoError(e.t, stop())
	}
	require.EqualValues(e.t, n, balance("w1"), "the ledger consumer applied each event once")
	require.EqualValues(e.t, n, balance("w2"), "the e-mail consumer applied each event once")
	for i := range n {
		id := fmt.Sprintf("evt-%d", i)
		require.EqualValues(e.t, 2, e.ledger(id), "event %s: one ledger row per consumer", id)
		for _, c := range []string{"ledger@v1", "email@v1"} {
			claims, err := e.b.ClaimRows(e.ctx, idem.Key{Tenant: "acme", Consumer: c, EventID: id})
			require.NoError(e.t, err)
			require.EqualValues(e.t, 1, claims, "event %s, consumer %s", id, c)
		}
		require.Empty(e.t, e.deadLetters(id))
	}
	require.Equal(e.t, 2*n, e.rec.Count(idem.OutcomeProcessed, ""), "each event processed once per consumer")
}
