package idemmysql

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// claimChunk bounds one multi-row INSERT (5 placeholders a row, far below the 65535 a prepared
// statement may have).
const claimChunk = 500

// ClaimBatchTx claims every key inside tx, in key order, so that overlapping batches lock their
// keys in the same order. It first tries one multi-row INSERT per chunk of up to 500 keys: in
// the common case, where every key is new, that is the whole work. A duplicate fails the
// statement, which InnoDB rolls back alone (the transaction and its locks stay), and the chunk's
// keys are then claimed one by one with ClaimTx, which tells new, duplicate and conflict apart.
// Results come back in the order of ps.
func (s *Store) ClaimBatchTx(ctx context.Context, tx *sql.Tx, ps []idemstore.ClaimParams) ([]idemstore.ClaimResult, error) {
	n := len(ps)
	if n == 0 {
		return nil, nil
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return compareKeys(ps[a].Key, ps[b].Key) })
	for j, i := range order {
		if err := checkKey(ps[i].Key); err != nil {
			return nil, fmt.Errorf("idemmysql: claim batch: key %s: %w", ps[i].Key, err)
		}
		if j > 0 && ps[order[j-1]].Key == ps[i].Key {
			return nil, fmt.Errorf("idemmysql: claim batch: key %s appears twice", ps[i].Key)
		}
	}
	results := make([]idemstore.ClaimResult, n)
	table := s.cfg.Prefix + "claims"
	for start := 0; start < n; start += claimChunk {
		chunk := order[start:min(start+claimChunk, n)]
		var b strings.Builder
		b.WriteString("INSERT INTO " + table + " (tenant, consumer, event_id, fingerprint, created_at) VALUES ")
		args := make([]any, 0, 5*len(chunk))
		for j, i := range chunk {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, ?, ?, ?)")
			p := ps[i]
			now := p.Now
			if now.IsZero() {
				now = time.Now()
			}
			fp := p.Fingerprint
			args = append(args, p.Key.Tenant, p.Key.Consumer, p.Key.EventID, fp[:], now.UnixMicro())
		}
		_, err := tx.ExecContext(ctx, b.String(), args...)
		if err == nil {
			for _, i := range chunk {
				results[i].Status = idemstore.ClaimNew
			}
			continue
		}
		if !isMySQLError(err, errDupEntry) {
			return nil, fmt.Errorf("idemmysql: claim batch of %d: %w", len(chunk), err)
		}
		for _, i := range chunk {
			r, err := s.ClaimTx(ctx, tx, ps[i])
			if err != nil {
				return nil, err
			}
			results[i] = r
		}
	}
	return results, nil
}

func compareKeys(a, b idem.Key) int {
	if c := strings.Compare(a.Tenant, b.Tenant); c != 0 {
		return c
	}
	if c := strings.Compare(a.Consumer, b.Consumer); c != 0 {
		return c
	}
	return strings.Compare(a.EventID, b.EventID)
}

// SavepointTx runs fn inside a savepoint of tx: an error or panic from fn rolls back to the
// savepoint only, leaving the rest of tx intact. After a deadlock InnoDB has rolled back the
// whole transaction and the savepoint with it; the rollback to it then fails, and that error
// fails the batch.
func (s *Store) SavepointTx(ctx context.Context, tx *sql.Tx, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if _, err := tx.ExecContext(ctx, "SAVEPOINT idem_sp"); err != nil {
		return fmt.Errorf("idemmysql: savepoint: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_, _ = tx.ExecContext(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT idem_sp")
		}
	}()
	if err := fn(ctx, tx); err != nil {
		done = true
		if _, rerr := tx.ExecContext(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT idem_sp"); rerr != nil {
			if s.TxEnded(tx) {
				rerr = fmt.Errorf("%w: %w", idem.ErrTxEnded, rerr)
			}
			return fmt.Errorf("idemmysql: rollback to savepoint after %w: %w", err, rerr)
		}
		return err
	}
	done = true
	if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT idem_sp"); err != nil {
		if s.TxEnded(tx) {
			err = fmt.Errorf("%w: %w", idem.ErrTxEnded, err)
		}
		return fmt.Errorf("idemmysql: release savepoint: %w", err)
	}
	return nil
}

// ReleaseClaimTx deletes a claim made earlier in tx, for an event whose handler failed inside a
// batch.
func (s *Store) ReleaseClaimTx(ctx context.Context, tx *sql.Tx, key idem.Key) error {
	if _, err := tx.ExecContext(ctx, s.q.claimRelease, key.Tenant, key.Consumer, key.EventID); err != nil {
		return fmt.Errorf("idemmysql: release claim: %w", err)
	}
	return nil
}

var _ idemstore.TxEndChecker[*sql.Tx] = (*Store)(nil)

// txEndTimeout bounds the round trip of TxEnded.
const txEndTimeout = 5 * time.Second

// TxEnded implements idemstore.TxEndChecker. MySQL ends a transaction behind the client's back on a
// deadlock (1213), and a handler may run ROLLBACK or COMMIT itself; the statements after that
// commit one by one. The client cannot see it, so TxEnded asks the server: one round trip per
// handler of a batch, the price of never committing a batch whose claims are gone. MariaDB
// answers @@in_transaction; MySQL 8 has no such variable (error 1193), so there, from the first
// refusal on, TxEnded sets and releases a savepoint instead, which fails only outside a
// transaction. A failed query counts as ended: the batch is then retried rather than trusted.
func (s *Store) TxEnded(tx *sql.Tx) bool {
	ctx, cancel := context.WithTimeout(context.Background(), txEndTimeout)
	defer cancel()
	if !s.noInTransaction.Load() {
		var open int
		err := tx.QueryRowContext(ctx, "SELECT @@in_transaction").Scan(&open)
		if err == nil {
			return open == 0
		}
		if !isMySQLError(err, errUnknownSystemVariable) {
			return true
		}
		s.noInTransaction.Store(true)
	}
	return savepointRefused(ctx, tx)
}

// txProbe is the savepoint savepointRefused sets; no other savepoint of idem's or a handler's is
// expected to bear its name.
const txProbe = "idem_tx_probe"

// savepointRefused sets and releases a savepoint in tx and reports whether the server refused
// either: outside a transaction (autocommit) a savepoint ends with the statement that set it, so
// its release fails with 1305, on MySQL and MariaDB alike.
func savepointRefused(ctx context.Context, tx *sql.Tx) bool {
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+txProbe); err != nil {
		return true
	}
	_, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT "+txProbe)
	return err != nil
}
