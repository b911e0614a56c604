package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/idemnats"
)

const (
	// produceTick is how often the producer catches up with its rate.
	produceTick = 20 * time.Millisecond
	// produceBatchMax bounds the orders of one transaction.
	produceBatchMax = 100
)

// producer writes orders and their events, in one transaction per batch, at the offered rate.
// It keeps no state the database does not have: after a SIGKILL it starts again from the
// highest order index in the orders table, and an error of any kind (a commit whose outcome is
// unknown included) makes it read that index again before going on.
type producer struct {
	a     RoleArgs
	store roleStore
	db    *payments.DB
	plan  *payments.Planner
	stats *stats
	log   *slog.Logger

	// publishIdent publishes a poison identity straight to the broker.
	publishIdent func(ctx context.Context, id, tenant string, order int, payload []byte) error

	// next is the next order index to consider; reuse holds key-reuse orders (below next)
	// waiting until the order whose event id they reuse is applied; unsent the poison
	// identities committed but not yet published.
	next   int
	reuse  []int
	unsent []int
}

func runProducer(ctx context.Context, a RoleArgs, st *stats) error {
	// A producer restarted just before the drain may be stopped while it connects; it must
	// still come up to send the poison identities still unsent (run's flushIdents), so its
	// setup does not end with ctx.
	setupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	store, err := openRoleStore(setupCtx, a, 4)
	if err != nil {
		return fmt.Errorf("chaos: producer: %w", err)
	}
	defer store.close()
	publish, closeBroker, err := identPublisher(a)
	if err != nil {
		return fmt.Errorf("chaos: producer: %w", err)
	}
	defer closeBroker()
	p := &producer{
		a: a, store: store, db: store.db(), stats: st, log: a.Logger, publishIdent: publish,
		plan: payments.NewPlanner(a.Seed, payments.Rates{Duplicates: a.Duplicates, Poison: a.Poison, Idents: a.Poison, Resends: a.Duplicates}),
	}
	if a.Rate <= 0 {
		return fmt.Errorf("chaos: producer: rate is %d, want > 0", a.Rate)
	}
	return p.run(ctx)
}

func (p *producer) run(ctx context.Context) error {
	defer p.flushIdents(ctx)
	failures := 0
	for !p.resync(ctx) {
		failures++
		if !sleepCtx(ctx, backoff(failures)) {
			return nil
		}
	}
	start, produced := time.Now(), 0
	t := time.NewTicker(produceTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		due := int(time.Since(start).Seconds()*float64(p.a.Rate)) - produced
		for due > 0 && ctx.Err() == nil {
			n := min(due, produceBatchMax)
			if err := p.write(ctx, n); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				failures++
				p.log.LogAttrs(ctx, slog.LevelWarn, "chaos: producer: write failed", slog.String("error", err.Error()))
				// The commit may have happened: read the state back before going on.
				for !sleepCtx(ctx, backoff(failures)) || !p.resync(ctx) {
					if ctx.Err() != nil {
						return nil
					}
					failures++
				}
				// Do not make up for the time lost: that would be a burst, not the offered rate.
				start, produced, due = time.Now(), 0, 0
				break
			}
			failures = 0
			produced += n
			due -= n
		}
		p.sendIdents(ctx)
	}
}

// flushIdents runs when the producer is stopped for the drain: it publishes the poison
// identities committed but not sent, or no one ever will. It reads them back from the database
// first, since a producer restarted during an outage may be stopped before it could.
func (p *producer) flushIdents(ctx context.Context) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 8*time.Second)
	defer cancel()
	for failures := 1; !p.resync(fctx); failures++ {
		if !sleepCtx(fctx, backoff(failures)) {
			return
		}
	}
	// A send stops at its first failure (the run may have just cut the broker connection);
	// there is no next tick now, so try again until all are sent or the grace is spent.
	for failures := 1; ; failures++ {
		p.sendIdents(fctx)
		if len(p.unsent) == 0 || !sleepCtx(fctx, backoff(failures)) {
			return
		}
	}
}

// backoff is a capped exponential delay for the n-th failure in a row.
func backoff(n int) time.Duration {
	return min(50*time.Millisecond<<min(n, 6), 2*time.Second)
}

// resync reads the next order index from the database, and which key-reuse orders below it
// are still to be written. It reports false when the database cannot be read.
func (p *producer) resync(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	next, err := p.db.Count(rctx, `SELECT COALESCE(max(id) + 1, 0) FROM {orders} WHERE run_id = ?`, p.a.RunID)
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelWarn, "chaos: producer: read progress", slog.String("error", err.Error()))
		return false
	}
	var want []any
	for i := range next {
		if p.plan.At(i).Poison == payments.PoisonKeyReuse {
			want = append(want, i)
		}
	}
	written := map[int]bool{}
	if len(want) > 0 {
		err := p.db.Rows(rctx, `SELECT id FROM {orders} WHERE run_id = ? AND id IN (`+payments.Placeholders(len(want))+`)`,
			append([]any{p.a.RunID}, want...), func(scan func(...any) error) error {
				var id int64
				if err := scan(&id); err != nil {
					return err
				}
				written[int(id)] = true
				return nil
			})
		if err != nil {
			p.log.LogAttrs(ctx, slog.LevelWarn, "chaos: producer: read key-reuse orders", slog.String("error", err.Error()))
			return false
		}
	}
	p.next, p.reuse = next, p.reuse[:0]
	for _, i := range want {
		if !written[i.(int)] {
			p.reuse = append(p.reuse, i.(int))
		}
	}
	p.unsent = p.unsent[:0]
	err = p.db.Rows(rctx, `SELECT id FROM {orders} WHERE run_id = ? AND NOT sent ORDER BY id`, []any{p.a.RunID}, func(scan func(...any) error) error {
		var id int64
		if err := scan(&id); err != nil {
			return err
		}
		p.unsent = append(p.unsent, int(id))
		return nil
	})
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelWarn, "chaos: producer: read unsent poison identities", slog.String("error", err.Error()))
		return false
	}
	return true
}

// sendIdents publishes the committed poison identities straight to the stream, as a foreign
// producer would, and marks them sent. A message published again after a crash between the
// two is a redelivery of the same message: the broker drops it as a duplicate (it has a
// Nats-Msg-Id of its own) or the consumer dead-letters it into the same dead letter.
func (p *producer) sendIdents(ctx context.Context) {
	for len(p.unsent) > 0 && ctx.Err() == nil {
		i := p.unsent[0]
		o := p.plan.At(i)
		id, tenant := o.Identity(p.a.RunID, p.a.Seed)
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := p.publishIdent(pctx, id, tenant, i, o.Payload())
		if err == nil {
			_, err = p.db.Exec(pctx, `UPDATE {orders} SET sent = true WHERE run_id = ? AND id = ?`, p.a.RunID, i)
		}
		cancel()
		if err != nil {
			p.log.LogAttrs(ctx, slog.LevelWarn, "chaos: producer: send poison identity", slog.Int("order", i), slog.String("error", err.Error()))
			return // the next tick tries again
		}
		p.stats.add("ident_sent", 1)
		p.unsent = p.unsent[1:]
	}
}

// identPublisher returns how the producer publishes a poison identity on the run's broker, and
// what closes its connection.
func identPublisher(a RoleArgs) (func(ctx context.Context, id, tenant string, order int, payload []byte) error, func(), error) {
	if a.BrokerURL != "" {
		b, err := openRoleBroker(a)
		if err != nil {
			return nil, nil, err
		}
		return b.publishRaw, b.close, nil
	}
	js, closeNATS, err := connectJetStream(a.NATSURL, a.Name)
	if err != nil {
		return nil, nil, err
	}
	publish := func(ctx context.Context, id, tenant string, i int, payload []byte) error {
		h := nats.Header{}
		if id != "" {
			h[idemnats.HeaderEventID] = []string{id}
			// Set only with an id: without either header the event id is blank.
			h[jetstream.MsgIDHeader] = []string{"chaos-ident-" + a.RunID + "-" + strconv.Itoa(i)}
		}
		if tenant != "" {
			h[idemnats.HeaderTenant] = []string{tenant}
		}
		h[idemnats.HeaderType] = []string{payments.EventType}
		h[idemnats.HeaderOccurredAt] = []string{time.Now().UTC().Format(time.RFC3339Nano)}
		h[headerOrder] = []string{strconv.Itoa(i)}
		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: a.Subject, Header: h, Data: payload})
		return err
	}
	return publish, closeNATS, nil
}

// write commits the next n order indices in one transaction: the valid orders and the invalid
// ones, each with its event (and a second copy for a duplicate), plus the waiting key-reuse
// orders whose target is applied by now. A key-reuse order is deferred until then, because
// sent earlier the two messages would race and either could be applied. State moves on only
// after the commit.
func (p *producer) write(ctx context.Context, n int) error {
	idxs := make([]int, 0, n)
	reuse := append([]int(nil), p.reuse...)
	for i := p.next; i < p.next+n; i++ {
		if p.plan.At(i).Poison == payments.PoisonKeyReuse {
			reuse = append(reuse, i)
		} else {
			idxs = append(idxs, i)
		}
	}
	var pending []int
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err := p.store.write(wctx, func(wctx context.Context, tx writeTx) error {
		ready, rest, err := p.readyReuse(wctx, tx, reuse)
		if err != nil {
			return err
		}
		pending = rest
		all := append(idxs, ready...)
		if len(all) == 0 {
			return nil
		}
		return p.insert(wctx, tx, all)
	})
	if err != nil {
		return fmt.Errorf("orders %d to %d: %w", p.next, p.next+n-1, err)
	}
	p.stats.add("produced", len(idxs)+len(reuse)-len(pending))
	for _, i := range idxs {
		if payments.IsIdent(p.plan.At(i).Poison) {
			p.unsent = append(p.unsent, i)
		}
	}
	p.next += n
	p.reuse = pending
	return nil
}

// readyReuse splits the key-reuse orders into those whose target has its ledger row and the rest.
func (p *producer) readyReuse(ctx context.Context, tx writeTx, reuse []int) (ready, rest []int, err error) {
	if len(reuse) == 0 {
		return nil, nil, nil
	}
	ids := make([]string, len(reuse))
	args := []any{p.a.RunID}
	for k, i := range reuse {
		ids[k] = p.plan.At(i).EventID(p.a.RunID)
		args = append(args, ids[k])
	}
	applied, err := tx.strings(ctx, `SELECT DISTINCT event_id FROM {ledger} WHERE run_id = ? AND event_id IN (`+payments.Placeholders(len(ids))+`)`, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("look up applied targets: %w", err)
	}
	done := map[string]bool{}
	for _, id := range applied {
		done[id] = true
	}
	for k, i := range reuse {
		if done[ids[k]] {
			ready = append(ready, i)
		} else {
			rest = append(rest, i)
		}
	}
	return ready, rest, nil
}

// insert writes the order rows of idxs and enqueues their events.
func (p *producer) insert(ctx context.Context, tx writeTx, idxs []int) error {
	now := time.Now()
	args := make([]any, 0, 9*len(idxs))
	outs := make([]idem.Outgoing, 0, len(idxs)+len(idxs)/8)
	for _, i := range idxs {
		o := p.plan.At(i)
		id := o.EventID(p.a.RunID)
		if payments.IsIdent(o.Poison) {
			accepted, err := p.edgeAccepts(ctx, tx, o)
			if err != nil {
				return err
			}
			args = append(args, i, p.a.RunID, id, payments.WalletID(o.Wallet), o.Amount, false, o.Poison, false, accepted)
			continue // it goes straight to the stream after the commit (sendIdents)
		}
		args = append(args, i, p.a.RunID, id, payments.WalletID(o.Wallet), o.Amount, o.Valid(), o.Poison, true, false)
		out := idem.Outgoing{
			EventID:    id,
			Topic:      p.a.Subject,
			Key:        payments.WalletID(o.Wallet), // the verdict checks each wallet's order in the stream
			Type:       payments.EventType,
			Payload:    o.Payload(),
			Headers:    map[string]string{headerOrder: strconv.Itoa(i)},
			OccurredAt: now,
		}
		if o.Poison == payments.PoisonKeyReuse {
			// JetStream would drop this message as a republish of the original (same
			// Nats-Msg-Id within the Duplicates window) and no consumer would ever see the
			// reuse: give it a broker message id of its own, as a producer that reuses an id
			// by mistake would have (it does not know the first use).
			out.Headers[idemnats.HeaderBrokerMsgID] = id + "/reuse-" + strconv.Itoa(i)
		}
		outs = append(outs, out)
		if o.Duplicate {
			// The same event again under its own broker message id, so that JetStream's
			// deduplication lets it through and the consumers see a true duplicate.
			out.Headers = map[string]string{headerOrder: strconv.Itoa(i), idemnats.HeaderBrokerMsgID: id + "/dup-" + strconv.Itoa(i)}
			outs = append(outs, out)
		}
		if o.ResendShift != 0 {
			// The same event re-sent with another occurrence time: a new broker message id
			// (the producer believes it is a new publish), the same event id and payload.
			out.Headers = map[string]string{headerOrder: strconv.Itoa(i), idemnats.HeaderBrokerMsgID: id + "/resend-" + strconv.Itoa(i)}
			out.OccurredAt = now.Add(o.ResendShift)
			outs = append(outs, out)
		}
	}
	q := payments.InsertValues("{orders}", []string{"id", "run_id", "event_id", "wallet_id", "amount_cents", "valid", "poison", "sent", "edge_accepted"}, len(idxs))
	if err := tx.exec(ctx, q, args...); err != nil {
		return fmt.Errorf("insert orders: %w", err)
	}
	if len(outs) == 0 {
		return nil
	}
	return tx.enqueue(ctx, outs...)
}

// edgeAccepts offers o's poison identity to the outbox, in a savepoint always rolled back, and
// reports whether the outbox took it (it must not: identities are checked at the edge). For
// id_control it also offers the id with a CR/LF in it, which no NATS header can carry.
func (p *producer) edgeAccepts(ctx context.Context, tx writeTx, o payments.Order) (bool, error) {
	id, tenant := o.Identity(p.a.RunID, p.a.Seed)
	ids := []string{id}
	if o.Poison == payments.IdentControl {
		ids = append(ids, payments.EventID(p.a.RunID, o.Index)+"\r\nIdem-Tenant: evil")
	}
	accepted := false
	for _, id := range ids {
		ok, err := tx.offer(ctx, idem.Outgoing{
			EventID: id, Tenant: tenant, Topic: p.a.Subject, Key: payments.WalletID(o.Wallet), Type: payments.EventType, Payload: o.Payload(),
		})
		if err != nil {
			return false, err
		}
		accepted = accepted || ok
	}
	return accepted, nil
}
