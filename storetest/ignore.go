package storetest

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// ignoreReason is the reason the ignore checks' handler gives.
const ignoreReason = "order_deleted"

// ignoring wraps the consumer's handler: it applies the effect, then returns idem.Ignore for an
// event whose id starts with "gone", so that the check sees the effect rolled back. calls counts
// the handler's runs.
func ignoring[TTx any](calls *atomic.Int64) func(cfg *idem.ConsumerConfig[TTx]) {
	return func(cfg *idem.ConsumerConfig[TTx]) {
		inner := cfg.Handler
		cfg.Handler = func(ctx context.Context, tx TTx, msg idem.Message) error {
			calls.Add(1)
			if err := inner(ctx, tx, msg); err != nil {
				return err
			}
			if strings.HasPrefix(msg.EventID, "gone") {
				return idem.Ignore(ignoreReason)
			}
			return nil
		}
	}
}

// requireIgnoreAudited checks that the store wrote one audit row for the ignored eventID.
func (s *suite[TTx]) requireIgnoreAudited(consumer, eventID string) {
	s.t.Helper()
	if _, ok := s.b.Store.(idemstore.IgnoreStore[TTx]); !ok {
		return
	}
	rows, err := s.b.Store.ListAudit(s.ctx, 1000)
	require.NoError(s.t, err)
	var found []idemstore.AuditEntry
	for _, a := range rows {
		if a.EventID == eventID && a.Action == idem.AuditActionIgnore {
			found = append(found, a)
		}
	}
	require.Len(s.t, found, 1, "one ignore audit row for %s", eventID)
	require.Equal(s.t, consumer, found[0].Actor)
	require.Equal(s.t, ignoreReason, found[0].Reason)
	require.Zero(s.t, found[0].DeadLetterID)
	require.False(s.t, found[0].At.IsZero())
}

// ignoreChecks: a handler's idem.Ignore keeps the claim and an audit row, and nothing of its
// effect, in Process and ProcessTx.
func ignoreChecks[TTx any](run func(name string, fn func(s *suite[TTx]))) {
	run("IgnoreKeepsClaimWithoutEffect", func(s *suite[TTx]) {
		s.wallet("w1")
		var calls atomic.Int64
		c := s.consumer("ledger@v1", ignoring[TTx](&calls))
		msg := s.payment("acme", "gone-1", Payment{Wallet: "w1", Amount: 5})
		r := c.Process(s.ctx, msg)
		err := r.Err
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeIgnored, r.Outcome)
		require.Equal(s.t, idem.Reason(ignoreReason), r.Reason)
		require.EqualValues(s.t, 1, s.claims(r.Key), "the claim is kept")
		require.EqualValues(s.t, 0, s.ledger("gone-1"), "the effect rolled back")
		require.EqualValues(s.t, 0, s.balance("w1"))
		s.requireIgnoreAudited("ledger@v1", "gone-1")

		msg.Attempt = 2
		r = c.Process(s.ctx, msg)
		err = r.Err
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeDuplicate, r.Outcome, "a redelivery is a duplicate")
		require.EqualValues(s.t, 1, calls.Load(), "the handler ran once")
		s.requireIgnoreAudited("ledger@v1", "gone-1")

		r = c.Process(s.ctx, s.payment("acme", "ok-1", Payment{Wallet: "w1", Amount: 7}))
		err = r.Err
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeProcessed, r.Outcome)
		require.EqualValues(s.t, 7, s.balance("w1"))
	})

	run("IgnoreInCallersTransaction", func(s *suite[TTx]) {
		if _, ok := s.b.Store.(idemstore.BatchStore[TTx]); !ok {
			s.t.Skip("storetest: ProcessTx rolls back an ignored handler's effect alone only in a savepoint; the store has none (idemstore.BatchStore)")
		}
		s.wallet("w1")
		var calls atomic.Int64
		c := s.consumer("ledger@v1", ignoring[TTx](&calls))
		var r idem.Result
		err := s.b.Store.InTx(s.ctx, func(ctx context.Context, tx TTx) error {
			var err error
			r = c.ProcessTx(ctx, tx, s.payment("acme", "gone-tx", Payment{Wallet: "w1", Amount: 5}))
			err = r.Err
			return err
		})
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeIgnored, r.Outcome)
		require.EqualValues(s.t, 1, s.claims(r.Key), "the claim committed with the caller's transaction")
		require.EqualValues(s.t, 0, s.ledger("gone-tx"), "the handler's effect did not")
		require.EqualValues(s.t, 0, s.balance("w1"))
		s.requireIgnoreAudited("ledger@v1", "gone-tx")
	})
}

// batchIgnoreCheck: in a batch, an ignored event keeps its claim and audit row without effect,
// and its neighbours are applied.
func batchIgnoreCheck[TTx any](run func(name string, fn func(s *suite[TTx])), batched func(*idem.ConsumerConfig[TTx])) {
	run("IgnoreInBatch", func(s *suite[TTx]) {
		s.wallet("w1")
		var calls atomic.Int64
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			batched(cfg)
			ignoring[TTx](&calls)(cfg)
		})
		msgs := []idem.Message{
			s.payment("acme", "ok-1", Payment{Wallet: "w1", Amount: 1}),
			s.payment("acme", "gone-1", Payment{Wallet: "w1", Amount: 10}),
			s.payment("acme", "ok-2", Payment{Wallet: "w1", Amount: 100}),
		}
		rs := c.ProcessBatch(s.ctx, msgs)
		require.Len(s.t, rs, 3)
		for i, want := range []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeIgnored, idem.OutcomeProcessed} {
			require.Equal(s.t, want, rs[i].Outcome, "event %s", msgs[i].EventID)
			require.NoError(s.t, rs[i].Err)
		}
		require.Equal(s.t, idem.Reason(ignoreReason), rs[1].Reason)
		require.EqualValues(s.t, 1, s.claims(rs[1].Key))
		require.EqualValues(s.t, 0, s.ledger("gone-1"))
		require.EqualValues(s.t, 101, s.balance("w1"))
		s.requireIgnoreAudited("ledger@v1", "gone-1")

		before := calls.Load()
		for i, r := range c.ProcessBatch(s.ctx, msgs) {
			require.Equal(s.t, idem.OutcomeDuplicate, r.Outcome, "event %s again", msgs[i].EventID)
		}
		require.Equal(s.t, before, calls.Load(), "no handler ran again")
		s.requireIgnoreAudited("ledger@v1", "gone-1")
	})
}
