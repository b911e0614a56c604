package idempg

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// txAcks are the queue acks of one InTx transaction, deleted together just before it commits:
// a batch of deliveries costs one DELETE instead of one per delivery.
type txAcks struct {
	mu     sync.Mutex
	ids    []int64
	tokens []int64
}

func (a *txAcks) add(id, token int64) {
	a.mu.Lock()
	a.ids = append(a.ids, id)
	a.tokens = append(a.tokens, token)
	a.mu.Unlock()
}

// deferAcks registers tx, begun by InTx, so that QueueAckTx on it defers its delete to
// flushAcks; the returned func forgets tx.
func (s *Store) deferAcks(tx pgx.Tx) (*txAcks, func()) {
	a := &txAcks{}
	s.acks.Store(tx, a)
	return a, func() { s.acks.Delete(tx) }
}

// deferredAck records the ack of job id in tx when InTx began tx, and reports whether it did.
// A savepoint's transaction (SavepointTx) is not InTx's and acks at once, so an ack never
// outlives the savepoint it was made in.
func (s *Store) deferredAck(tx pgx.Tx, id, token int64) bool {
	v, ok := s.acks.Load(tx)
	if !ok {
		return false
	}
	v.(*txAcks).add(id, token)
	return true
}

// flushAcks deletes the jobs acked in tx, fenced by their tokens, in one statement. A job whose
// lease was lost meanwhile fails the whole transaction with an error wrapping
// idem.ErrLeaseLost, as its own delete would have.
func (s *Store) flushAcks(ctx context.Context, tx pgx.Tx, a *txAcks) error {
	a.mu.Lock()
	ids, tokens := a.ids, a.tokens
	a.ids, a.tokens = nil, nil
	a.mu.Unlock()
	switch len(ids) {
	case 0:
		return nil
	case 1:
		return s.ack(ctx, tx, ids[0], tokens[0])
	}
	rows, err := tx.Query(ctx, s.q.queueAckBatch, ids, tokens)
	if err != nil {
		return fmt.Errorf("idempg: ack %d queue jobs: %w", len(ids), err)
	}
	deleted, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("idempg: ack %d queue jobs: %w", len(ids), err)
	}
	if len(deleted) == len(ids) {
		return nil
	}
	var lost []int64
	for _, id := range ids {
		if !slices.Contains(deleted, id) {
			lost = append(lost, id)
		}
	}
	if len(lost) == 0 { // an id acked twice in one transaction
		return fmt.Errorf("idempg: ack %d queue jobs: %d deleted: %w", len(ids), len(deleted), idem.ErrLeaseLost)
	}
	return fmt.Errorf("idempg: ack queue jobs %v with their tokens: %w", lost[:min(len(lost), 5)], idem.ErrLeaseLost)
}
