package examples_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
)

// PaymentCaptured is the event a payment provider's webhook or a broker delivers.
type PaymentCaptured struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// A "payment captured → mark order paid" consumer. The handler writes its business change in
// the transaction idem opened for the claim, so a redelivered event finds the claim and changes
// nothing, and an event id reused for other content is refused.
func Example_consumer() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)

	db, err := idemsqlite.Open(filepath.Join(dir, "shop.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	store := idemsqlite.New(db)
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	_, _ = db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT NOT NULL, paid_cents INTEGER NOT NULL DEFAULT 0);
		INSERT INTO orders (id, status) VALUES ('order-7', 'pending')`)

	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{
		Name: "orders@v1",
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			var p PaymentCaptured
			if err := json.Unmarshal(msg.Payload, &p); err != nil {
				return idem.Permanent(err)
			}
			res, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid', paid_cents = paid_cents + ?
				WHERE id = ? AND status = 'pending'`, p.AmountCents, p.OrderID)
			if err != nil {
				return err
			}
			return idem.ExpectResult(res, 1)
		},
	})
	if err != nil {
		panic(err)
	}

	msg := idem.Message{
		EventID: "pay_01HV3", Tenant: "shop-eu", Type: "payment.captured",
		Payload: []byte(`{"order_id":"order-7","amount_cents":4200}`),
	}
	r := consumer.Process(ctx, msg)
	fmt.Println("first delivery:", r.Outcome)

	// The broker redelivers after a lost ack, with the keys in another order.
	msg.Payload = []byte(`{"amount_cents":4200, "order_id":"order-7"}`)
	r = consumer.Process(ctx, msg)
	fmt.Println("redelivery:", r.Outcome)

	// A buggy producer reuses the event id for another amount.
	msg.Payload = []byte(`{"order_id":"order-7","amount_cents":9900}`)
	err = consumer.Process(ctx, msg).Err
	fmt.Println("reused id refused:", errors.Is(err, idem.ErrKeyReuse))

	var status string
	var paid int64
	_ = db.QueryRow(`SELECT status, paid_cents FROM orders WHERE id = 'order-7'`).Scan(&status, &paid)
	fmt.Println("order:", status, paid)
	// Output:
	// first delivery: processed
	// redelivery: duplicate
	// reused id refused: true
	// order: paid 4200
}
