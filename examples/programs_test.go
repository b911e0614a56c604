package examples_test

import (
	"context"
	"database/sql"
	"encoding/json"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemsqlite"
)

// The three programs README's "Use it" shows, compiled here so that the README cannot drift
// from the API (TestREADMEShowsThePrograms compares them) and run by TestPrograms and
// Example_sqliteQueue.

// consumeLedger applies each payment from NATS JetStream to PostgreSQL once.
func consumeLedger(ctx context.Context, store *idempg.Store, js jetstream.JetStream) error {
	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[pgx.Tx]{
		Name:  "ledger@v1", // the effect version: bump it to re-apply on purpose
		Owner: "payments",  // dead letters and alerts name who is paged
		// A payload that does not decode is an invalid_payload dead letter, never retried.
		Handler: idem.JSONHandler(func(ctx context.Context, tx pgx.Tx, _ idem.Message, p PaymentCaptured) error {
			tag, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid', paid_cents = $2
				WHERE id = $1 AND status = 'pending'`, p.OrderID, p.AmountCents)
			if err != nil {
				return err // a lost connection is retried, a constraint violation is not
			}
			return idem.ExpectRows(tag.RowsAffected(), 1) // an unmet precondition rolls back
		}),
	})
	if err != nil {
		return err
	}
	src, err := idemnats.NewSource(ctx, js, idemnats.SourceConfig{Stream: "PAYMENTS", Durable: "ledger"})
	if err != nil {
		return err
	}
	defer src.Close()
	return consumer.Run(ctx, src) // workers, retries, dead letters, leases, claim cleanup
}

// capturePayment records a payment and its event in one transaction (the outbox).
func capturePayment(ctx context.Context, store *idempg.Store, orderID string, cents int64) error {
	payload, err := json.Marshal(PaymentCaptured{OrderID: orderID, AmountCents: cents})
	if err != nil {
		return err
	}
	return store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, orderID, cents); err != nil {
			return err
		}
		return store.EnqueueTx(ctx, tx, idem.Outgoing{
			EventID: "payment-" + orderID, // stable: a retry of this transaction is the same event
			Topic:   "payments.captured", Key: orderID, Type: "payment.captured", Payload: payload,
		})
	})
}

// relayPayments publishes what capturePayment committed, each key's events in commit order;
// relays in several processes share the work through leases in the database.
func relayPayments(ctx context.Context, store *idempg.Store, js jetstream.JetStream) error {
	relay, err := idemrelay.New(store, idemnats.NewSink(js), idemrelay.Config{})
	if err != nil {
		return err
	}
	return relay.Run(ctx)
}

// runShop is the embedded default: one SQLite file holds the orders, the claims and the queue
// table, and nothing else runs. A producer publishes with store.QueuePublishTx in its own
// transaction; the consumer acks each job in the transaction that holds its claim.
func runShop(ctx context.Context, path string) error {
	db, err := idemsqlite.Open(path) // WAL, busy timeout and one writer, set for you
	if err != nil {
		return err
	}
	defer db.Close()
	store := idemsqlite.New(db)
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{
		Name: "orders@v1",
		Handler: idem.JSONHandler(func(ctx context.Context, tx *sql.Tx, _ idem.Message, p PaymentCaptured) error {
			res, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid', paid_cents = ?
				WHERE id = ? AND status = 'pending'`, p.AmountCents, p.OrderID)
			if err != nil {
				return err
			}
			return idem.ExpectResult(res, 1)
		}),
	})
	if err != nil {
		return err
	}
	src, err := idemqueue.NewSource(store, idemqueue.SourceConfig{Queue: "payments"})
	if err != nil {
		return err
	}
	defer src.Close()
	return consumer.Run(ctx, src)
}
