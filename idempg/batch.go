package idempg

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

var _ idem.BatchStore[pgx.Tx] = (*Store)(nil)

// ClaimBatchTx claims every key inside tx with one multi-row INSERT … ON CONFLICT DO NOTHING
// RETURNING, then reads the claims it did not insert in one more statement (a new snapshot, so
// claims that rivals committed while the insert waited are visible). Keys are inserted in sorted
// order so that overlapping batches lock them in the same order. Results come back in the order
// of ps. A claim that vanished between the two statements (garbage collection) is claimed again
// on its own.
func (s *Store) ClaimBatchTx(ctx context.Context, tx pgx.Tx, ps []idem.ClaimParams) ([]idem.ClaimResult, error) {
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
	if s.bucket != 0 {
		buckets = make([]time.Time, n)
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
		tenants[j], consumers[j], ids[j], fps[j], nows[j] = p.Key.Tenant, p.Key.Consumer, p.Key.EventID, p.Fingerprint[:], now
		if buckets != nil {
			if p.Bucket.IsZero() {
				return nil, fmt.Errorf("idempg: claim batch: %w", errZeroBucket(p.Key))
			}
			buckets[j] = p.Bucket.UTC().Truncate(s.bucket)
		}
	}
	index := make(map[idem.Key]int, n)
	for i, p := range ps {
		index[p.Key] = i
	}
	results := make([]idem.ClaimResult, n)

	var rows pgx.Rows
	var err error
	if buckets != nil {
		rows, err = tx.Query(ctx, s.q.claimBatch, tenants, consumers, ids, buckets, fps, nows)
	} else {
		rows, err = tx.Query(ctx, s.q.claimBatch, tenants, consumers, ids, fps, nows)
	}
	if err != nil {
		return nil, s.claimBatchError(n, err)
	}
	inserted := 0
	var k idem.Key
	for rows.Next() {
		if err := rows.Scan(&k.Tenant, &k.Consumer, &k.EventID); err != nil {
			rows.Close()
			return nil, fmt.Errorf("idempg: claim batch of %d: scan: %w", n, err)
		}
		if i, ok := index[k]; ok {
			results[i].Status = idem.ClaimNew
			inserted++
		}
	}
	if err := rows.Err(); err != nil {
		return nil, s.claimBatchError(n, err)
	}
	if inserted == n {
		return results, nil
	}

	if buckets != nil {
		rows, err = tx.Query(ctx, s.q.claimBatchSelect, tenants, consumers, ids, buckets)
	} else {
		rows, err = tx.Query(ctx, s.q.claimBatchSelect, tenants, consumers, ids)
	}
	if err != nil {
		return nil, fmt.Errorf("idempg: read existing claims of a batch of %d: %w", n, err)
	}
	for rows.Next() {
		var fp []byte
		var at time.Time
		if err := rows.Scan(&k.Tenant, &k.Consumer, &k.EventID, &fp, &at); err != nil {
			rows.Close()
			return nil, fmt.Errorf("idempg: read existing claims: scan: %w", err)
		}
		i, ok := index[k]
		if !ok || results[i].Status == idem.ClaimNew {
			continue
		}
		existing, err := idem.FingerprintFromBytes(fp)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("idempg: claim of event %s: %w", k.EventID, err)
		}
		results[i] = idem.ClaimResult{Status: idem.ClaimDuplicate, Existing: existing, ClaimedAt: at}
		if existing != ps[i].Fingerprint {
			results[i].Status = idem.ClaimConflict
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idempg: read existing claims: %w", err)
	}
	for i := range results {
		if results[i].Status == 0 {
			if results[i], err = s.ClaimTx(ctx, tx, ps[i]); err != nil {
				return nil, err
			}
		}
	}
	return results, nil
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
// fn rolls back to the savepoint only.
func (s *Store) SavepointTx(ctx context.Context, tx pgx.Tx, fn func(ctx context.Context, tx pgx.Tx) error) (err error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("idempg: savepoint: %w", err)
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
			return fmt.Errorf("idempg: rollback to savepoint after %w: %w", err, rerr)
		}
		return err
	}
	done = true
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("idempg: release savepoint: %w", err)
	}
	return nil
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
		return fmt.Errorf("idempg: release claim of event %s (key %s): %w", key.EventID, key, err)
	}
	if s.bucket != 0 && tag.RowsAffected() == 0 {
		return fmt.Errorf("idempg: release claim of event %s (key %s): this transaction made no such claim at its top level", key.EventID, key)
	}
	return nil
}
