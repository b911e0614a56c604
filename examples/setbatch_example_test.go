package examples_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
)

// A set-based consumer: the SetHandler receives every new event of a batch at once, in the
// transaction that holds their claims, and writes them all with one statement. Duplicates and
// reused ids are sorted out per event before it runs; if the statement fails, the consumer
// applies the events one by one with a set of one each, so one bad event fails alone.
func Example_setBatch() {
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
	_, _ = db.Exec(`CREATE TABLE payments (event_id TEXT PRIMARY KEY, order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL)`)

	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{
		Name:  "payments@v1",
		Batch: idem.BatchConfig{Enabled: true, Size: 500}, // Run hands each batch to SetHandler
		SetHandler: func(ctx context.Context, tx *sql.Tx, msgs []idem.Message) error {
			rows := make([]json.RawMessage, len(msgs))
			for i, m := range msgs {
				rows[i] = m.Payload
			}
			set, err := json.Marshal(rows)
			if err != nil {
				return idem.Permanent(err)
			}
			res, err := tx.ExecContext(ctx, `INSERT INTO payments (event_id, order_id, amount_cents)
				SELECT value ->> '$.event_id', value ->> '$.order_id', value ->> '$.amount_cents'
				FROM json_each(?)`, set)
			if err != nil {
				return err
			}
			fmt.Println("one statement for", len(msgs), "payments")
			return idem.ExpectResult(res, int64(len(msgs)))
		},
	})
	if err != nil {
		panic(err)
	}

	pay := func(id, order string, cents int) idem.Message {
		body := fmt.Sprintf(`{"event_id":%q,"order_id":%q,"amount_cents":%d}`, id, order, cents)
		return idem.Message{EventID: id, Tenant: "shop-eu", Type: "payment.captured", Payload: []byte(body)}
	}
	_ = consumer.Process(ctx, pay("pay_1", "order-1", 1200)) // a set of one
	results := consumer.ProcessSet(ctx, []idem.Message{
		pay("pay_1", "order-1", 1200), // redelivered: a duplicate
		pay("pay_2", "order-2", 4200),
		pay("pay_3", "order-3", 990),
		pay("pay_1", "order-1", 9900), // the same id for other content: refused
	})
	for _, r := range results {
		fmt.Println(r.Key.EventID, r.Outcome)
	}
	var n, total int
	_ = db.QueryRow(`SELECT count(*), sum(amount_cents) FROM payments`).Scan(&n, &total)
	fmt.Println("payments:", n, "total:", total)
	// Output:
	// one statement for 1 payments
	// one statement for 2 payments
	// pay_1 duplicate
	// pay_2 processed
	// pay_3 processed
	// pay_1 key_reuse
	// payments: 3 total: 6390
}
