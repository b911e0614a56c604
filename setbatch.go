package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/idemkit/idem/idemstore"
)

// SetHandler applies the effects of a batch's new events at once, inside tx, the transaction
// that also holds their claims: msgs are the events that were claimed for the first time (never
// a duplicate, never a key reuse), in delivery order, so the handler can write its effect as
// one multi-row statement instead of one per event. Returning an error (or panicking) rolls the
// set back; the consumer then applies the same events one by one through the per-event
// Handler, so that one bad event never sinks the others (an Ignore from a set of many is
// decided the same way, event by event). HandlerTimeout bounds the set's one call. The handler
// must not keep msgs after it returns.
type SetHandler[TTx any] func(ctx context.Context, tx TTx, msgs []Message) error

// ProcessSet runs deliveries through the set-based path: the checks of Process for each, then
// one transaction with one multi-row claim, one call of ConsumerConfig.SetHandler with every
// newly claimed event, and one commit. Duplicates and key reuse are decided per event by the
// claim, as on every other path. It returns one result per message, in order.
//
// When the set fails (the set handler returns an error or panics, it ends the transaction, or
// the multi-row claim or the commit fails), the transaction rolls back and the same events run
// through ProcessBatch's path with the per-event Handler: each event then meets its own fate,
// and a poison event takes the retry or dead-letter path it would take alone. A message whose key
// already appears earlier in the same batch is processed after the set commits, on its own.
//
// Without a SetHandler, or on a store that is not a BatchStore, ProcessSet is ProcessBatch.
func (c *Consumer[TTx]) ProcessSet(ctx context.Context, msgs []Message) []Result {
	return c.processSet(ctx, msgs, nil, nil)
}

// processSet is ProcessSet with in-transaction settle hooks and, when traced, each delivery's
// trace: the set handler runs under ctx (the batch's), a fallback's handlers under their own.
func (c *Consumer[TTx]) processSet(ctx context.Context, msgs []Message, settles []func(context.Context, TTx) error, traces []DeliveryTrace) []Result {
	bs := c.batchStore
	if bs == nil || c.cfg.SetHandler == nil {
		return c.processBatch(ctx, msgs, settles, traces)
	}
	b := c.prepareBatch(ctx, msgs)
	if len(b.items) > 0 {
		if err := c.applySet(ctx, bs, b.items, b.params, b.results, settles); err != nil {
			var one *errSetOfOne
			switch {
			case errors.As(err, &one):
				// The set was one event: its failure is that event's own, and running its
				// handler again would only repeat it. The rest (duplicates, key reuse) go on.
				it := b.items[one.j]
				if ig, ok := ignoredOf(one.err); ok && !errors.Is(one.err, ErrTxEnded) {
					// Its effect rolled back with the set; its claim and audit row commit alone.
					b.results[it.i] = c.commitIgnore(ctx, b.results[it.i], ig.Reason, b.params[one.j].Now, settleAt(settles, it.i))
				} else {
					b.results[it.i] = c.finishResult(ctx, b.results[it.i], idemstore.ClaimNew, one.err)
				}
				its := append(b.items[:one.j:one.j], b.items[one.j+1:]...)
				ps := append(b.params[:one.j:one.j], b.params[one.j+1:]...)
				c.applyEach(ctx, bs, its, ps, b.results, settles, traces)
			case ctx.Err() != nil:
				// Nothing is applied and nothing more can be: each delivery is retried.
				for _, it := range b.items {
					b.results[it.i] = c.finishResult(ctx, b.results[it.i], 0, err)
				}
			default:
				c.cfg.Observe.Logger.LogAttrs(ctx, slog.LevelDebug, "idem: set failed, applying its events one by one",
					slog.String("consumer", c.cfg.Name), slog.Int("events", len(b.items)),
					slog.String("error", c.redactor.Text(err.Error())))
				c.applyEach(ctx, bs, b.items, b.params, b.results, settles, traces)
			}
		}
	}
	c.processLater(ctx, msgs, b, settles, traces)
	return b.results
}

// applySet runs one transaction over items: one multi-row claim, one call of the set handler
// with the newly claimed events, the in-transaction settles, and the commit. On success it
// writes each item's result and returns nil; on any failure everything rolled back, it writes
// no result and returns the error.
func (c *Consumer[TTx]) applySet(ctx context.Context, bs idemstore.BatchStore[TTx], items []batchItem, params []idemstore.ClaimParams, results []Result, settles []func(context.Context, TTx) error) error {
	checker, _ := bs.(idemstore.TxEndChecker[TTx])
	var claims []idemstore.ClaimResult
	set := make([]Message, 0, len(items))
	err := c.store.InTx(ctx, func(ctx context.Context, tx TTx) error {
		set, claims = set[:0], nil
		crs, err := bs.ClaimBatchTx(ctx, tx, params)
		if err != nil {
			return fmt.Errorf("idem: claim set of %d: %w", len(params), err)
		}
		if len(crs) != len(params) {
			return fmt.Errorf("idem: claim set of %d: store returned %d results", len(params), len(crs))
		}
		for j, cr := range crs {
			switch cr.Status {
			case idemstore.ClaimNew:
				set = append(set, items[j].msg)
			case idemstore.ClaimDuplicate, idemstore.ClaimConflict:
			default:
				return fmt.Errorf("idem: claim %s: store returned invalid status %d", params[j].Key, cr.Status)
			}
		}
		claims = crs
		if len(set) > 0 {
			err := c.runSetHandler(ctx, tx, set)
			if err == nil && checker != nil && checker.TxEnded(tx) {
				err = fmt.Errorf("%w (found after the set handler returned)", ErrTxEnded)
			}
			if err != nil && len(set) == 1 {
				for j, cr := range crs {
					if cr.Status == idemstore.ClaimNew {
						return &errSetOfOne{j: j, err: err}
					}
				}
			}
			if err != nil {
				return err
			}
		}
		for j, it := range items {
			settle := settleAt(settles, it.i)
			if settle == nil || crs[j].Status == idemstore.ClaimConflict {
				continue
			}
			if err := settle(ctx, tx); err != nil {
				return fmt.Errorf("idem: settle %s in transaction: %w", params[j].Key, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for j, it := range items {
		var failure error
		if cr := claims[j]; cr.Status == idemstore.ClaimConflict {
			failure = &KeyReuseError{Key: params[j].Key, Claimed: cr.Existing, Received: params[j].Fingerprint}
		}
		results[it.i] = c.finishResult(ctx, results[it.i], claims[j].Status, failure)
	}
	return nil
}

// errSetOfOne carries, out of the rolled-back transaction, the failure of a set that held one
// new event: items[j]'s.
type errSetOfOne struct {
	j   int
	err error
}

func (e *errSetOfOne) Error() string { return e.err.Error() }
func (e *errSetOfOne) Unwrap() error { return e.err }

// runSetHandler calls the set handler, turning a panic into a *panicError so the transaction
// rolls back.
func (c *Consumer[TTx]) runSetHandler(ctx context.Context, tx TTx, msgs []Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: debug.Stack()}
		}
	}()
	// HandlerTimeout bounds the set's one call as it bounds one event's.
	return c.bounded(ctx, func(ctx context.Context) error { return c.cfg.SetHandler(ctx, tx, msgs) })
}

// setOfOne adapts a SetHandler to the per-event Handler that a consumer with only a set handler
// uses on its per-event path and when a set falls back event by event.
func setOfOne[TTx any](h SetHandler[TTx]) Handler[TTx] {
	return func(ctx context.Context, tx TTx, msg Message) error {
		return h(ctx, tx, []Message{msg})
	}
}
