package idem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// ErrTxEnded is wrapped by an error that reports a transaction ended behind idem's back: a
// statement of a handler rolled back (or committed) the whole transaction, e.g. a SQLite
// trigger's RAISE(ROLLBACK), an ON CONFLICT ROLLBACK clause, or a ROLLBACK run on the
// transaction. What the transaction held is gone, claims included, and what runs after it runs
// outside any transaction; so a BatchStore's SavepointTx wraps it when it cannot roll back to or
// release its savepoint because the transaction is gone, and the consumer then aborts the
// batch's transaction instead of carrying on.
var ErrTxEnded = errors.New("idem: the transaction ended inside the handler")

// Defaults for BatchConfig.
const (
	// BatchSizeDefault is how many deliveries one batch takes when batching is on.
	BatchSizeDefault = 100
	// BatchMaxWaitDefault is how long a worker waits to fill a partial batch.
	BatchMaxWaitDefault = 5 * time.Millisecond
)

// BatchConfig turns on batched processing: a worker takes up to Size deliveries, waiting at
// most MaxWait to fill a partial batch, and processes them in one transaction. Handlers are the
// same as in per-event mode, unless ConsumerConfig.SetHandler is set: then each batch's new
// events go to it at once (Consumer.ProcessSet). The store must implement BatchStore.
type BatchConfig struct {
	// Enabled turns batching on.
	Enabled bool
	// Size is the largest batch (default BatchSizeDefault).
	Size int
	// MaxWait bounds the wait for a partial batch (default BatchMaxWaitDefault).
	MaxWait time.Duration
	// Savepoints runs every handler in its own savepoint, so that a failing event rolls back
	// alone inside the shared transaction. Without it (the default) handlers run straight in the
	// transaction and a failure rolls the whole batch back, after which the batch is run again
	// without the failing event and that event takes its own path alone. Both keep every
	// semantic of the per-event path; the default saves two round trips per event when handlers
	// rarely fail, savepoints win when they often do.
	Savepoints bool
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
	return c.processBatch(ctx, msgs, nil, nil)
}

// processBatch is ProcessBatch with in-transaction settle hooks and, when traced, each
// delivery's trace (its handler runs under it).
func (c *Consumer[TTx]) processBatch(ctx context.Context, msgs []Message, settles []func(context.Context, TTx) error, traces []DeliveryTrace) []Result {
	bs := c.batchStore
	if bs == nil {
		return c.processEach(ctx, msgs, settles, traces)
	}
	b := c.prepareBatch(ctx, msgs)
	c.applyEach(ctx, bs, b.items, b.params, b.results, settles, traces)
	c.processLater(ctx, msgs, b, settles, traces)
	return b.results
}

// processEach runs every delivery through the per-event path, for a store that cannot batch.
func (c *Consumer[TTx]) processEach(ctx context.Context, msgs []Message, settles []func(context.Context, TTx) error, traces []DeliveryTrace) []Result {
	results := make([]Result, len(msgs))
	for i, m := range msgs {
		results[i] = c.process(traceAt(ctx, traces, i), m, settleAt(settles, i))
	}
	return results
}

// preparedBatch is a batch after the checks that come before its transaction: a result per
// delivery (final for those that already failed), the deliveries to claim together with their
// claims, and the deliveries whose key appears earlier in the batch.
type preparedBatch struct {
	results []Result
	items   []batchItem
	params  []idemstore.ClaimParams
	// later holds the indexes of deliveries to process alone after the batch commits.
	later []int
}

// prepareBatch runs prepare on every delivery and sets aside those whose key repeats one
// earlier in the batch: the batched and the set-based paths share it.
func (c *Consumer[TTx]) prepareBatch(ctx context.Context, msgs []Message) preparedBatch {
	now := c.cfg.Now()
	b := preparedBatch{
		results: make([]Result, len(msgs)),
		items:   make([]batchItem, 0, len(msgs)),
		params:  make([]idemstore.ClaimParams, 0, len(msgs)),
	}
	seen := make(map[Key]struct{}, len(msgs))
	for i, m := range msgs {
		m, res, ok := c.prepare(ctx, m, now)
		b.results[i] = res
		if !ok {
			continue
		}
		if _, dup := seen[res.Key]; dup {
			b.later = append(b.later, i)
			continue
		}
		seen[res.Key] = struct{}{}
		b.items = append(b.items, batchItem{i: i, msg: m})
		b.params = append(b.params, idemstore.ClaimParams{Key: res.Key, Fingerprint: res.Fingerprint, Now: now, Bucket: res.bucket})
	}
	return b
}

// applyEach applies items with each event's handler in one shared transaction, setting aside
// and retrying without it any event that aborts an attempt.
func (c *Consumer[TTx]) applyEach(ctx context.Context, bs idemstore.BatchStore[TTx], items []batchItem, params []idemstore.ClaimParams, results []Result, settles []func(context.Context, TTx) error, traces []DeliveryTrace) {
	// A failing event aborts the attempt (without savepoints: any failure; with them: a handler
	// that ended the transaction itself); it is set aside and the rest is tried again, so each
	// such failure costs one extra transaction.
	its, ps := items, params
	for len(its) > 0 {
		failedAt := c.applyBatch(ctx, bs, its, ps, results, settles, traces, c.cfg.Batch.Savepoints)
		if failedAt < 0 {
			break
		}
		// results[its[failedAt].i] holds that event's failure: it takes its own path (retry or
		// dead letter) without running again in this delivery.
		its = append(its[:failedAt:failedAt], its[failedAt+1:]...)
		ps = append(ps[:failedAt:failedAt], ps[failedAt+1:]...)
	}
}

// processLater processes, in order and each on its own, the deliveries whose key repeated an
// earlier one of the batch: after the batch committed, each is seen as the duplicate it is.
func (c *Consumer[TTx]) processLater(ctx context.Context, msgs []Message, b preparedBatch, settles []func(context.Context, TTx) error, traces []DeliveryTrace) {
	slices.Sort(b.later)
	for _, i := range b.later {
		b.results[i] = c.process(traceAt(ctx, traces, i), msgs[i], settleAt(settles, i))
	}
}

// batchItem is one prepared delivery of a batch: its index and verified message.
type batchItem struct {
	i   int
	msg Message
}

// errBatchAborted stops an optimistic batch attempt at the first failing event.
var errBatchAborted = errors.New("idem: batch attempt aborted by a failing event")

// applyBatch runs one transaction over items: one multi-row claim, then each new event's
// handler (in a savepoint when savepoints is set). It writes each item's result. Without
// savepoints, the first failing event aborts the transaction; with them, the first event whose
// handler ended the transaction (ErrTxEnded) does. applyBatch then writes that event's failure
// and returns its position in items (the others' results are then not final); otherwise it
// returns -1.
//
// When the multi-row claim itself fails (one id the database cannot store, one claim a
// constraint refuses), the transaction rolls back and each event is claimed and applied alone,
// in a transaction of its own: only the unclaimable event fails, with the database's own
// error, and the others proceed. That costs a transaction per event, for this batch only.
func (c *Consumer[TTx]) applyBatch(ctx context.Context, bs idemstore.BatchStore[TTx], items []batchItem, params []idemstore.ClaimParams, results []Result, settles []func(context.Context, TTx) error, traces []DeliveryTrace, savepoints bool) int {
	failedAt, claimErr := c.applyBatchOnce(ctx, bs, items, params, results, settles, traces, savepoints)
	if claimErr == nil {
		return failedAt
	}
	if len(items) == 1 || ctx.Err() != nil {
		for _, it := range items {
			results[it.i] = c.finishResult(ctx, results[it.i], 0, claimErr)
		}
		return -1
	}
	for j := range items {
		c.applyBatch(ctx, bs, items[j:j+1], params[j:j+1], results, settles, traces, savepoints)
	}
	return -1
}

// errClaimBatch carries a failed multi-row claim out of the batch's transaction.
type errClaimBatch struct{ err error }

func (e *errClaimBatch) Error() string { return e.err.Error() }
func (e *errClaimBatch) Unwrap() error { return e.err }

// applyBatchOnce is applyBatch without the fallback: when the multi-row claim fails it writes
// no result and returns the claim's error.
func (c *Consumer[TTx]) applyBatchOnce(ctx context.Context, bs idemstore.BatchStore[TTx], items []batchItem, params []idemstore.ClaimParams, results []Result, settles []func(context.Context, TTx) error, traces []DeliveryTrace, savepoints bool) (int, error) {
	checker, _ := bs.(idemstore.TxEndChecker[TTx])
	statuses := make([]idemstore.ClaimStatus, len(items))
	failed := make([]error, len(items))
	ignored := make([]*IgnoredError, len(items))
	failedAt := -1
	var failure error
	err := c.store.InTx(ctx, func(ctx context.Context, tx TTx) error {
		for j := range failed {
			failed[j], statuses[j], ignored[j] = nil, 0, nil
		}
		crs, err := bs.ClaimBatchTx(ctx, tx, params)
		if err != nil {
			if len(params) == 1 {
				return &errClaimBatch{fmt.Errorf("idem: claim %s: %w", params[0].Key, err)}
			}
			return &errClaimBatch{fmt.Errorf("idem: claim batch of %d: %w", len(params), err)}
		}
		if len(crs) != len(params) {
			return fmt.Errorf("idem: claim batch of %d: store returned %d results", len(params), len(crs))
		}
		for j, it := range items {
			cr := crs[j]
			statuses[j] = cr.Status
			settle := settleAt(settles, it.i)
			apply := func(ctx context.Context, tx TTx) error {
				if err := c.runHandler(traceAt(ctx, traces, it.i), tx, it.msg); err != nil {
					return err
				}
				if settle != nil {
					if err := settle(ctx, tx); err != nil {
						return fmt.Errorf("idem: settle %s in transaction: %w", params[j].Key, err)
					}
				}
				return nil
			}
			// ended aborts the attempt when event j's handler (or settle) ended the transaction.
			ended := func(err error) bool {
				if errors.Is(err, ErrTxEnded) {
					failedAt, failure = j, err
					return true
				}
				if checker != nil && checker.TxEnded(tx) {
					failedAt, failure = j, fmt.Errorf("%w (found after it returned %v)", ErrTxEnded, err)
					if err == nil {
						failure = fmt.Errorf("%w (found after it returned)", ErrTxEnded)
					}
					return true
				}
				return false
			}
			switch cr.Status {
			case idemstore.ClaimNew:
				if !savepoints {
					if err := apply(ctx, tx); err != nil {
						failedAt, failure = j, err
						return errBatchAborted
					}
					if ended(nil) {
						return errBatchAborted
					}
					continue
				}
				if err := bs.SavepointTx(ctx, tx, apply); err != nil {
					if ended(err) {
						return errBatchAborted
					}
					if ig, ok := ignoredOf(err); ok {
						// The savepoint took the handler's effect back; the claim stays, with
						// its audit row, and the delivery settles like a duplicate's.
						if err := c.recordIgnore(ctx, tx, params[j].Key, ig.Reason, params[j].Now); err != nil {
							return err
						}
						ignored[j] = ig
						if settle != nil {
							if err := bs.SavepointTx(ctx, tx, settle); err != nil {
								if ended(err) {
									return errBatchAborted
								}
								failed[j] = err
							}
						}
						continue
					}
					failed[j] = err
					if rerr := bs.ReleaseClaimTx(ctx, tx, params[j].Key); rerr != nil {
						return fmt.Errorf("idem: release claim %s after handler error: %w", params[j].Key, rerr)
					}
				} else if ended(nil) {
					return errBatchAborted
				}
			case idemstore.ClaimDuplicate:
				if settle != nil {
					if !savepoints {
						if err := settle(ctx, tx); err != nil {
							failedAt, failure = j, err
							return errBatchAborted
						}
						continue
					}
					// A duplicate whose lease is gone is simply left to its new owner.
					if err := bs.SavepointTx(ctx, tx, settle); err != nil {
						if ended(err) {
							return errBatchAborted
						}
						failed[j] = err
					}
				}
			case idemstore.ClaimConflict:
				failed[j] = &KeyReuseError{Key: params[j].Key, Claimed: cr.Existing, Received: params[j].Fingerprint}
			default:
				return fmt.Errorf("idem: claim %s: store returned invalid status %d", params[j].Key, cr.Status)
			}
		}
		return nil
	})
	if errors.Is(err, errBatchAborted) {
		// Everything rolled back, the failing event's claim with it.
		it := items[failedAt]
		if ig, ok := ignoredOf(failure); ok && statuses[failedAt] == idemstore.ClaimNew && !errors.Is(failure, ErrTxEnded) {
			// The handler's effect rolled back with the batch; its claim and audit row commit
			// in a transaction of their own.
			results[it.i] = c.commitIgnore(ctx, results[it.i], ig.Reason, params[failedAt].Now, settleAt(settles, it.i))
			return failedAt, nil
		}
		results[it.i] = c.finishResult(ctx, results[it.i], statuses[failedAt], failure)
		return failedAt, nil
	}
	var claimErr *errClaimBatch
	if errors.As(err, &claimErr) {
		return -1, claimErr.err
	}
	for j, it := range items {
		res := results[it.i]
		switch {
		case err != nil:
			// The batch rolled back: nothing of it is applied, each delivery is retried.
			results[it.i] = c.finishResult(ctx, res, 0, err)
		case failed[j] != nil:
			results[it.i] = c.finishResult(ctx, res, statuses[j], failed[j])
		case ignored[j] != nil:
			results[it.i] = ignoredResult(res, ignored[j].Reason)
		default:
			results[it.i] = c.finishResult(ctx, res, statuses[j], nil)
		}
	}
	return -1, nil
}

// traceAt returns ctx carrying the trace of delivery i (ctx itself when not traced).
func traceAt(ctx context.Context, traces []DeliveryTrace, i int) context.Context {
	if traces == nil || traces[i] == nil {
		return ctx
	}
	return traces[i].Context(ctx)
}

func settleAt[TTx any](settles []func(context.Context, TTx) error, i int) func(context.Context, TTx) error {
	if settles == nil {
		return nil
	}
	return settles[i]
}

// errNotBatchStore is returned by NewConsumer when batching is on but the store cannot batch.
var errNotBatchStore = errors.New("Batch.Enabled is set but the store does not implement idemstore.BatchStore")
