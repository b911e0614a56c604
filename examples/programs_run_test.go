package examples_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/wire"
)

// TestPrograms runs README's PostgreSQL and NATS programs together: capturePayment commits a
// payment and its event, relayPayments publishes it, consumeLedger marks the order paid — once,
// though the payment is captured twice and the relay's publish is repeated by hand.
func TestPrograms(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pgURL, natsURL := testenv.Postgres(t), testenv.NATS(t)

	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "examples_" + hex.EncodeToString(b[:])
	cfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	defer func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	}()
	store, err := idempg.NewWithConfig(pool, idempg.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL, paid_cents bigint NOT NULL DEFAULT 0);
		CREATE TABLE payments (order_id text NOT NULL, cents bigint NOT NULL);
		INSERT INTO orders (id, status) VALUES ('o-7', 'pending')`); err != nil {
		t.Fatal(err)
	}

	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	_ = js.DeleteStream(ctx, "PAYMENTS")
	defer func() { _ = js.DeleteStream(context.Background(), "PAYMENTS") }()
	if _, err := idemnats.EnsureStream(ctx, js, jetstream.StreamConfig{Name: "PAYMENTS", Subjects: []string{"payments.>"}, MaxAge: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}

	// The producer's transaction retried after a lost reply commits the same event twice.
	for range 2 {
		if err := capturePayment(ctx, store, "o-7", 4200); err != nil {
			t.Fatal(err)
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- relayPayments(runCtx, store, js) }()
	go func() { done <- consumeLedger(runCtx, store, js) }()

	paid := func() (string, int64) {
		var status string
		var cents int64
		if err := pool.QueryRow(ctx, `SELECT status, paid_cents FROM orders WHERE id = 'o-7'`).Scan(&status, &cents); err != nil {
			t.Fatal(err)
		}
		return status, cents
	}
	for status, _ := paid(); status != "paid"; status, _ = paid() {
		if ctx.Err() != nil {
			t.Fatal("the order was never paid")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A redelivery the broker's deduplication does not catch: the same event under another
	// message id, as after a producer restart outside the deduplication window.
	again := nats.NewMsg("payments.captured")
	again.Data = []byte(`{"amount_cents":4200,"order_id":"o-7"}`)
	again.Header.Set(wire.EventID, "payment-o-7")
	again.Header.Set(wire.Type, "payment.captured")
	if _, err := js.PublishMsg(ctx, again, jetstream.WithMsgID("again")); err != nil {
		t.Fatal(err)
	}
	for {
		info, err := js.Consumer(ctx, "PAYMENTS", "ledger")
		if err != nil {
			t.Fatal(err)
		}
		ci, err := info.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.Delivered.Stream >= 2 && ci.NumPending == 0 && ci.NumAckPending == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the redelivery was never settled: %+v", ci)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	for range 2 {
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("a program ended with %v", err)
		}
	}
	count := func(table string) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	status, cents := paid()
	payments, claims, dead := count("payments"), count("idem_claims"), count("idem_dead_letters")
	if status != "paid" || cents != 4200 || payments != 2 || claims != 1 || dead != 0 {
		t.Fatalf("order %s %d after %d captures, with %d claims and %d dead letters; want paid 4200 after 2, 1 claim, none dead",
			status, cents, payments, claims, dead)
	}
}

// Example_sqliteQueue runs README's SQLite program: a payment published to the queue table in
// the producer's transaction, delivered twice, marks the order paid once.
func Example_sqliteQueue() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, _ := os.MkdirTemp("", "idem-shop")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "shop.db")

	// The producer side, in the same file: an order, and its payment's event published to the
	// queue table in the transaction that records the payment (twice, as a retried request would).
	db, err := idemsqlite.Open(path)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	store := idemsqlite.New(db)
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT NOT NULL, paid_cents INTEGER NOT NULL DEFAULT 0);
		INSERT INTO orders (id, status) VALUES ('o-7', 'pending')`); err != nil {
		panic(err)
	}
	msg := idem.Message{EventID: "payment-o-7", Type: "payment.captured", Payload: []byte(`{"order_id":"o-7","amount_cents":4200}`)}
	for range 2 {
		if err := store.QueuePublish(ctx, "payments", msg); err != nil {
			panic(err)
		}
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runShop(runCtx, path) }()
	for {
		var waiting int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_queue`).Scan(&waiting); err != nil {
			panic(err)
		}
		if waiting == 0 || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		panic(err)
	}
	var status string
	var cents int64
	_ = db.QueryRowContext(ctx, `SELECT status, paid_cents FROM orders WHERE id = 'o-7'`).Scan(&status, &cents)
	fmt.Println("order:", status, cents)
	// Output:
	// order: paid 4200
}

// TestREADMEShowsThePrograms checks that each Go block of README.md preceded by a marker
// `<!-- program: NAME -->` is, character for character, the function NAME of programs_test.go,
// so the README's programs are the ones this module compiles and runs.
func TestREADMEShowsThePrograms(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("programs_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "programs_test.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	funcs := map[string]string{}
	for _, d := range file.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok {
			funcs[fn.Name.Name] = string(src[fset.Position(fn.Pos()).Offset:fset.Position(fn.End()).Offset])
		}
	}
	blocks := regexp.MustCompile("(?s)<!-- program: (\\w+) -->\n```go\n(.*?)\n```").FindAllStringSubmatch(string(readme), -1)
	want := []string{"consumeLedger", "capturePayment", "relayPayments", "runShop"}
	var got []string
	for _, b := range blocks {
		name, block := b[1], b[2]
		got = append(got, name)
		fn, ok := funcs[name]
		if !ok {
			t.Errorf("README shows program %s, which programs_test.go does not define", name)
			continue
		}
		if block != fn {
			t.Errorf("README's %s differs from programs_test.go's:\n--- README\n%s\n--- programs_test.go\n%s", name, block, fn)
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("README shows programs %v, want %v in that order", got, want)
	}
}
