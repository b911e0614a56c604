package idem

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// BatchStore is a Store that can process many events in one transaction: one multi-row
// INSERT … ON CONFLICT DO NOTHING RETURNING claims them all, and each new event's handler runs
// in its own savepoint so that one failing event rolls back alone. One commit per batch instead
// of one per event is how a consumer gets past the database's commit rate without giving up
// exactly-once.
type BatchStore[TTx any] interface {
	Store[TTx]
	// ClaimBatchTx claims every key inside tx and returns one result per param, in order. The
	// keys must be distinct.
	ClaimBatchTx(ctx context.Context, tx TTx, ps []ClaimParams) ([]ClaimResult, error)
	// SavepointTx runs fn inside a savepoint of tx: an error from fn (or a panic) rolls back to
	// the savepoint and is returned, leaving the rest of tx intact.
	SavepointTx(ctx context.Context, tx TTx, fn func(ctx context.Context, tx TTx) error) error
	// ReleaseClaimTx deletes a claim made earlier in tx, for an event whose handler failed.
	ReleaseClaimTx(ctx context.Context, tx TTx, key Key) error
}

// Defaults for BatchConfig.
const (
	// BatchSizeDefault is how many deliveries one batch takes when batching is on.
	BatchSizeDefault = 100
	// BatchMaxWaitDefault is how long a worker waits to fill a partial batch.
	BatchMaxWaitDefault = 5 * time.Millisecond
)

// BatchConfig turns on batched processing: a worker takes up to Size deliveries, waiting at
// most MaxWait to fill a partial batch, and processes them in one transaction. Handlers are the
// same as in per-event mode; the store must implement BatchStore.
type BatchConfig struct {
	// Enabled turns batching on.
	Enabled bool
	// Size is the largest batch (default BatchSizeDefault).
	Size int
	// MaxWait bounds the wait for a partial batch (default BatchMaxWaitDefault).
	MaxWait time.Duration
}

func (b BatchConfig) withDefaults() BatchConfig {
	if b.Size == 0 {
		b.Size = BatchSizeDefault
	}
	if b.MaxWait == 0 {
		b.MaxWait = BatchMaxWaitDefault
	}
	return b
}

// ProcessBatch runs deliveries through the batched path: the checks of Process for each, then
// one transaction with one multi-row claim, each new event's handler in its own savepoint, and
// one commit. It returns one result per message, in order. A message whose key already appears
// earlier in the same batch is processed after the batch commits, on its own, so it is seen as
// the duplicate it is.
func (c *Consumer[TTx]) ProcessBatch(ctx context.Context, msgs []Message) []Result {
	return c.processBatch(ctx, msgs, nil)
}

func (c *Consumer[TTx]) processBatch(ctx context.Context, msgs []Message, settles []func(context.Context, TTx) error) []Result {
	bs, ok := c.store.(BatchStore[TTx])
	results := make([]Result, len(msgs))
	if !ok {
		for i, m := range msgs {
			results[i] = c.process(ctx, m, settleAt(settles, i))
		}
		return results
	}
	now := c.cfg.Now()
	type item struct {
		i   int
		msg Message
	}
	items := make([]item, 0, len(msgs))
	params := make([]ClaimParams, 0, len(msgs))
	seen := make(map[Key]struct{}, len(msgs))
	var later []int
	for i, m := range msgs {
		m, res, ok := c.prepare(ctx, m, now)
		results[i] = res
		if !ok {
			continue
		}
		if _, dup := seen[res.Key]; dup {
			later = append(later, i)
			continue
		}
		seen[res.Key] = struct{}{}
		items = append(items, item{i: i, msg: m})
		params = append(params, ClaimParams{Key: res.Key, Fingerprint: res.Fingerprint, Now: now})
	}

	if len(items) > 0 {
		statuses := make([]ClaimStatus, len(items))
		failed := make([]error, len(items))
		err := c.store.InTx(ctx, func(ctx context.Context, tx TTx) error {
			for j := range failed {
				failed[j], statuses[j] = nil, 0
			}
			crs, err := bs.ClaimBatchTx(ctx, tx, params)
			if err != nil {
				return fmt.Errorf("idem: claim batch of %d: %w", len(params), err)
			}
			if len(crs) != len(params) {
				return fmt.Errorf("idem: claim batch of %d: store returned %d results", len(params), len(crs))
			}
			for j, it := range items {
				cr := crs[j]
				statuses[j] = cr.Status
				settle := settleAt(settles, it.i)
				switch cr.Status {
				case ClaimNew:
					err := bs.SavepointTx(ctx, tx, func(ctx context.Context, tx TTx) error {
						if err := c.runHandler(ctx, tx, it.msg); err != nil {
							return err
						}
						if settle != nil {
							if err := settle(ctx, tx); err != nil {
								return fmt.Errorf("idem: settle %s in transaction: %w", params[j].Key, err)
							}
						}
						return nil
					})
					if err != nil {
						failed[j] = err
						if rerr := bs.ReleaseClaimTx(ctx, tx, params[j].Key); rerr != nil {
							return fmt.Errorf("idem: release claim %s after handler error: %w", params[j].Key, rerr)
						}
					}
				case ClaimDuplicate:
					if settle != nil {
						// A duplicate whose lease is gone is simply left to its new owner.
						failed[j] = bs.SavepointTx(ctx, tx, settle)
					}
				case ClaimConflict:
					failed[j] = &KeyReuseError{Key: params[j].Key, Claimed: cr.Existing, Received: params[j].Fingerprint}
				default:
					return fmt.Errorf("idem: claim %s: store returned invalid status %d", params[j].Key, cr.Status)
				}
			}
			return nil
		})
		for j, it := range items {
			res := results[it.i]
			switch {
			case err != nil:
				// The batch rolled back: nothing of it is applied, each delivery is retried.
				results[it.i] = c.finishResult(ctx, res, 0, err)
			case failed[j] != nil:
				results[it.i] = c.finishResult(ctx, res, statuses[j], failed[j])
			default:
				results[it.i] = c.finishResult(ctx, res, statuses[j], nil)
			}
		}
	}
	for _, i := range later {
		results[i] = c.process(ctx, msgs[i], settleAt(settles, i))
	}
	return results
}

func settleAt[TTx any](settles []func(context.Context, TTx) error, i int) func(context.Context, TTx) error {
	if settles == nil {
		return nil
	}
	return settles[i]
}

// errNotBatchStore is returned by NewConsumer when batching is on but the store cannot batch.
var errNotBatchStore = errors.New("Batch.Enabled is set but the store does not implement idem.BatchStore")
