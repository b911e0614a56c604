package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

var _ idemstore.BatchStore[*sql.Tx] = (*Store)(nil)

// claimChunk bounds one multi-row INSERT (5 parameters a row, far below SQLite's limit).
const claimChunk = 500

// ClaimBatchTx claims every key inside tx with multi-row INSERT … ON CONFLICT DO NOTHING
// RETURNING statements (up to 500 rows each) and reads the claims it did not insert. It first
// opens a savepoint that TxEnded probes. SQLite
// serialises writers and tx holds the write lock, so nothing changes in between. Results come
// back in the order of ps.
func (s *Store) ClaimBatchTx(ctx context.Context, tx *sql.Tx, ps []idemstore.ClaimParams) ([]idemstore.ClaimResult, error) {
	results := make([]idemstore.ClaimResult, len(ps))
	index := make(map[idem.Key]int, len(ps))
	for i, p := range ps {
		if p.Key.EventID == "" {
			return nil, fmt.Errorf("idemsqlite: claim batch: key %s has an empty event id", p.Key)
		}
		if _, dup := index[p.Key]; dup {
			return nil, fmt.Errorf("idemsqlite: claim batch: key %s appears twice", p.Key)
		}
		index[p.Key] = i
	}
	// The marker TxEnded probes; ClaimBatchTx is the batch transaction's first statement.
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+txMarker); err != nil {
		return nil, fmt.Errorf("idemsqlite: claim batch: savepoint: %w", err)
	}
	table := s.cfg.Prefix + "claims"
	for start := 0; start < len(ps); start += claimChunk {
		chunk := ps[start:min(start+claimChunk, len(ps))]
		var b strings.Builder
		b.WriteString("INSERT INTO " + table + " (tenant, consumer, event_id, fingerprint, created_at) VALUES ")
		args := make([]any, 0, 5*len(chunk))
		for j, p := range chunk {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, ?, ?, ?)")
			now := p.Now
			if now.IsZero() {
				now = time.Now()
			}
			fp := p.Fingerprint
			args = append(args, p.Key.Tenant, p.Key.Consumer, p.Key.EventID, fp[:], now.UnixMicro())
		}
		b.WriteString(" ON CONFLICT DO NOTHING RETURNING tenant, consumer, event_id")
		rows, err := tx.QueryContext(ctx, b.String(), args...)
		if err != nil {
			return nil, fmt.Errorf("idemsqlite: claim batch of %d: %w", len(chunk), err)
		}
		var k idem.Key
		for rows.Next() {
			if err := rows.Scan(&k.Tenant, &k.Consumer, &k.EventID); err != nil {
				_ = rows.Close()
				return nil, fmt.Errorf("idemsqlite: claim batch: scan: %w", err)
			}
			if i, ok := index[k]; ok {
				results[i].Status = idemstore.ClaimNew
			}
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return nil, fmt.Errorf("idemsqlite: claim batch of %d: %w", len(chunk), err)
		}
	}
	for i := range results {
		if results[i].Status != 0 {
			continue
		}
		// Taken already: ClaimTx's insert finds the conflict and reads the stored fingerprint.
		r, err := s.ClaimTx(ctx, tx, ps[i])
		if err != nil {
			return nil, err
		}
		results[i] = r
	}
	return results, nil
}

// SavepointTx runs fn inside a savepoint of tx: an error or panic from fn rolls back to the
// savepoint only, leaving the rest of tx intact.
//
// Some statements make SQLite roll back the whole transaction, not just the statement: a
// trigger's RAISE(ROLLBACK), an ON CONFLICT ROLLBACK clause, and, per SQLite's documentation,
// SQLITE_FULL, IOERR, BUSY or NOMEM in some cases. The savepoint is then gone with the
// transaction, and the connection is back in autocommit mode, where every later statement
// would commit on its own. SavepointTx notices it at the root: ROLLBACK TO or RELEASE of its
// savepoint fails (whatever the error text), and it returns an error wrapping idem.ErrTxEnded,
// on which the consumer aborts the batch.
func (s *Store) SavepointTx(ctx context.Context, tx *sql.Tx, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if _, err := tx.ExecContext(ctx, "SAVEPOINT idem_sp"); err != nil {
		return fmt.Errorf("idemsqlite: savepoint: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_, _ = tx.ExecContext(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT idem_sp; RELEASE SAVEPOINT idem_sp")
		}
	}()
	if err := fn(ctx, tx); err != nil {
		done = true
		if _, rerr := tx.ExecContext(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT idem_sp; RELEASE SAVEPOINT idem_sp"); rerr != nil {
			return fmt.Errorf("idemsqlite: rollback to savepoint after %w: %w: %w", err, idem.ErrTxEnded, rerr)
		}
		return err
	}
	done = true
	if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT idem_sp"); err != nil {
		return fmt.Errorf("idemsqlite: release savepoint: %w: %w", idem.ErrTxEnded, err)
	}
	return nil
}

// txMarker is the savepoint ClaimBatchTx opens in a batch's transaction, for TxEnded.
const txMarker = "idem_tx"

var _ idemstore.TxEndChecker[*sql.Tx] = (*Store)(nil)

// TxEnded implements idemstore.TxEndChecker for a transaction in which ClaimBatchTx ran (the batch
// path asks it after each handler): it reports whether a statement ended the transaction behind
// database/sql's back (see SavepointTx), which the driver does not expose. It releases and
// reopens the savepoint ClaimBatchTx opened: inside the transaction that changes nothing; once
// the connection is back in autocommit mode, the release fails (and the reopen, which would
// start a new transaction, never runs). It is a call into the embedded database, without a
// network round trip. Any failure counts as ended.
func (s *Store) TxEnded(tx *sql.Tx) bool {
	_, err := tx.Exec("RELEASE SAVEPOINT " + txMarker + "; SAVEPOINT " + txMarker)
	return err != nil
}

// ReleaseClaimTx deletes a claim made earlier in tx, for an event whose handler failed inside a
// batch.
func (s *Store) ReleaseClaimTx(ctx context.Context, tx *sql.Tx, key idem.Key) error {
	if _, err := tx.ExecContext(ctx, "DELETE FROM "+s.cfg.Prefix+"claims WHERE tenant = ? AND consumer = ? AND event_id = ?",
		key.Tenant, key.Consumer, key.EventID); err != nil {
		return fmt.Errorf("idemsqlite: release claim: %w", err)
	}
	return nil
}
