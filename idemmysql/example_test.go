package idemmysql_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"

	_ "github.com/go-sql-driver/mysql" // the driver idemmysql is built on

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// A "payment captured → mark order paid" consumer on MySQL or MariaDB, and the producer side
// that enqueues an event in the same transaction as its business write. It needs a server, so
// it is compiled, not run.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	// READ COMMITTED takes no gap locks, so concurrent handlers deadlock less; REPEATABLE READ
	// (the server's default) is as correct.
	store, err := idemmysql.NewWithConfig(db, idemmysql.Config{Isolation: sql.LevelReadCommitted})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{
		Name: "orders@v1",
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			var p struct {
				OrderID     string `json:"order_id"`
				AmountCents int64  `json:"amount_cents"`
			}
			if err := json.Unmarshal(msg.Payload, &p); err != nil {
				return idem.Permanent(err)
			}
			res, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid', paid_cents = paid_cents + ?
				WHERE id = ? AND status = 'pending'`, p.AmountCents, p.OrderID)
			if err != nil {
				return err // a deadlock (1213) or lock wait timeout (1205) is retried
			}
			return idem.ExpectResult(res, 1)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	r := consumer.Process(ctx, idem.Message{EventID: "pay_01HV3", Tenant: "shop-eu", Type: "payment.captured",
		Payload: []byte(`{"order_id":"order-7","amount_cents":4200}`)})
	err = r.Err
	fmt.Println(r.Outcome, err)

	// Producer side: the outgoing event commits or rolls back with the business write.
	err = store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'shipped' WHERE id = ?`, "order-7"); err != nil {
			return err
		}
		return store.EnqueueTx(ctx, tx, idem.Outgoing{EventID: "ship_01HV4", Tenant: "shop-eu",
			Topic: "orders.shipped", Key: "order-7", Payload: []byte(`{"order_id":"order-7"}`)})
	})
	fmt.Println(err)
}
