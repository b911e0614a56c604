package idempg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
)

// txAcks are the queue acks of one InTx transaction, deleted together with its COMMIT: a batch
// of deliveries costs one DELETE instead of one per delivery, and that DELETE no round trip of
// its own.
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
// commitAcks; the returned func forgets tx.
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

// take returns the acks recorded so far and forgets them.
func (a *txAcks) take() (ids, tokens []int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ids, tokens = a.ids, a.tokens
	a.ids, a.tokens = nil, nil
	return ids, tokens
}

// ackLostMarker starts the text whose failed cast queueAckCommit raises when an acked job is no
// longer held under its token; commitAcks recognises the error by it.
const ackLostMarker = "idem: queue jobs no longer held under their tokens: "

// commitAcks deletes the jobs acked in tx, each fenced by its token, and commits tx, in one
// round trip: the delete and the COMMIT go to the server as one batch. When a job's lease was
// lost meanwhile, the delete fails, the server skips the COMMIT and the error wraps
// idem.ErrLeaseLost; *done stays false, so InTx rolls back and the handler's effect is undone,
// as the job's own delete failing would have done. *done is set once the COMMIT may have run.
func (s *Store) commitAcks(ctx context.Context, tx pgx.Tx, ids, tokens []int64, done *bool) error {
	b := &pgx.Batch{}
	if len(ids) == 1 {
		b.Queue(s.q.queueAckCommit1, ids[0], tokens[0])
	} else {
		b.Queue(s.q.queueAckCommit, ids, tokens)
	}
	b.Queue("COMMIT")
	br := tx.SendBatch(ctx, b)
	_, ackErr := br.Exec()
	tag, commitErr := br.Exec()
	closeErr := br.Close()
	var pe *pgconn.PgError
	if ackErr != nil && errors.As(ackErr, &pe) {
		// The server answered the delete with an error and skipped the COMMIT: the
		// transaction is still open (aborted) and InTx rolls it back.
		if deleted, ok := ackLost(pe); ok {
			return lostAcks(ids, tokens, deleted)
		}
		return fmt.Errorf("idempg: ack %d queue jobs: %w", len(ids), ackErr)
	}
	*done = true
	switch {
	case ackErr != nil: // no answer: the COMMIT was sent and may have run
		return fmt.Errorf("idempg: commit with %d queue acks: %w", len(ids), ackErr)
	case commitErr != nil:
		return fmt.Errorf("idempg: commit: %w", commitErr)
	case closeErr != nil:
		return fmt.Errorf("idempg: commit: %w", closeErr)
	case tag.String() != "COMMIT":
		// The transaction had failed before (a statement of fn whose error fn ignored): the
		// server rolled it back.
		return fmt.Errorf("idempg: commit: %w", pgx.ErrTxCommitRollback)
	}
	return nil
}

// ackLost reports whether pe is queueAckCommit's failure and returns the ids it lists (the jobs
// it deleted). The server's message quotes the text the statement cast, in whatever language
// lc_messages sets, so the ids are read after ackLostMarker, up to the first character that is
// neither a digit nor a space.
func ackLost(pe *pgconn.PgError) (deleted []string, ok bool) {
	if pe.Code != "22P02" { // invalid_text_representation
		return nil, false
	}
	_, rest, ok := strings.Cut(pe.Message, ackLostMarker)
	if !ok {
		return nil, false
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r != ' ' && (r < '0' || r > '9') })
	if end >= 0 {
		rest = rest[:end]
	}
	return strings.Fields(rest), true
}

// lostAcks is the error of acks ids (with tokens) of which only the jobs whose ids are in held
// (from queueAckCommit's failure) were still held under their tokens.
func lostAcks(ids, tokens []int64, held []string) error {
	if len(ids) == 1 {
		return errAckLost(ids[0], tokens[0])
	}
	var lost []string
	for i, id := range ids {
		if !slices.Contains(held, strconv.FormatInt(id, 10)) {
			lost = append(lost, fmt.Sprintf("job %d (token %d)", id, tokens[i]))
		}
	}
	if len(lost) == 0 { // an id acked twice in one transaction
		return fmt.Errorf("idempg: ack %d queue jobs: %d deleted, a job acked twice: %w", len(ids), len(held), idem.ErrLeaseLost)
	}
	return fmt.Errorf("idempg: ack %d queue jobs: no longer held under their tokens: %s: %w",
		len(ids), strings.Join(lost[:min(len(lost), 5)], ", "), idem.ErrLeaseLost)
}
