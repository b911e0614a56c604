package storetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkey"
)

// BenchmarkIdempotencyKeys measures a POST through the Idempotency-Key middleware over a real
// HTTP server and client, with the suite's credit as the effect: "new" (a fresh key: take the
// key, run the handler and store its response), "replay" (a completed key) and "bare" (the same
// handler in one transaction without the middleware), so the middleware's cost is new − bare.
// Run it from a store package: storetest.BenchmarkIdempotencyKeys(b, factory).
func BenchmarkIdempotencyKeys[TTx any](b *testing.B, factory Factory[TTx]) {
	ctx := context.Background()
	setup := func(b *testing.B, guarded bool) *httptest.Server {
		bundle := factory(b)
		if err := bundle.CreateWallet(ctx, "w1"); err != nil {
			b.Fatal(err)
		}
		store, ok := bundle.Store.(idemkey.Store[TTx])
		if !ok {
			b.Fatalf("%T does not implement idemkey.Store", bundle.Store)
		}
		credit := func(w http.ResponseWriter, r *http.Request, tx TTx) error {
			key := r.Header.Get(idemkey.HeaderIdempotencyKey)
			n, err := bundle.Credit(r.Context(), tx, key, "w1", 1)
			if err != nil {
				return err
			}
			if err := idem.ExpectRows(n, 1); err != nil {
				return err
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, err = fmt.Fprintf(w, `{"key":%q}`, key)
			return err
		}
		var h http.Handler
		if guarded {
			mw, err := idemkey.New(store, idemkey.Config{
				Principal: func(*http.Request) (string, error) { return "bench", nil },
				Logger:    slog.New(slog.DiscardHandler),
			})
			if err != nil {
				b.Fatal(err)
			}
			h = mw.Handle(credit)
		} else {
			h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if err := store.InTx(r.Context(), func(ctx context.Context, tx TTx) error {
					return credit(w, r.WithContext(ctx), tx)
				}); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
			})
		}
		srv := httptest.NewServer(h)
		b.Cleanup(srv.Close)
		return srv
	}
	post := func(b *testing.B, srv *httptest.Server, key string, want int) {
		r, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", bytes.NewReader([]byte(`{"amount":1}`)))
		r.Header.Set(idemkey.HeaderIdempotencyKey, key)
		resp, err := srv.Client().Do(r)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			b.Fatalf("key %s: status %d, want %d", key, resp.StatusCode, want)
		}
	}
	for _, bc := range []struct {
		name    string
		guarded bool
	}{{"bare", false}, {"new", true}} {
		b.Run(bc.name, func(b *testing.B) {
			srv := setup(b, bc.guarded)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				post(b, srv, fmt.Sprintf("key-%d", i), http.StatusCreated)
			}
		})
	}
	b.Run("replay", func(b *testing.B) {
		srv := setup(b, true)
		post(b, srv, "key-replay", http.StatusCreated)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			post(b, srv, "key-replay", http.StatusCreated)
		}
	})
}
