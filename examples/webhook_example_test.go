package examples_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemwebhook"
)

// Stripe pushes "payment captured" to a webhook endpoint. The ingress verifies the signature,
// claims the event and marks the order paid in one transaction, and answers 200 only after the
// commit: Stripe's retry of the same event is a duplicate, and a forged push is refused (401)
// and stores nothing: anyone can send one.
func Example_webhook() {
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
			var ev struct {
				Data struct {
					Object struct {
						OrderID     string `json:"order_id"`
						AmountCents int64  `json:"amount_cents"`
					} `json:"object"`
				} `json:"data"`
			}
			if err := json.Unmarshal(msg.Payload, &ev); err != nil {
				return idem.Permanent(err)
			}
			res, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid', paid_cents = paid_cents + ?
				WHERE id = ? AND status = 'pending'`, ev.Data.Object.AmountCents, ev.Data.Object.OrderID)
			if err != nil {
				return err
			}
			return idem.ExpectResult(res, 1)
		},
		Observe: idem.ObserveConfig{
			Logger: slog.New(slog.DiscardHandler),
		},
	})
	if err != nil {
		panic(err)
	}

	// The endpoint secret from Stripe's dashboard; the tenant is decided by which secret verifies.
	secret := []byte("whsec_example_0123456789abcdefghij")
	stripe, err := idemwebhook.NewStripe(idemwebhook.StripeConfig{Secrets: []idemwebhook.Secret{{Tenant: "shop-eu", Key: secret}}})
	if err != nil {
		panic(err)
	}
	ingress, err := idemwebhook.New(consumer, idemwebhook.Config{Verifier: stripe, DeadLetters: store})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(ingress)
	defer srv.Close()

	body := fmt.Sprintf(`{"id":"evt_1Q","type":"payment_intent.succeeded","created":%d,
		"data":{"object":{"order_id":"order-7","amount_cents":4200}}}`, time.Now().Unix())
	push := func(key []byte, body string) string {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		req.Header.Set(idemwebhook.HeaderStripeSignature, idemwebhook.SignStripe(key, time.Now(), []byte(body)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		var a idemwebhook.Answer
		_ = json.NewDecoder(resp.Body).Decode(&a)
		return strings.TrimSpace(fmt.Sprint(resp.StatusCode, " ", a.Outcome))
	}
	fmt.Println("push:", push(secret, body))
	fmt.Println("Stripe retries:", push(secret, body))
	fmt.Println("forged:", push([]byte("whsec_not_the_secret_0123456789ab"), strings.Replace(body, "4200", "1", 1)))

	var status string
	var paid int64
	_ = db.QueryRow(`SELECT status, paid_cents FROM orders WHERE id = 'order-7'`).Scan(&status, &paid)
	fmt.Println("order:", status, paid)
	dls, _ := store.ListDeadLetters(ctx, idemstore.DeadLetterFilter{})
	fmt.Println("dead letters:", len(dls))
	// Output:
	// push: 200 processed
	// Stripe retries: 200 duplicate
	// forged: 401
	// order: paid 4200
	// dead letters: 0
}
