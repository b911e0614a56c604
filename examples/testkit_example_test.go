package examples_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemtest"
)

// The stores satisfy the test kit's interfaces: a handler that takes an idemtest.Enqueuer can be
// tested with an idemtest.Outbox in front of the real store.
var (
	_ idemtest.TxRunner[*sql.Tx] = (*idemsqlite.Store)(nil)
	_ idemtest.Enqueuer[*sql.Tx] = (*idemsqlite.Store)(nil)
)

// markPaid is the handler under test: it marks the order of a captured payment paid.
func markPaid(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
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
}

// openShop opens a migrated SQLite store with one pending order, in dir.
func openShop(ctx context.Context, dir string) (*sql.DB, *idemsqlite.Store, error) {
	db, err := idemsqlite.Open(filepath.Join(dir, "shop.db"))
	if err != nil {
		return nil, nil, err
	}
	store := idemsqlite.New(db)
	if err := store.Migrate(ctx); err != nil {
		return nil, nil, err
	}
	_, err = db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT NOT NULL, paid_cents INTEGER NOT NULL DEFAULT 0);
		INSERT INTO orders (id, status) VALUES ('order-7', 'pending')`)
	return db, store, err
}

// A handler unit test in a transaction that is always rolled back: ProcessTx runs the consumer's
// whole path (checks, fingerprint, claim, handler) in the test's transaction, the test reads the
// effect inside it, and idemtest.Rollback leaves the database as it found it.
func Example_handlerTest() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	db, store, err := openShop(ctx, dir)
	if err != nil {
		panic(err)
	}
	defer db.Close()

	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{Name: "orders@v1", Handler: markPaid})
	if err != nil {
		panic(err)
	}
	msg := idem.Message{
		EventID: "pay_01HV3", Tenant: "shop-eu", Type: "payment.captured",
		Payload: []byte(`{"order_id":"order-7","amount_cents":4200}`),
	}

	err = idemtest.Rollback(ctx, store, func(ctx context.Context, tx *sql.Tx) error {
		res := consumer.ProcessTx(ctx, tx, msg)
		err := res.Err
		if err != nil {
			return err
		}
		var status string
		if err := tx.QueryRowContext(ctx, `SELECT status FROM orders WHERE id = 'order-7'`).Scan(&status); err != nil {
			return err
		}
		fmt.Println("inside:", res.Outcome, status)
		return nil
	})
	if err != nil {
		panic(err)
	}

	var status string
	_ = db.QueryRowContext(ctx, `SELECT status FROM orders WHERE id = 'order-7'`).Scan(&status)
	fmt.Println("after rollback:", status)
	r := consumer.Process(ctx, msg)
	fmt.Println("the event applies again:", r.Outcome)
	// Output:
	// inside: processed paid
	// after rollback: pending
	// the event applies again: processed
}

// TestMarkPaid is the same check as a user writes it in a _test.go file: idemtest.Message builds
// the event, idemtest.ProcessRollback runs it and hands the transaction to the assertions.
func TestMarkPaid(t *testing.T) {
	ctx := context.Background()
	db, store, err := openShop(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{Name: "orders@v1", Handler: markPaid})
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name       string
		payload    any
		wantStatus string
		wantOut    idem.Outcome
	}{
		{"pending order is paid", PaymentCaptured{OrderID: "order-7", AmountCents: 4200}, "paid", idem.OutcomeProcessed},
		{"unknown order fails", PaymentCaptured{OrderID: "order-9", AmountCents: 4200}, "pending", idem.OutcomeFailed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msg := idemtest.Message(t, "payment.captured", tc.payload)
			res, _ := idemtest.ProcessRollback(ctx, t, consumer, store, msg, func(ctx context.Context, tx *sql.Tx, _ idem.Result) {
				var status string
				if err := tx.QueryRowContext(ctx, `SELECT status FROM orders WHERE id = 'order-7'`).Scan(&status); err != nil {
					t.Fatal(err)
				}
				if status != tc.wantStatus {
					t.Errorf("status inside the transaction = %q, want %q", status, tc.wantStatus)
				}
			})
			if res.Outcome != tc.wantOut {
				t.Errorf("outcome = %s, want %s (%v)", res.Outcome, tc.wantOut, res.Err)
			}
			var status string
			if err := db.QueryRowContext(ctx, `SELECT status FROM orders WHERE id = 'order-7'`).Scan(&status); err != nil {
				t.Fatal(err)
			}
			if status != "pending" {
				t.Errorf("status after rollback = %q, want pending", status)
			}
		})
	}
}
