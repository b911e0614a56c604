package examples_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/idemkit/idem"
)

// A handler ignores an event whose target is gone for good: the order was deleted, so there is
// nothing to mark paid, and retrying or dead-lettering would only make work for an operator.
// idem.Ignore rolls back what the handler wrote, keeps the claim (the redelivery is a duplicate)
// and records the reason in the audit trail (idem dlq audit) and in idem_ignored_total.
func Example_ignore() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	db, store, err := openShop(ctx, dir)
	if err != nil {
		panic(err)
	}
	defer db.Close()

	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{
		Name: "orders@v1",
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			var p PaymentCaptured
			if err := json.Unmarshal(msg.Payload, &p); err != nil {
				return idem.Permanent(err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, status) VALUES ('audit-'||?, 'seen')`, p.OrderID); err != nil {
				return err
			}
			var status string
			err := tx.QueryRowContext(ctx, `SELECT status FROM orders WHERE id = ?`, p.OrderID).Scan(&status)
			if errors.Is(err, sql.ErrNoRows) {
				return idem.Ignore("order_deleted") // a small fixed set of reasons: it is a metric label
			}
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, `UPDATE orders SET status = 'paid' WHERE id = ?`, p.OrderID)
			return err
		},
	})
	if err != nil {
		panic(err)
	}
	msg := idem.Message{EventID: "pay_01HV9", Tenant: "shop-eu", Type: "payment.captured",
		Payload: []byte(`{"order_id":"order-404","amount_cents":100}`)}

	r := consumer.Process(ctx, msg)
	err = r.Err
	fmt.Println(r.Outcome, r.Reason, err)
	var n int
	_ = db.QueryRowContext(ctx, `SELECT count(*) FROM orders WHERE id = 'audit-order-404'`).Scan(&n)
	fmt.Println("rows the handler wrote that committed:", n)
	r = consumer.Process(ctx, msg)
	fmt.Println("redelivery:", r.Outcome)
	audit, _ := store.ListAudit(ctx, 1)
	fmt.Println("audit:", audit[0].Action, audit[0].Actor, audit[0].EventID, audit[0].Reason)
	// Output:
	// ignored order_deleted <nil>
	// rows the handler wrote that committed: 0
	// redelivery: duplicate
	// audit: ignore orders@v1 pay_01HV9 order_deleted
}
