package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// ExerciseBatch runs the batched path (Consumer.ProcessBatch) and the set-based path
// (Consumer.ProcessSet) against stores built by factory, which must implement idemstore.BatchStore:
// every semantic of the single-event path must hold when many events share one transaction.
func ExerciseBatch[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Helper()
	for _, savepoints := range []bool{false, true} {
		name := "Optimistic"
		if savepoints {
			name = "Savepoints"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			exerciseBatch(t, factory, savepoints)
		})
	}
}

func exerciseBatch[TTx any](t *testing.T, factory Factory[TTx], savepoints bool) {
	ctx := context.Background()
	run := func(name string, fn func(s *suite[TTx])) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(&suite[TTx]{t: t, b: factory(t), ctx: ctx, at: time.Now().UTC()})
		})
	}
	batched := func(cfg *idem.ConsumerConfig[TTx]) {
		cfg.Batch = idem.BatchConfig{Enabled: true, Savepoints: savepoints}
	}
	batchIgnoreCheck(run, batched)

	run("MixedBatchTakesEachPath", func(s *suite[TTx]) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			batched(cfg)
			inner := cfg.Handler
			cfg.Handler = func(ctx context.Context, tx TTx, msg idem.Message) error {
				switch msg.EventID {
				case "fail":
					if err := inner(ctx, tx, msg); err != nil { // written, then rolled back alone
						return err
					}
					return errors.New("downstream timeout")
				case "panic":
					panic("bug")
				}
				return inner(ctx, tx, msg)
			}
		})
		err := c.Process(s.ctx, s.payment("acme", "old", Payment{Wallet: "w1", Amount: 1})).Err
		require.NoError(s.t, err)
		msgs := []idem.Message{
			s.payment("acme", "a", Payment{Wallet: "w1", Amount: 10}),
			s.payment("acme", "old", Payment{Wallet: "w1", Amount: 1}),    // duplicate
			s.payment("acme", "old", Payment{Wallet: "w1", Amount: 99}),   // same key twice in a batch, and key reuse
			s.payment("acme", "fail", Payment{Wallet: "w1", Amount: 100}), // rolls back alone
			s.payment("acme", "panic", Payment{Wallet: "w1", Amount: 100}),
			s.payment("acme", "nowallet", Payment{Wallet: "missing", Amount: 100}), // precondition
			{EventID: "", Tenant: "acme", Payload: []byte(`{}`)},                   // invalid
			s.payment("acme", "b", Payment{Wallet: "w1", Amount: 20}),
		}
		rs := c.ProcessBatch(s.ctx, msgs)
		require.Len(s.t, rs, len(msgs))
		want := []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeDuplicate, idem.OutcomeKeyReuse, idem.OutcomeFailed,
			idem.OutcomeFailed, idem.OutcomeFailed, idem.OutcomeFailed, idem.OutcomeProcessed}
		for i, r := range rs {
			require.Equal(s.t, want[i], r.Outcome, "message %d (%s): %v", i, msgs[i].EventID, r.Err)
		}
		require.Equal(s.t, idem.ClassTransient, rs[3].Class)
		require.Equal(s.t, idem.ReasonHandlerPanic, rs[4].Reason)
		require.ErrorIs(s.t, rs[5].Err, idem.ErrNoRows)
		require.Equal(s.t, idem.ReasonInvalidPayload, rs[6].Reason)
		for id, n := range map[string]int64{"a": 1, "old": 1, "fail": 0, "panic": 0, "nowallet": 0, "b": 1} {
			require.EqualValues(s.t, n, s.ledger(id), "ledger rows of %s", id)
			require.EqualValues(s.t, n, s.claims(idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: id}), "claims of %s", id)
		}
		require.EqualValues(s.t, 31, s.balance("w1"))

		// The failed one applies once when redelivered.
		c2 := s.consumer("ledger@v1", batched)
		rs = c2.ProcessBatch(s.ctx, []idem.Message{s.payment("acme", "fail", Payment{Wallet: "w1", Amount: 100}), s.payment("acme", "a", Payment{Wallet: "w1", Amount: 10})})
		require.Equal(s.t, idem.OutcomeProcessed, rs[0].Outcome)
		require.Equal(s.t, idem.OutcomeDuplicate, rs[1].Outcome)
		require.EqualValues(s.t, 131, s.balance("w1"))
	})

	run("OneUnclaimableEventDoesNotSinkItsBatch", func(s *suite[TTx]) {
		// The database refuses the claim of one event (an id it cannot store, a partition it
		// lacks): that event fails with the database's error, the others of its batch apply.
		if s.b.RejectClaims == nil {
			s.t.Skip("the bundle has no RejectClaims")
		}
		s.wallet("w1")
		c := s.consumer("ledger@v1", batched)
		err := c.Process(s.ctx, s.payment("acme", "old", Payment{Wallet: "w1", Amount: 1})).Err
		require.NoError(s.t, err)
		require.NoError(s.t, s.b.RejectClaims(s.ctx, "bad"))
		msgs := []idem.Message{
			s.payment("acme", "a", Payment{Wallet: "w1", Amount: 10}),
			s.payment("acme", "bad", Payment{Wallet: "w1", Amount: 100}),
			s.payment("acme", "old", Payment{Wallet: "w1", Amount: 1}),  // duplicate
			s.payment("acme", "old", Payment{Wallet: "w1", Amount: 99}), // same key twice in a batch, and key reuse
			s.payment("acme", "b", Payment{Wallet: "w1", Amount: 20}),
		}
		rs := c.ProcessBatch(s.ctx, msgs)
		require.Len(s.t, rs, len(msgs))
		want := []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeFailed, idem.OutcomeDuplicate, idem.OutcomeKeyReuse, idem.OutcomeProcessed}
		for i, r := range rs {
			require.Equal(s.t, want[i], r.Outcome, "message %d (%s): %v", i, msgs[i].EventID, r.Err)
		}
		require.ErrorContains(s.t, rs[1].Err, `(event "bad")`) // the consumer names the event once, at the end
		require.NotContains(s.t, rs[1].Err.Error(), "batch of 5", "the error is the event's own claim's, not the batch's")
		for id, n := range map[string]int64{"a": 1, "bad": 0, "old": 1, "b": 1} {
			require.EqualValues(s.t, n, s.ledger(id), "ledger rows of %s", id)
			require.EqualValues(s.t, n, s.claims(idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: id}), "claims of %s", id)
		}
		require.EqualValues(s.t, 31, s.balance("w1"))

		// A redelivery of the batch: the others are duplicates, the bad one fails again alone.
		rs = c.ProcessBatch(s.ctx, []idem.Message{msgs[0], msgs[1], msgs[4]})
		require.Equal(s.t, []idem.Outcome{idem.OutcomeDuplicate, idem.OutcomeFailed, idem.OutcomeDuplicate},
			[]idem.Outcome{rs[0].Outcome, rs[1].Outcome, rs[2].Outcome})
		require.EqualValues(s.t, 31, s.balance("w1"))
	})

	setChecks(run, batched)

	for _, swallow := range []bool{false, true} {
		name := "TransactionEndedByAHandlerAbortsTheBatch"
		if swallow {
			name += "/HandlerIgnoresTheError"
		}
		run(name, func(s *suite[TTx]) { transactionEnded(s, batched, swallow) })
	}

	run("ConcurrentOverlappingBatchesApplyOnce", func(s *suite[TTx]) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", batched)
		const events, workers = 60, 4
		var wg sync.WaitGroup
		var mu sync.Mutex
		processed := 0
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Each worker delivers every event, in its own order, in batches of 15.
				msgs := make([]idem.Message, 0, events)
				for i := range events {
					j := (i*7 + w*13) % events
					msgs = append(msgs, s.payment("acme", fmt.Sprintf("evt-%d", j), Payment{Wallet: "w1", Amount: 1}))
				}
				for start := 0; start < events; start += 15 {
					batch := msgs[start : start+15]
					for k, r := range c.ProcessBatch(s.ctx, batch) {
						for try := 0; r.Outcome == idem.OutcomeFailed && r.Class == idem.ClassTransient && try < 5; try++ {
							// A deadlock between overlapping batches: retried, as Run would.
							r = c.ProcessBatch(s.ctx, []idem.Message{batch[k]})[0]
						}
						mu.Lock()
						if r.Outcome == idem.OutcomeProcessed {
							processed++
						}
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		bal := s.balance("w1")
		require.EqualValues(s.t, events, bal, "every event applied")
		for i := range events {
			require.LessOrEqual(s.t, s.ledger(fmt.Sprintf("evt-%d", i)), int64(1), "evt-%d applied at most once", i)
		}
		require.EqualValues(s.t, processed, bal, "every processed outcome is exactly one effect")
	})
}

// transactionEnded is the check TransactionEndedByAHandlerAbortsTheBatch: a handler's
// statement ends the whole transaction (and, with swallow, the handler ignores the statement's
// error). Nothing of the transaction may commit, no later handler may run outside it (its
// effect would commit without its claim), and every event of the batch is applied once in the
// end.
func transactionEnded[TTx any](s *suite[TTx], batched func(*idem.ConsumerConfig[TTx]), swallow bool) {
	if s.b.KillTx == nil {
		s.t.Skip("the bundle has no KillTx")
	}
	s.wallet("w1")
	var kill atomic.Bool
	kill.Store(true)
	c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
		batched(cfg)
		inner := cfg.Handler
		cfg.Handler = func(ctx context.Context, tx TTx, msg idem.Message) error {
			if err := inner(ctx, tx, msg); err != nil {
				return err
			}
			if msg.EventID == "kill" && kill.Load() {
				err := s.b.KillTx(ctx, tx) // nil on a store where the statement succeeds
				if swallow {
					return nil // a handler bug idem must survive: nothing may commit outside the transaction
				}
				return err
			}
			return nil
		}
	})
	err := c.Process(s.ctx, s.payment("acme", "old", Payment{Wallet: "w1", Amount: 1})).Err
	require.NoError(s.t, err)
	amounts := map[string]int64{"a": 10, "kill": 100, "b": 20, "c": 40}
	msgs := []idem.Message{
		s.payment("acme", "a", Payment{Wallet: "w1", Amount: amounts["a"]}),
		s.payment("acme", "old", Payment{Wallet: "w1", Amount: 1}), // duplicate
		s.payment("acme", "kill", Payment{Wallet: "w1", Amount: amounts["kill"]}),
		s.payment("acme", "b", Payment{Wallet: "w1", Amount: amounts["b"]}),
		s.payment("acme", "c", Payment{Wallet: "w1", Amount: amounts["c"]}),
	}
	rs := c.ProcessBatch(s.ctx, msgs)
	require.Len(s.t, rs, len(msgs))
	require.Equal(s.t, idem.OutcomeFailed, rs[2].Outcome, "the killer: %v", rs[2].Err)
	var balance int64 = 1
	for i, m := range msgs {
		k := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: m.EventID}
		n, claims := s.ledger(m.EventID), s.claims(k)
		require.Equal(s.t, claims, n, "%s: an effect exists exactly when its claim does", m.EventID)
		require.LessOrEqual(s.t, n, int64(1), m.EventID)
		if m.EventID == "old" {
			continue
		}
		require.Equal(s.t, rs[i].Outcome == idem.OutcomeProcessed, n == 1, "%s: %s, %d effects (%v)", m.EventID, rs[i].Outcome, n, rs[i].Err)
		balance += n * amounts[m.EventID]
	}
	require.EqualValues(s.t, 0, s.ledger("kill"))
	require.Equal(s.t, balance, s.balance("w1"))

	// Redelivered (the handler no longer ends its transaction): each applies once.
	kill.Store(false)
	for _, r := range c.ProcessBatch(s.ctx, msgs) {
		require.Contains(s.t, []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeDuplicate, idem.OutcomeKeyReuse}, r.Outcome, "%v", r.Err)
	}
	for id := range amounts {
		require.EqualValues(s.t, 1, s.ledger(id), id)
	}
	require.EqualValues(s.t, 171, s.balance("w1"))
}
