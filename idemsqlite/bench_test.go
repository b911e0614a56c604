package idemsqlite_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/storetest"
)

// BenchmarkClaim measures the claim path: one InTx with one ClaimTx per iteration, for a new key
// (the INSERT commits a row) and for a duplicate (the INSERT finds the key, the SELECT reads it).
func BenchmarkClaim(b *testing.B) {
	claim := func(b *testing.B, s *idemsqlite.Store, p idemstore.ClaimParams, want idemstore.ClaimStatus) {
		err := s.InTx(context.Background(), func(ctx context.Context, tx *sql.Tx) error {
			res, err := s.ClaimTx(ctx, tx, p)
			if err == nil && res.Status != want {
				b.Fatalf("claim %s: got %s, want %s", p.Key, res.Status, want)
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}

	b.Run("new", func(b *testing.B) {
		tb := setup(b, idemsqlite.Config{})
		keys := make([]idem.Key, b.N)
		for i := range keys {
			keys[i] = idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-" + strconv.Itoa(i)}
		}
		at := time.Now()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			claim(b, tb.store, idemstore.ClaimParams{Key: keys[i], Fingerprint: fp(1), Now: at}, idemstore.ClaimNew)
		}
	})

	b.Run("duplicate", func(b *testing.B) {
		tb := setup(b, idemsqlite.Config{})
		p := idemstore.ClaimParams{Key: idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-dup"}, Fingerprint: fp(1), Now: time.Now()}
		claim(b, tb.store, p, idemstore.ClaimNew)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			claim(b, tb.store, p, idemstore.ClaimDuplicate)
		}
	})
}

// BenchmarkQueuePublish: publishing to a topic with 0, 1 and 4 subscriptions.
func BenchmarkQueuePublish(b *testing.B) { storetest.BenchmarkQueuePublish(b, queueFactory) }
