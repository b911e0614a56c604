package chaos

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/cmd/idem/internal/payments"
)

// headerOrder carries the order index on every message of the scenario (originals, copies,
// re-sends and the poison messages), so that the stream and the dead letters can be matched
// with the orders table whatever the event id is.
const headerOrder = payments.HeaderOrder

// qApplyInversions: ledger rows applied after a later order of their wallet (by ledger id,
// the commit order of the consumers' transactions). The consumers run many deliveries at
// once and retry failures later, so this is information, not a violation: idem orders the
// relay's publishes per key, not the consumers' applications.
const qApplyInversions = `SELECT count(*) FROM (
		SELECT o.id, max(o.id) OVER (PARTITION BY l.wallet_id ORDER BY l.id
			ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
		FROM {ledger} l JOIN {orders} o ON o.run_id = l.run_id AND o.event_id = l.event_id AND o.valid
		WHERE l.run_id = ?) AS x
	WHERE x.id < x.prev`

// streamFirstSeqs reads the whole stream and returns, for each order index, the stream
// sequence of the first message that carried it.
func streamFirstSeqs(ctx context.Context, js jetstream.JetStream, stream string) (map[int]uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", stream, err)
	}
	last := info.State.LastSeq
	first := map[int]uint64{}
	if info.State.Msgs == 0 {
		return first, nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", stream, err)
	}
	for {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read stream %s: %w", stream, err)
		}
		n := 0
		var seq uint64
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("read stream %s: %w", stream, err)
			}
			seq = md.Sequence.Stream
			if i, err := strconv.Atoi(m.Headers().Get(headerOrder)); err == nil {
				if _, seen := first[i]; !seen {
					first[i] = seq
				}
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("read stream %s: %w", stream, err)
		}
		if seq >= last {
			return first, nil
		}
		if n == 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("read stream %s: stopped at sequence %d of %d: %w", stream, seq, last, err)
			}
		}
	}
}

// walletOrder is one valid order: its index (its commit order within its wallet, since one
// producer writes the indices in order) and its wallet.
type walletOrder struct {
	index  int
	wallet string
}

// validOrders returns the run's valid orders by index.
func validOrders(ctx context.Context, db *payments.DB, runID string) ([]walletOrder, error) {
	var out []walletOrder
	err := db.Rows(ctx, `SELECT id, wallet_id FROM {orders} WHERE run_id = ? AND valid ORDER BY id`, []any{runID}, func(scan func(...any) error) error {
		var o walletOrder
		var id int64
		if err := scan(&id, &o.wallet); err != nil {
			return err
		}
		o.index = int(id)
		out = append(out, o)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read valid orders: %w", err)
	}
	return out, nil
}

// streamOrderViolations counts the orders that reached the stream after a later order of
// their wallet: order a of wallet w is a violation when some order b > a of w was first in
// the stream before a's first message. orders must be sorted by index; orders missing from
// first (never published: counted as unpublished elsewhere) are skipped.
func streamOrderViolations(orders []walletOrder, first map[int]uint64) int {
	laterMin := map[string]uint64{} // smallest first sequence of the wallet's later orders
	n := 0
	for k := len(orders) - 1; k >= 0; k-- {
		o := orders[k]
		seq, ok := first[o.index]
		if !ok {
			continue
		}
		if m, seen := laterMin[o.wallet]; seen && m < seq {
			n++
		}
		if m, seen := laterMin[o.wallet]; !seen || seq < m {
			laterMin[o.wallet] = seq
		}
	}
	return n
}

// checkOrder fills r's order counts: from the stream, the valid orders that reached it after
// a later order of their wallet (a violation each); from the ledger, the apply-order
// inversions (information).
func checkOrder(ctx context.Context, db *payments.DB, firstSeqs func(context.Context) (map[int]uint64, error), runID string, r *Report) error {
	first, err := firstSeqs(ctx)
	if errors.Is(err, errNoReadback) {
		r.Notes = append(r.Notes, "per-key order not checked: "+err.Error())
		r.OrderNotChecked = true
		first = map[int]uint64{}
	} else if err != nil {
		return fmt.Errorf("check run %s: %w", runID, err)
	}
	orders, err := validOrders(ctx, db, runID)
	if err != nil {
		return fmt.Errorf("check run %s: %w", runID, err)
	}
	r.OrderViolations = streamOrderViolations(orders, first)
	if r.ApplyOrderInversions, err = db.Count(ctx, qApplyInversions, runID); err != nil {
		return fmt.Errorf("check run %s: count apply-order inversions: %w", runID, err)
	}
	if r.OrderViolations > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("%d valid orders reached the stream after a later order of their wallet (per-key order broken)", r.OrderViolations))
	}
	return nil
}
