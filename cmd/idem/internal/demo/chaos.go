package demo

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
)

// chaosSink wraps the relay's sink: after a batch is published, it publishes the messages of
// orders planned as duplicates a second time, with the same event id — what a relay that
// crashed between publishing and marking, or a producer retrying, would do. When reuse is set,
// it sends key-reuse messages through it, past the broker's own deduplication.
type chaosSink struct {
	idem.Sink
	plan      []payments.Order
	runPrefix string
	reuse     func(ctx context.Context, topic string, msgs []idem.Message) error
	// again publishes the copies and reports how many it sent and how many of those the broker
	// dropped as duplicates of a message it already holds.
	again func(ctx context.Context, topic string, msgs []idem.Message) (sent, dropped int, err error)
	log   *slog.Logger

	mu   sync.Mutex
	done map[int]bool // orders duplicated already (the relay may itself publish a row twice)

	injected, dropped atomic.Int64
}

func (s *chaosSink) Publish(ctx context.Context, topic string, batch ...idem.Message) error {
	msgs := batch
	if s.reuse != nil {
		var plain, reused []idem.Message
		for _, m := range batch {
			if i := s.order(m); i >= 0 && s.plan[i].Poison == payments.PoisonKeyReuse {
				reused = append(reused, m)
			} else {
				plain = append(plain, m)
			}
		}
		if len(reused) > 0 {
			if err := s.reuse(ctx, topic, reused); err != nil {
				return err
			}
			msgs = plain
		}
	}
	if len(msgs) > 0 {
		if err := s.Sink.Publish(ctx, topic, msgs...); err != nil {
			return err
		}
	}
	var copies []idem.Message
	s.mu.Lock()
	for _, m := range batch {
		if i := s.order(m); i >= 0 && s.plan[i].Duplicate && !s.done[i] {
			s.done[i] = true
			copies = append(copies, m)
		}
	}
	s.mu.Unlock()
	if len(copies) == 0 {
		return nil
	}
	sent, dropped, err := s.again(ctx, topic, copies)
	s.injected.Add(int64(sent))
	s.dropped.Add(int64(dropped))
	if err != nil {
		// The originals are published: failing here would only make the relay publish them
		// again. The copies that failed are simply not injected.
		s.log.LogAttrs(ctx, slog.LevelWarn, "demo: publishing injected duplicates failed",
			slog.Int("copies", len(copies)), slog.Int("sent", sent), slog.String("error", err.Error()))
	}
	return nil
}

// order returns the index of the run's order m carries, or -1. The relay of another run
// sharing the database may publish that run's rows through this sink.
func (s *chaosSink) order(m idem.Message) int {
	if !strings.HasPrefix(m.EventID, s.runPrefix) {
		return -1
	}
	return orderOf(m.Headers, len(s.plan))
}

// losingAckSource wraps the consumer's source: for orders planned to crash, the first ack
// after a commit never reaches the broker, as when a consumer dies between commit and ack, so
// the broker redelivers after the lease. The wrapped deliveries hide idem.TxAcker, so that the
// queue table's ack happens after the commit rather than inside it; all other deliveries go
// through untouched and keep the library's own path.
type losingAckSource struct {
	idem.Source
	plan []payments.Order
	lost []atomic.Bool
	n    atomic.Int64
}

func newLosingAckSource(src idem.Source, plan []payments.Order) *losingAckSource {
	return &losingAckSource{Source: src, plan: plan, lost: make([]atomic.Bool, len(plan))}
}

func (s *losingAckSource) Receive(ctx context.Context, max int) ([]idem.Delivery, error) {
	ds, err := s.Source.Receive(ctx, max)
	for i, d := range ds {
		if o := orderOf(d.Message().Headers, len(s.plan)); o >= 0 && s.plan[o].Crash && !s.lost[o].Load() {
			ds[i] = &losingAck{Delivery: d, src: s, order: o}
		}
	}
	return ds, err
}

type losingAck struct {
	idem.Delivery
	src   *losingAckSource
	order int
}

func (d *losingAck) Ack(ctx context.Context) error {
	if d.src.lost[d.order].CompareAndSwap(false, true) {
		d.src.n.Add(1)
		return nil // committed, but the broker never hears of it
	}
	return d.Delivery.Ack(ctx)
}

// flaky wraps the handler: orders planned as transient fail their first attempts with
// idem.Transient, as a payment provider answering 503 would, and succeed on a later one. It
// marks the orders it failed in failed.
func flaky[TTx any](plan []payments.Order, failed []atomic.Bool, h idem.Handler[TTx]) idem.Handler[TTx] {
	return func(ctx context.Context, tx TTx, msg idem.Message) error {
		if i := orderOf(msg.Headers, len(plan)); i >= 0 && msg.Attempt <= plan[i].Transient {
			failed[i].Store(true)
			return idem.Transient(fmt.Errorf("payment provider unavailable (injected failure %d of %d)", msg.Attempt, plan[i].Transient))
		}
		return h(ctx, tx, msg)
	}
}
