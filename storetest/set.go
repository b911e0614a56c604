package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// setHandler is the suite's set handler: it credits every event of the set in turn (the
// suite's effect has no multi-row form; what is checked is which events reach it, and how),
// records each set it is given, and fails or panics at the events the check names.
type setHandler[TTx any] struct {
	b       Bundle[TTx]
	fail    string // this event's effect fails permanently
	panicky string // this event's effect panics
	ignore  string // this event's target is gone: the set handler returns idem.Ignore
	mu      sync.Mutex
	sets    [][]string
}

func (h *setHandler[TTx]) handle(ctx context.Context, tx TTx, msgs []idem.Message) error {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.EventID
	}
	h.mu.Lock()
	h.sets = append(h.sets, ids)
	h.mu.Unlock()
	for _, m := range msgs {
		switch m.EventID {
		case h.fail:
			return idem.Permanent(errors.New("wallet frozen"))
		case h.panicky:
			panic("bug")
		case h.ignore:
			return idem.Ignore(ignoreReason)
		}
		var p Payment
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return idem.Permanent(err)
		}
		n, err := h.b.Credit(ctx, tx, m.EventID, p.Wallet, p.Amount)
		if err != nil {
			return err
		}
		if err := idem.ExpectRows(n, 1); err != nil {
			return err
		}
	}
	return nil
}

// multi returns the sets the handler saw with more than one event (the single-event calls
// are the per-event fallback).
func (h *setHandler[TTx]) multi() [][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out [][]string
	for _, s := range h.sets {
		if len(s) > 1 {
			out = append(out, s)
		}
	}
	return out
}

// setChecks is the Set check of ExerciseBatch: Consumer.ProcessSet hands the set handler
// exactly the batch's new events in one call, decides duplicates and key reuse per event, and
// when the set fails falls back to the events one by one, so that a poison event fails alone
// with the reason it would have alone.
func setChecks[TTx any](run func(name string, fn func(s *suite[TTx])), batched func(*idem.ConsumerConfig[TTx])) {
	consumer := func(s *suite[TTx], h *setHandler[TTx]) *idem.Consumer[TTx] {
		return s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			batched(cfg)
			cfg.Handler = nil // derived from the set handler: a set of one
			cfg.SetHandler = h.handle
		})
	}

	run("Set/OnlyNewEventsReachTheSet", func(s *suite[TTx]) {
		s.wallet("w1")
		h := &setHandler[TTx]{b: s.b}
		c := consumer(s, h)
		err := c.Process(s.ctx, s.payment("acme", "old", Payment{Wallet: "w1", Amount: 1})).Err
		require.NoError(s.t, err)
		msgs := []idem.Message{
			s.payment("acme", "a", Payment{Wallet: "w1", Amount: 10}),
			s.payment("acme", "old", Payment{Wallet: "w1", Amount: 1}),  // duplicate
			s.payment("acme", "old", Payment{Wallet: "w1", Amount: 99}), // same key twice in a batch, and key reuse
			{EventID: "", Tenant: "acme", Payload: []byte(`{}`)},        // invalid
			s.payment("acme", "b", Payment{Wallet: "w1", Amount: 20}),
		}
		rs := c.ProcessSet(s.ctx, msgs)
		require.Len(s.t, rs, len(msgs))
		want := []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeDuplicate, idem.OutcomeKeyReuse, idem.OutcomeFailed, idem.OutcomeProcessed}
		for i, r := range rs {
			require.Equal(s.t, want[i], r.Outcome, "message %d (%s): %v", i, msgs[i].EventID, r.Err)
		}
		require.Equal(s.t, [][]string{{"a", "b"}}, h.multi(), "one set, of the new events only")
		for id, n := range map[string]int64{"a": 1, "old": 1, "b": 1} {
			require.EqualValues(s.t, n, s.ledger(id), "ledger rows of %s", id)
			require.EqualValues(s.t, n, s.claims(idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: id}), "claims of %s", id)
		}
		require.EqualValues(s.t, 31, s.balance("w1"))

		// The whole set again: all duplicates, the set handler is not called.
		rs = c.ProcessSet(s.ctx, []idem.Message{msgs[0], msgs[4]})
		require.Equal(s.t, []idem.Outcome{idem.OutcomeDuplicate, idem.OutcomeDuplicate}, []idem.Outcome{rs[0].Outcome, rs[1].Outcome})
		require.Len(s.t, h.multi(), 1)
		require.EqualValues(s.t, 31, s.balance("w1"))
	})

	for _, poison := range []string{"fail", "panic"} {
		run("Set/OnePoisonEventFailsAlone/"+poison, func(s *suite[TTx]) {
			s.wallet("w1")
			h := &setHandler[TTx]{b: s.b}
			if poison == "fail" {
				h.fail = "poison"
			} else {
				h.panicky = "poison"
			}
			c := consumer(s, h)
			msgs := []idem.Message{
				s.payment("acme", "a", Payment{Wallet: "w1", Amount: 10}),
				s.payment("acme", "poison", Payment{Wallet: "w1", Amount: 100}),
				s.payment("acme", "nowallet", Payment{Wallet: "missing", Amount: 100}), // precondition
				s.payment("acme", "b", Payment{Wallet: "w1", Amount: 20}),
			}
			rs := c.ProcessSet(s.ctx, msgs)
			want := []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeFailed, idem.OutcomeFailed, idem.OutcomeProcessed}
			for i, r := range rs {
				require.Equal(s.t, want[i], r.Outcome, "message %d (%s): %v", i, msgs[i].EventID, r.Err)
			}
			require.Equal(s.t, idem.ClassPermanent, rs[1].Class)
			wantReason := idem.ReasonPermanentError
			if poison == "panic" {
				wantReason = idem.ReasonHandlerPanic
			}
			require.Equal(s.t, wantReason, rs[1].Reason, "the reason it has alone, so Run dead-letters it as in per-event mode")
			require.ErrorIs(s.t, rs[2].Err, idem.ErrNoRows)
			require.True(s.t, slices.Equal([]string{"a", "poison", "nowallet", "b"}, h.multi()[0]), "the set was tried first: %v", h.multi())
			for id, n := range map[string]int64{"a": 1, "poison": 0, "nowallet": 0, "b": 1} {
				require.EqualValues(s.t, n, s.ledger(id), "ledger rows of %s", id)
				require.EqualValues(s.t, n, s.claims(idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: id}), "claims of %s", id)
			}
			require.EqualValues(s.t, 30, s.balance("w1"))

			// Redelivered once the bug is fixed: the poison applies once, the rest are duplicates.
			h.fail, h.panicky = "", ""
			rs = c.ProcessSet(s.ctx, msgs[:2])
			require.Equal(s.t, []idem.Outcome{idem.OutcomeDuplicate, idem.OutcomeProcessed}, []idem.Outcome{rs[0].Outcome, rs[1].Outcome})
			require.EqualValues(s.t, 130, s.balance("w1"))
		})
	}

	run("Set/IgnoredEventKeepsItsClaimAlone", func(s *suite[TTx]) {
		s.wallet("w1")
		h := &setHandler[TTx]{b: s.b, ignore: "gone"}
		c := consumer(s, h)
		msgs := []idem.Message{
			s.payment("acme", "a", Payment{Wallet: "w1", Amount: 10}),
			s.payment("acme", "gone", Payment{Wallet: "w1", Amount: 100}),
			s.payment("acme", "b", Payment{Wallet: "w1", Amount: 20}),
		}
		rs := c.ProcessSet(s.ctx, msgs)
		want := []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeIgnored, idem.OutcomeProcessed}
		for i, r := range rs {
			require.Equal(s.t, want[i], r.Outcome, "message %d (%s): %v", i, msgs[i].EventID, r.Err)
			require.NoError(s.t, r.Err)
		}
		require.Equal(s.t, idem.Reason(ignoreReason), rs[1].Reason)
		for id, n := range map[string]int64{"a": 1, "gone": 0, "b": 1} {
			require.EqualValues(s.t, n, s.ledger(id), "ledger rows of %s", id)
		}
		require.EqualValues(s.t, 1, s.claims(idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "gone"}), "the ignored event's claim is kept")
		require.EqualValues(s.t, 30, s.balance("w1"))
		s.requireIgnoreAudited("ledger@v1", "gone")

		// A set of one ignored event, and the redelivery of the first.
		h.ignore = "gone-2"
		rs = c.ProcessSet(s.ctx, []idem.Message{s.payment("acme", "gone-2", Payment{Wallet: "w1", Amount: 5}), msgs[1]})
		require.Equal(s.t, []idem.Outcome{idem.OutcomeIgnored, idem.OutcomeDuplicate}, []idem.Outcome{rs[0].Outcome, rs[1].Outcome}, "%v %v", rs[0].Err, rs[1].Err)
		require.EqualValues(s.t, 0, s.ledger("gone-2"))
		s.requireIgnoreAudited("ledger@v1", "gone-2")
		require.EqualValues(s.t, 30, s.balance("w1"))
	})
}
