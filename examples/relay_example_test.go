package examples_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemsqlite"
)

// printSink stands in for a broker: it prints what it publishes.
type printSink struct{}

func (printSink) Publish(_ context.Context, topic string, msgs ...idem.Message) error {
	for _, m := range msgs {
		fmt.Printf("%s: %s %s\n", topic, m.EventID, m.Payload)
	}
	return nil
}

func (printSink) Close() error { return nil }

// The producer writes its order and the event in one transaction; the relay publishes the event
// afterwards. RunOnce does one round (handy in tests and cron jobs); a service runs Run, as `idem relay` does.
func Example_relay() {
	dir, _ := os.MkdirTemp("", "idemrelay-example")
	defer os.RemoveAll(dir)
	db, err := idemsqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	store := idemsqlite.New(db)
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT)`); err != nil {
		panic(err)
	}

	err = store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES ('o1', 'paid')`); err != nil {
			return err
		}
		return store.EnqueueTx(ctx, tx, idem.Outgoing{EventID: "order-o1-paid", Tenant: "acme",
			Topic: "orders.paid", Key: "o1", Payload: []byte(`{"order":"o1"}`)})
	})
	if err != nil {
		panic(err)
	}

	relay, err := idemrelay.New(store, printSink{}, idemrelay.Config{})
	if err != nil {
		panic(err)
	}
	n, err := relay.RunOnce(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("published", n)
	if err := relay.Release(ctx); err != nil {
		panic(err)
	}
	// Output:
	// orders.paid: order-o1-paid {"order":"o1"}
	// published 1
}
