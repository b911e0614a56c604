package idem

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"

	"github.com/idemkit/idem/idemstore"
	"github.com/stretchr/testify/require"
)

// memTx is a transaction of memStore: the claims and effects it made, and whether a statement
// of a handler ended it (after which, as on a real database in autocommit mode, its writes
// land directly in the store).
type memTx struct {
	s       *memStore
	claims  map[Key]Fingerprint
	effects map[string]int
	ended   bool
}

// write records one effect of eventID: in the transaction, or straight in the store once
// the transaction has ended.
func (tx *memTx) write(eventID string) {
	if tx.ended {
		tx.s.effects[eventID]++
		return
	}
	tx.effects[eventID]++
}

// memStore is a BatchStore in memory for the batch path's own logic (the suites in storetest
// check the real stores): ClaimBatchTx fails as a whole when one key is in reject, as a
// database refuses a multi-row INSERT with one bad row, and SavepointTx reports ErrTxEnded
// when its transaction was ended inside it.
type memStore struct {
	idemstore.DeadLetterStore // unused: nil
	claims                    map[Key]Fingerprint
	effects                   map[string]int
	reject                    map[string]bool
	batchClaims               int
}

func newMemStore() *memStore {
	return &memStore{claims: map[Key]Fingerprint{}, effects: map[string]int{}, reject: map[string]bool{}}
}

func (s *memStore) Dialect() string { return "memory" }

func (s *memStore) InTx(ctx context.Context, fn func(ctx context.Context, tx *memTx) error) error {
	tx := &memTx{s: s, claims: map[Key]Fingerprint{}, effects: map[string]int{}}
	if err := fn(ctx, tx); err != nil {
		return err
	}
	if tx.ended {
		return fmt.Errorf("commit: %w", ErrTxEnded)
	}
	maps.Copy(s.claims, tx.claims)
	for id, n := range tx.effects {
		s.effects[id] += n
	}
	return nil
}

func (s *memStore) ClaimTx(_ context.Context, tx *memTx, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	if s.reject[p.Key.EventID] {
		return idemstore.ClaimResult{}, fmt.Errorf("row refused: event %s", p.Key.EventID)
	}
	fp, ok := tx.claims[p.Key]
	if !ok {
		fp, ok = s.claims[p.Key]
	}
	switch {
	case !ok:
		tx.claims[p.Key] = p.Fingerprint
		return idemstore.ClaimResult{Status: idemstore.ClaimNew}, nil
	case fp == p.Fingerprint:
		return idemstore.ClaimResult{Status: idemstore.ClaimDuplicate, Existing: fp}, nil
	}
	return idemstore.ClaimResult{Status: idemstore.ClaimConflict, Existing: fp}, nil
}

func (s *memStore) ClaimBatchTx(ctx context.Context, tx *memTx, ps []idemstore.ClaimParams) ([]idemstore.ClaimResult, error) {
	s.batchClaims++
	for _, p := range ps {
		if s.reject[p.Key.EventID] {
			return nil, fmt.Errorf("row refused: event %s", p.Key.EventID)
		}
	}
	rs := make([]idemstore.ClaimResult, len(ps))
	for i, p := range ps {
		rs[i], _ = s.ClaimTx(ctx, tx, p)
	}
	return rs, nil
}

func (s *memStore) SavepointTx(ctx context.Context, tx *memTx, fn func(ctx context.Context, tx *memTx) error) error {
	claims, effects := maps.Clone(tx.claims), maps.Clone(tx.effects)
	err := fn(ctx, tx)
	if tx.ended {
		return fmt.Errorf("rollback to savepoint after %v: %w", err, ErrTxEnded)
	}
	if err != nil {
		tx.claims, tx.effects = claims, effects
	}
	return err
}

func (s *memStore) ReleaseClaimTx(_ context.Context, tx *memTx, key Key) error {
	delete(tx.claims, key)
	return nil
}

func (s *memStore) DeleteExpiredClaims(context.Context, idemstore.DeleteExpiredClaimsParams) (int, error) {
	return 0, nil
}

func (s *memStore) ClassifyError(error) Class { return ClassUnknown }

// memChecker is memStore with a TxEndChecker, as idempg has one.
type memChecker struct{ *memStore }

func (s memChecker) TxEnded(tx *memTx) bool { return tx.ended }

func TestBatchPath(t *testing.T) {
	t.Parallel()
	msg := func(id string) Message {
		return Message{EventID: id, Tenant: "acme", Type: "t", Payload: []byte(`{"id":"` + id + `"}`)}
	}
	for _, tc := range []struct {
		name       string
		savepoints bool
		checker    bool
		reject     string
		kill       string // the handler of this event ends its transaction
		killErr    bool   // and returns the statement's error (else nil)
		cancelled  bool
		want       map[string]Outcome
		// batchClaims is how many multi-row claims ran.
		batchClaims int
	}{
		{name: "UnclaimableEventFailsAlone/Optimistic", reject: "bad",
			want: map[string]Outcome{"a": OutcomeProcessed, "bad": OutcomeFailed, "b": OutcomeProcessed}, batchClaims: 4},
		{name: "UnclaimableEventFailsAlone/Savepoints", savepoints: true, reject: "bad",
			want: map[string]Outcome{"a": OutcomeProcessed, "bad": OutcomeFailed, "b": OutcomeProcessed}, batchClaims: 4},
		{name: "NoFallbackOnceTheContextEnded", reject: "bad", cancelled: true,
			want: map[string]Outcome{"a": OutcomeFailed, "bad": OutcomeFailed, "b": OutcomeFailed}, batchClaims: 1},
		{name: "EndedTransaction/Savepoints", savepoints: true, kill: "bad", killErr: true,
			want: map[string]Outcome{"a": OutcomeProcessed, "bad": OutcomeFailed, "b": OutcomeProcessed}, batchClaims: 2},
		{name: "EndedTransactionSilently/Savepoints", savepoints: true, kill: "bad",
			want: map[string]Outcome{"a": OutcomeProcessed, "bad": OutcomeFailed, "b": OutcomeProcessed}, batchClaims: 2},
		{name: "EndedTransaction/Optimistic", kill: "bad", killErr: true,
			want: map[string]Outcome{"a": OutcomeProcessed, "bad": OutcomeFailed, "b": OutcomeProcessed}, batchClaims: 2},
		{name: "EndedTransactionSilently/OptimisticWithChecker", kill: "bad", checker: true,
			want: map[string]Outcome{"a": OutcomeProcessed, "bad": OutcomeFailed, "b": OutcomeProcessed}, batchClaims: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mem := newMemStore()
			if tc.reject != "" {
				mem.reject[tc.reject] = true
			}
			var store idemstore.BatchStore[*memTx] = mem
			if tc.checker {
				store = memChecker{mem}
			}
			c, err := NewConsumer[*memTx](store, ConsumerConfig[*memTx]{
				Name:  "ledger@v1",
				Batch: BatchConfig{Enabled: true, Savepoints: tc.savepoints},
				Handler: func(_ context.Context, tx *memTx, m Message) error {
					tx.write(m.EventID)
					if m.EventID == tc.kill {
						tx.ended, tx.effects, tx.claims = true, map[string]int{}, map[Key]Fingerprint{}
						if tc.killErr {
							return errors.New("statement ended the transaction")
						}
					}
					return nil
				},
			})
			require.NoError(t, err)
			ctx := context.Background()
			if tc.cancelled {
				cctx, cancel := context.WithCancel(ctx)
				cancel()
				ctx = cctx
			}
			ids := []string{"a", "bad", "b"}
			msgs := make([]Message, len(ids))
			for i, id := range ids {
				msgs[i] = msg(id)
			}
			rs := c.ProcessBatch(ctx, msgs)
			for i, id := range ids {
				require.Equal(t, tc.want[id], rs[i].Outcome, "%s: %v", id, rs[i].Err)
				claimed := mem.claims[Key{Tenant: "acme", Consumer: "ledger@v1", EventID: id}] != Fingerprint{}
				require.Equal(t, claimed, mem.effects[id] == 1, "%s: an effect exists exactly when its claim does", id)
				require.Equal(t, tc.want[id] == OutcomeProcessed, mem.effects[id] == 1, "%s: processed exactly when applied", id)
			}
			if tc.reject != "" {
				require.ErrorContains(t, rs[1].Err, "row refused: event bad")
				if !tc.cancelled {
					require.NotContains(t, rs[1].Err.Error(), "batch of 3", "the event's own claim's error")
				}
			}
			if tc.kill != "" && (tc.savepoints || !tc.killErr) {
				// Without savepoints a handler's error aborts the attempt anyway; it is kept as is.
				require.ErrorIs(t, rs[1].Err, ErrTxEnded)
			}
			require.Equal(t, tc.batchClaims, mem.batchClaims)
		})
	}
}
