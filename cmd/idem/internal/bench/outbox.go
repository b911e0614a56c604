package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
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
		return Result{}, fmt.Errorf("outbox_e2e: connect to %s: %w", idem.RedactURL(e.opts.NATSURL), err)
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

	relay, err := idemrelay.New(e.store, e.store, idemnats.NewSink(js), idemrelay.Config{
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
