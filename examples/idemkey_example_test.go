package examples_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkey"
	"github.com/idemkit/idem/idemsqlite"
)

// userKey is where the example's authentication middleware leaves the authenticated user.
type userKey struct{}

// authenticate stands in for real authentication: it trusts a bearer token as the user name.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

// principal reads the user authenticate left: keys are scoped by it.
func principal(r *http.Request) (string, error) {
	if u, ok := r.Context().Value(userKey{}).(string); ok {
		return u, nil
	}
	return "", errors.New("no authenticated user")
}

// openKeyShop opens a fresh SQLite shop with one pending order; cleanup removes it.
func openKeyShop() (store *idemsqlite.Store, db *sql.DB, cleanup func()) {
	dir, _ := os.MkdirTemp("", "idem-example")
	db, err := idemsqlite.Open(filepath.Join(dir, "shop.db"))
	if err != nil {
		panic(err)
	}
	store = idemsqlite.New(db)
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}
	_, _ = db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT NOT NULL, paid_cents INTEGER NOT NULL DEFAULT 0);
		INSERT INTO orders (id, status) VALUES ('order-7', 'pending')`)
	return store, db, func() { db.Close(); os.RemoveAll(dir) }
}

// send POSTs body to url with key and prints the answer.
func send(url, key, body string) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer alice")
	if key != "" {
		req.Header.Set(idemkey.HeaderIdempotencyKey, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	replayed := ""
	if resp.Header.Get(idemkey.ReplayHeaderDefault) == "true" {
		replayed = " (replayed)"
	}
	fmt.Printf("%d%s %s\n", resp.StatusCode, replayed, strings.TrimSpace(string(b)))
}

// A client pays an order with POST /orders/{id}/pay and an Idempotency-Key. The handler marks
// the order paid in the transaction the middleware opened, which also stores its response: the
// client's retry gets that response again instead of a second payment, a retry with another
// amount is refused, and a request without a key is refused.
func Example_idempotencyKey() {
	store, db, cleanup := openKeyShop()
	defer cleanup()
	keys, err := idemkey.New(store, idemkey.Config{Principal: principal})
	if err != nil {
		panic(err)
	}
	pay := keys.Handle(func(w http.ResponseWriter, r *http.Request, tx *sql.Tx) error {
		body, _ := io.ReadAll(r.Body)
		res, err := tx.ExecContext(r.Context(), `UPDATE orders SET status = 'paid', paid_cents = paid_cents + ?
			WHERE id = ? AND status = 'pending'`, string(body), r.PathValue("id"))
		if err != nil {
			return err
		}
		if err := idem.ExpectResult(res, 1); err != nil {
			http.Error(w, "order is not pending", http.StatusConflict)
			return nil // a 409 of ours commits too: the retry gets the same answer
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err = fmt.Fprintf(w, `{"order":%q,"paid_cents":%s}`, r.PathValue("id"), body)
		return err
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}/pay", pay) // r.Pattern scopes the keys
	srv := httptest.NewServer(authenticate(mux))
	defer srv.Close()

	url := srv.URL + "/orders/order-7/pay"
	send(url, "pay-7-a1", "4200")
	send(url, "pay-7-a1", "4200")
	send(url, "pay-7-a1", "99")
	send(url, "", "4200")

	var paid int64
	_ = db.QueryRow(`SELECT paid_cents FROM orders WHERE id = 'order-7'`).Scan(&paid)
	fmt.Println("paid:", paid)
	// Output:
	// 201 {"order":"order-7","paid_cents":4200}
	// 201 (replayed) {"order":"order-7","paid_cents":4200}
	// 422 {"type":"about:blank","title":"Unprocessable Entity","status":422,"detail":"this Idempotency-Key was used with another request (method, path or body differ); use a new key for a new request"}
	// 400 {"type":"about:blank","title":"Bad Request","status":400,"detail":"Idempotency-Key header is missing"}
	// paid: 4200
}

// With a router that takes func(http.Handler) http.Handler middleware, such as chi, install
// Wrap; the handler stays a plain http.Handler and finds its transaction with idemkey.Tx. Route
// names the router's pattern (chi: chi.RouteContext(r.Context()).RoutePattern(), known once
// chi has routed, so install Wrap with r.With or in r.Group, not on the root router's r.Use).
// Here a small function stands in for chi, so that this module does not depend on it.
func Example_idempotencyKeyMiddleware() {
	store, db, cleanup := openKeyShop()
	defer cleanup()
	keys, err := idemkey.New(store, idemkey.Config{
		Principal: principal,
		Route:     func(r *http.Request) string { return r.Method + " " + routePattern(r) },
	})
	if err != nil {
		panic(err)
	}
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemkey.Tx[*sql.Tx](r.Context())
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/orders/"), "/pay")
		res, err := tx.ExecContext(r.Context(), `UPDATE orders SET status = 'paid', paid_cents = 4200
			WHERE id = ? AND status = 'pending'`, id)
		if err == nil {
			err = idem.ExpectResult(res, 1)
		}
		if err != nil {
			http.Error(w, "not paid", http.StatusInternalServerError) // a 5xx rolls back
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "paid %s\n", id)
	})
	// With chi: r := chi.NewRouter(); r.Use(authenticate); r.With(keys.Wrap).Post("/orders/{id}/pay", pay)
	router := authenticate(keys.Wrap(pay))
	srv := httptest.NewServer(router)
	defer srv.Close()

	url := srv.URL + "/orders/order-7/pay"
	send(url, "pay-7-b1", "")
	send(url, "pay-7-b1", "")
	var status string
	_ = db.QueryRow(`SELECT status FROM orders WHERE id = 'order-7'`).Scan(&status)
	fmt.Println("order:", status)
	// Output:
	// 201 paid order-7
	// 201 (replayed) paid order-7
	// order: paid
}

// routePattern stands in for chi.RouteContext(r.Context()).RoutePattern().
func routePattern(r *http.Request) string {
	if strings.HasPrefix(r.URL.Path, "/orders/") && strings.HasSuffix(r.URL.Path, "/pay") {
		return "/orders/{id}/pay"
	}
	return r.URL.Path
}
