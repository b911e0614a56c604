package idempg

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

var _ idemstore.BatchStore[pgx.Tx] = (*Store)(nil)

// ClaimBatchTx claims every key inside tx with one multi-row INSERT … ON CONFLICT DO NOTHING
// RETURNING, then reads the claims it did not insert in one more statement (a new snapshot, so
// claims that rivals committed while the insert waited are visible). Keys are inserted in sorted
// order so that overlapping batches lock them in the same order. Results come back in the order
// of ps. A claim that vanished between the two statements (garbage collection) is claimed again
// on its own.
//
// On a partitioned store it does what ClaimTx does, for every key at once: it takes the keys'
// advisory locks (in the order of their lock keys, so overlapping batches do not deadlock),
// then looks the keys up in every partition and inserts the missing ones in the partition of
// their creation time, in one pipelined round trip. p.Bucket is ignored.
func (s *Store) ClaimBatchTx(ctx context.Context, tx pgx.Tx, ps []idemstore.ClaimParams) ([]idemstore.ClaimResult, error) {
	n := len(ps)
	if n == 0 {
		return nil, nil
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return compareKeys(ps[a].Key, ps[b].Key) })
	tenants, consumers, ids := make([]string, n), make([]string, n), make([]string, n)
	fps, nows := make([][]byte, n), make([]time.Time, n)
	var buckets []time.Time
	var locks []int64
	if s.bucket != 0 {
		buckets, locks = make([]time.Time, n), make([]int64, n)
	}
	for j, i := range order {
		p := ps[i]
		if p.Key.EventID == "" {
			return nil, fmt.Errorf("idempg: claim batch: key %s has an empty event id", p.Key)
		}
		if j > 0 && ps[order[j-1]].Key == p.Key {
			return nil, fmt.Errorf("idempg: claim batch: key %s appears twice", p.Key)
		}
		now := p.Now
		if now.IsZero() {
			now = time.Now().UTC()
		}
		// The fingerprint is sliced from ps itself: slicing the copy p would move p to the heap.
		tenants[j], consumers[j], ids[j], fps[j], nows[j] = p.Key.Tenant, p.Key.Consumer, p.Key.EventID, ps[i].Fingerprint[:], now
		if buckets != nil {
			buckets[j], locks[j] = now.UTC().Truncate(s.bucket), s.keyLock(p.Key)
		}
	}
	index := make(map[idem.Key]int, n)
	for i, p := range ps {
		index[p.Key] = i
	}
	results := make([]idemstore.ClaimResult, n)
	var err error
	if buckets != nil {
		slices.Sort(locks)
		locks = slices.Compact(locks)
		err = s.claimBatchPartitioned(ctx, tx, index, results, locks, tenants, consumers, ids, buckets, fps, nows)
	} else {
		err = s.claimBatchPlain(ctx, tx, index, results, tenants, consumers, ids, fps, nows)
	}
	if err != nil {
		return nil, err
	}
	for i := range results {
		switch {
		case results[i].Status == 0:
			if results[i], err = s.ClaimTx(ctx, tx, ps[i]); err != nil {
				return nil, err
			}
		case results[i].Status == idemstore.ClaimDuplicate && results[i].Existing != ps[i].Fingerprint:
			results[i].Status = idemstore.ClaimConflict
		}
	}
	return results, nil
}

// claimBatchPlain inserts the keys into the plain claims table and reads the existing claims of
// those it did not insert; it fills results by index.
func (s *Store) claimBatchPlain(ctx context.Context, tx pgx.Tx, index map[idem.Key]int, results []idemstore.ClaimResult,
	tenants, consumers, ids []string, fps [][]byte, nows []time.Time) error {
	n := len(results)
	rows, err := tx.Query(ctx, s.q.claimBatch, tenants, consumers, ids, fps, nows)
	if err != nil {
		return s.claimBatchError(n, err)
	}
	inserted := 0
	var k idem.Key
	dest := []any{&k.Tenant, &k.Consumer, &k.EventID} // once, not once per row
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return fmt.Errorf("idempg: claim batch of %d: scan: %w", n, err)
		}
		if i, ok := index[k]; ok {
			results[i].Status = idemstore.ClaimNew
			inserted++
		}
	}
	if err := rows.Err(); err != nil {
		return s.claimBatchError(n, err)
	}
	if inserted == n {
		return nil
	}
	rows, err = tx.Query(ctx, s.q.claimBatchSelect, tenants, consumers, ids)
	if err != nil {
		return fmt.Errorf("idempg: read existing claims of a batch of %d: %w", n, err)
	}
	for rows.Next() {
		var fp []byte
		var at time.Time
		if err := rows.Scan(&k.Tenant, &k.Consumer, &k.EventID, &fp, &at); err != nil {
			rows.Close()
			return fmt.Errorf("idempg: read existing claims: scan: %w", err)
		}
		i, ok := index[k]
		if !ok || results[i].Status == idemstore.ClaimNew {
			continue
		}
		if err := setFound(&results[i], k, fp, at); err != nil {
			rows.Close()
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("idempg: read existing claims: %w", err)
	}
	return nil
}

// claimBatchPartitioned takes the keys' locks (sorted, distinct lock keys) and then looks up
// and inserts every key, in one pipelined round trip; it fills results by index.
func (s *Store) claimBatchPartitioned(ctx context.Context, tx pgx.Tx, index map[idem.Key]int, results []idemstore.ClaimResult,
	locks []int64, tenants, consumers, ids []string, buckets []time.Time, fps [][]byte, nows []time.Time) error {
	n := len(results)
	var isolation string
	b := &pgx.Batch{}
	b.Queue(s.q.claimBatchLock, locks).QueryRow(func(row pgx.Row) error {
		var locked int64
		return row.Scan(&locked, &isolation)
	})
	b.Queue(s.q.claimBatch, tenants, consumers, ids, buckets, fps, nows).Query(func(rows pgx.Rows) error {
		var k idem.Key
		for rows.Next() {
			var (
				inserted bool
				fp       []byte
				at       pgtype.Timestamptz
			)
			if err := rows.Scan(&inserted, &k.Tenant, &k.Consumer, &k.EventID, &fp, &at); err != nil {
				return fmt.Errorf("scan: %w", err)
			}
			i, ok := index[k]
			if !ok {
				continue
			}
			if inserted {
				results[i] = idemstore.ClaimResult{Status: idemstore.ClaimNew}
				continue
			}
			if err := setFound(&results[i], k, fp, timeOf(at)); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	err := tx.SendBatch(ctx, b).Close()
	if isolation != "" && isolation != "read committed" {
		return fmt.Errorf("idempg: claim batch of %d: %w", n, isolationError(isolation))
	}
	if err != nil {
		return s.claimBatchError(n, err)
	}
	return nil
}

// setFound records an existing claim of k as a duplicate; ClaimBatchTx then turns it into a
// conflict when the fingerprints differ.
func setFound(r *idemstore.ClaimResult, k idem.Key, fp []byte, at time.Time) error {
	existing, err := idem.FingerprintFromBytes(fp)
	if err != nil {
		return fmt.Errorf("idempg: claim: %w", err)
	}
	*r = idemstore.ClaimResult{Status: idemstore.ClaimDuplicate, Existing: existing, ClaimedAt: at}
	return nil
}

// claimBatchError describes a failed batch insert; one row without a partition fails it all.
func (s *Store) claimBatchError(n int, err error) error {
	if s.bucket != 0 && isMissingPartition(err) {
		return s.missingPartition(err, fmt.Sprintf("claim batch of %d", n), time.Time{})
	}
	if s.bucket == 0 && isPartitionedTable(err) {
		err = fmt.Errorf("%w: %w", errPartitionedTable, err)
	}
	return fmt.Errorf("idempg: claim batch of %d: %w", n, err)
}

func compareKeys(a, b idem.Key) int {
	switch {
	case a.Tenant != b.Tenant:
		return cmpString(a.Tenant, b.Tenant)
	case a.Consumer != b.Consumer:
		return cmpString(a.Consumer, b.Consumer)
	default:
		return cmpString(a.EventID, b.EventID)
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// SavepointTx runs fn in a savepoint of tx (pgx's nested transaction): an error or panic from
// fn rolls back to the savepoint only. When the savepoint can be neither rolled back to nor
// released because fn ended the whole transaction (a ROLLBACK or COMMIT run on it: the
// connection reports no open transaction), the error wraps idem.ErrTxEnded, and the consumer
// aborts the batch.
func (s *Store) SavepointTx(ctx context.Context, tx pgx.Tx, fn func(ctx context.Context, tx pgx.Tx) error) (err error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("idempg: savepoint: %w", s.txEnded(tx, err))
	}
	done := false
	defer func() {
		if !done {
			_ = sp.Rollback(ctx)
		}
	}()
	if err := fn(ctx, sp); err != nil {
		done = true
		if rerr := sp.Rollback(ctx); rerr != nil {
			return fmt.Errorf("idempg: rollback to savepoint after %w: %w", err, s.txEnded(tx, rerr))
		}
		return err
	}
	done = true
	if s.TxEnded(tx) {
		return fmt.Errorf("idempg: release savepoint: %w", idem.ErrTxEnded)
	}
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("idempg: release savepoint: %w", s.txEnded(tx, err))
	}
	return nil
}

var _ idemstore.TxEndChecker[pgx.Tx] = (*Store)(nil)

// TxEnded implements idemstore.TxEndChecker: it reports whether tx's connection says no transaction
// is open (a statement ended it behind pgx's back), from the status of its last message, so
// without a round trip.
func (s *Store) TxEnded(tx pgx.Tx) bool {
	c := tx.Conn()
	return c != nil && !c.IsClosed() && c.PgConn().TxStatus() == 'I'
}

// txEnded wraps err with idem.ErrTxEnded when tx's transaction is gone.
func (s *Store) txEnded(tx pgx.Tx, err error) error {
	if s.TxEnded(tx) {
		return fmt.Errorf("%w: %w", idem.ErrTxEnded, err)
	}
	return err
}

// ReleaseClaimTx deletes a claim made earlier in tx, for an event whose handler failed inside
// a batch.
//
// On a partitioned store the key arrives without its bucket, so it deletes the claim of key that
// tx itself inserted, in whichever partition, and never a committed claim of the same event id
// in another bucket. That claim must have been made at tx's top level (ClaimBatchTx is), not in
// a savepoint: finding none is an error, which rolls the batch back rather than commit an
// effect-less claim.
func (s *Store) ReleaseClaimTx(ctx context.Context, tx pgx.Tx, key idem.Key) error {
	tag, err := tx.Exec(ctx, s.q.claimRelease, key.Tenant, key.Consumer, key.EventID)
	if err != nil {
		return fmt.Errorf("idempg: release claim: %w", err)
	}
	if s.bucket != 0 && tag.RowsAffected() == 0 {
		return fmt.Errorf("idempg: release claim: this transaction made no such claim at its top level")
	}
	return nil
}
