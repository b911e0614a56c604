package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/idemrelay"
)

// outboxE2E offers events at a fixed rate through the whole producer path — business write and
// outbox row in one transaction, the relay publishing to JetStream, a consumer with 8 workers —
// and measures the latency from producer commit to consumer commit.
func (e *env) outboxE2E(ctx context.Context, rate int, seconds float64) (Result, error) {
	if e.opts.NATSURL == "" {
		return Result{}, fmt.Errorf("outbox_e2e needs NATS")
	}
	nc, err := nats.Connect(e.opts.NATSURL)
	if err != nil {
		return Result{}, fmt.Errorf("outbox_e2e: connect to %s: %w", idemredact.URL(e.opts.NATSURL), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return Result{}, err
	}
	id := randHex(4)
	stream, subject := "IDEMBENCHOB_"+strings.ToUpper(id), "idembenchob."+id
	if _, err := idemnats.EnsureStream(ctx, js, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}, Storage: jetstream.FileStorage, MaxAge: time.Hour}); err != nil { // bounded: Run refuses an unbounded redelivery window
		return Result{}, err
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), stream) }()

	relay, err := idemrelay.New(e.store, idemnats.NewSink(js), idemrelay.Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Topic:  func(idem.Outgoing) string { return subject },
	})
	if err != nil {
		return Result{}, err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	defer func() { stopRelay(); <-relayDone }()

	src, err := idemnats.NewSource(ctx, js, idemnats.SourceConfig{Stream: stream, Durable: "bench", MaxWait: time.Second})
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = src.Close() }()

	n := int(float64(rate) * seconds)
	e.pace = time.Second / time.Duration(rate)
	defer func() { e.pace = 0 }()
	r, err := e.pipeline(ctx, "outbox_e2e", 8, 0, src, func(ctx context.Context, msgs []idem.Message) error {
		for _, m := range msgs {
			err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO `+e.schema+`.ledger (event_id, wallet, amount) VALUES ($1, -1, 0)`, "order-"+m.EventID); err != nil {
					return err
				}
				return e.store.EnqueueTx(ctx, tx, idem.Outgoing{EventID: m.EventID, Tenant: m.Tenant, Topic: "payments", Key: m.EventID, Type: m.Type, Payload: m.Payload, OccurredAt: time.Now()})
			})
			if err != nil {
				return err
			}
		}
		return nil
	}, n)
	r.Batch = 0
	return r, err
}

// relayCount is an idemrelay.Observer that counts published rows and says when want were.
type relayCount struct {
	n    atomic.Int64
	want int64
	once sync.Once
	done chan struct{}
}

func (c *relayCount) Published(_ string, n int, _ time.Duration) {
	if c.n.Add(int64(n)) >= c.want {
		c.once.Do(func() { close(c.done) })
	}
}

func (c *relayCount) PublishFailed(string, idem.Class, bool) {}

// relayStream opens a connection to NATS and a fresh stream for the relay cases; release
// deletes the stream and closes the connection.
func (e *env) relayStream(ctx context.Context, name string) (js jetstream.JetStream, subject string, release func(), err error) {
	nc, err := nats.Connect(e.opts.NATSURL)
	if err != nil {
		return nil, "", nil, fmt.Errorf("%s: connect to %s: %w", name, idemredact.URL(e.opts.NATSURL), err)
	}
	if js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, "", nil, err
	}
	id := randHex(4)
	stream := "IDEMBENCHRL_" + strings.ToUpper(id)
	subject = "idembenchrl." + id
	if _, err := idemnats.EnsureStream(ctx, js, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}, Storage: jetstream.FileStorage, MaxAge: time.Hour}); err != nil {
		nc.Close()
		return nil, "", nil, err
	}
	return js, subject, func() { _ = js.DeleteStream(context.WithoutCancel(ctx), stream); nc.Close() }, nil
}

// enqueue adds n fresh rows to the outbox in one producer transaction, each row its own
// ordering key, and returns when it committed: a relay case's clock starts then.
func (e *env) enqueue(ctx context.Context, n int) (time.Time, error) {
	msgs := e.messages(n)
	now := time.Now()
	out := make([]idem.Outgoing, n)
	for i, m := range msgs {
		out[i] = idem.Outgoing{EventID: m.EventID, Tenant: m.Tenant, Topic: "payments", Key: m.EventID, Type: m.Type, Payload: m.Payload, OccurredAt: now}
	}
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return e.store.EnqueueTx(ctx, tx, out...) }); err != nil {
		return time.Time{}, fmt.Errorf("enqueue %d outbox rows: %w", n, err)
	}
	return time.Now(), nil
}

// relay measures idemrelay.Relay draining a backlog of Events outbox rows to JetStream
// (idemnats.Sink): the relay runs first on the empty outbox (so that it holds its partition
// leases, a cost of its start, not of its loop), then the rows are enqueued in one transaction,
// and the clock runs from that commit to the last row marked published.
func (e *env) relay(ctx context.Context) (Result, error) {
	if e.opts.NATSURL == "" {
		return Result{}, fmt.Errorf("relay needs NATS")
	}
	js, subject, release, err := e.relayStream(ctx, "relay")
	if err != nil {
		return Result{}, err
	}
	defer release()
	n := e.opts.Events
	count := &relayCount{want: int64(n), done: make(chan struct{})}
	r, err := idemrelay.New(e.store, idemnats.NewSink(js), idemrelay.Config{
		ID:       "bench-" + randHex(4),
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Topic:    func(idem.Outgoing) string { return subject },
		Observer: count,
	})
	if err != nil {
		return Result{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	for len(r.Partitions()) < e.store.OutboxPartitions() {
		select {
		case err := <-done:
			return Result{}, fmt.Errorf("relay: stopped before it held its partitions: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	start, err := e.enqueue(ctx, n)
	if err != nil {
		return Result{}, fmt.Errorf("relay: %w", err)
	}
	select {
	case <-count.done:
	case err := <-done:
		return Result{}, fmt.Errorf("relay: stopped after %d of %d rows: %v", count.n.Load(), n, err)
	case <-time.After(5 * time.Minute):
		return Result{}, fmt.Errorf("relay: %d of %d rows published after 5 minutes", count.n.Load(), n)
	}
	d := time.Since(start)
	stop()
	<-done
	return result("relay", 1, idemrelay.BatchSizeDefault, n, d), nil
}

// relayCeiling is the relay's loop written directly against the same outbox table and sink: per
// round one SELECT of the next BatchSizeDefault unpublished rows (the relay's index, every
// partition), one Publish of them, one UPDATE marking them published (committed without waiting
// for its flush, as idempg's) — no leases, keys, retries or dead rows. Its clock, like relay's, runs from the commit of the backlog.
func (e *env) relayCeiling(ctx context.Context) (Result, error) {
	if e.opts.NATSURL == "" {
		return Result{}, fmt.Errorf("relay_ceiling needs NATS")
	}
	js, subject, release, err := e.relayStream(ctx, "relay_ceiling")
	if err != nil {
		return Result{}, err
	}
	defer release()
	n := e.opts.Events
	sink := idemnats.NewSink(js)
	parts := make([]int32, e.store.OutboxPartitions())
	for i := range parts {
		parts[i] = int32(i)
	}
	fetch := `SELECT id, event_id, tenant, topic, ordering_key, type, payload, occurred_at FROM ` + e.schema + `.idem_outbox
		WHERE partition = ANY ($1) AND published_at IS NULL AND NOT dead ORDER BY id LIMIT $2`
	mark := `UPDATE ` + e.schema + `.idem_outbox SET published_at = $2
		FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async WHERE id = ANY ($1)`
	published := 0
	start, err := e.enqueue(ctx, n)
	if err != nil {
		return Result{}, fmt.Errorf("relay_ceiling: %w", err)
	}
	for published < n {
		rows, err := e.pool.Query(ctx, fetch, parts, idemrelay.BatchSizeDefault)
		if err != nil {
			return Result{}, fmt.Errorf("relay_ceiling: fetch: %w", err)
		}
		var ids []int64
		var msgs []idem.Message
		for rows.Next() {
			var id int64
			var o idem.Outgoing
			if err := rows.Scan(&id, &o.EventID, &o.Tenant, &o.Topic, &o.Key, &o.Type, &o.Payload, &o.OccurredAt); err != nil {
				rows.Close()
				return Result{}, fmt.Errorf("relay_ceiling: fetch: %w", err)
			}
			ids, msgs = append(ids, id), append(msgs, o.Message())
		}
		if err := rows.Err(); err != nil {
			return Result{}, fmt.Errorf("relay_ceiling: fetch: %w", err)
		}
		if len(ids) == 0 {
			return Result{}, fmt.Errorf("relay_ceiling: %d of %d rows left the outbox", published, n)
		}
		if err := sink.Publish(ctx, subject, msgs...); err != nil {
			return Result{}, fmt.Errorf("relay_ceiling: publish: %w", err)
		}
		if _, err := e.pool.Exec(ctx, mark, ids, time.Now()); err != nil {
			return Result{}, fmt.Errorf("relay_ceiling: mark: %w", err)
		}
		published += len(ids)
	}
	return result("relay_ceiling", 1, idemrelay.BatchSizeDefault, n, time.Since(start)), nil
}
