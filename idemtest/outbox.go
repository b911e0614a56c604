package idemtest

import (
	"context"
	"slices"
	"sync"

	"github.com/idemkit/idem"
)

// Enqueuer is the outbox's transactional write as a handler uses it; idemstore.OutboxStore (idempg,
// idemsqlite) satisfies it. A handler that takes an Enqueuer rather than the concrete store can
// be tested with an Outbox.
type Enqueuer[TTx any] interface {
	EnqueueTx(ctx context.Context, tx TTx, msgs ...idem.Outgoing) error
}

// Outbox is an Enqueuer that records what was enqueued in each transaction and then passes it
// on to Next (when set), so a test asserts what a handler enqueued in its transaction, rolled
// back or not. It is safe for concurrent use.
type Outbox[TTx comparable] struct {
	// Next receives every enqueue after it is recorded (nil: record only).
	Next Enqueuer[TTx]

	mu   sync.Mutex
	byTx map[TTx][]idem.Outgoing
}

var _ Enqueuer[*struct{}] = (*Outbox[*struct{}])(nil)

// EnqueueTx records msgs under tx, then calls Next; an error of Next is returned and the
// messages stay unrecorded, as they would not be in the outbox.
func (o *Outbox[TTx]) EnqueueTx(ctx context.Context, tx TTx, msgs ...idem.Outgoing) error {
	if o.Next != nil {
		if err := o.Next.EnqueueTx(ctx, tx, msgs...); err != nil {
			return err
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.byTx == nil {
		o.byTx = map[TTx][]idem.Outgoing{}
	}
	for _, m := range msgs {
		c := m
		c.Payload = slices.Clone(m.Payload)
		o.byTx[tx] = append(o.byTx[tx], c)
	}
	return nil
}

// Enqueued returns what was enqueued in tx, in order.
func (o *Outbox[TTx]) Enqueued(tx TTx) []idem.Outgoing {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.byTx[tx])
}
