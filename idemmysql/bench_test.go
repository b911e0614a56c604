package idemmysql_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/storetest"
)

// BenchmarkClaim measures the claim path: one InTx with one ClaimTx per iteration, for a new key
// (the INSERT commits a row) and for a duplicate (the INSERT collides, the locking read reads
// the claim), at each isolation level the tests use.
func BenchmarkClaim(b *testing.B) {
	claim := func(b *testing.B, s *idemmysql.Store, p idemstore.ClaimParams, want idemstore.ClaimStatus) {
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
	for _, iso := range isolations {
		b.Run(iso.name+"/new", func(b *testing.B) {
			tb := setup(b, idemmysql.Config{Isolation: iso.level})
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
		b.Run(iso.name+"/duplicate", func(b *testing.B) {
			tb := setup(b, idemmysql.Config{Isolation: iso.level})
			p := idemstore.ClaimParams{Key: idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-dup"}, Fingerprint: fp(1), Now: time.Now()}
			claim(b, tb.store, p, idemstore.ClaimNew)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				claim(b, tb.store, p, idemstore.ClaimDuplicate)
			}
		})
	}
}

// BenchmarkProcess measures the whole single-event path through Consumer.Process (storetest's
// benchmark: fingerprint, transaction, claim, the suite's credit effect, commit).
func BenchmarkProcess(b *testing.B) {
	storetest.Benchmark(b, factoryFor(idemmysql.Config{}))
}

// BenchmarkBaseline is the same business effect as BenchmarkProcess/new without idem: one
// transaction that appends a ledger row and credits the wallet. The difference is what a claim
// costs.
func BenchmarkBaseline(b *testing.B) {
	bundle := factoryFor(idemmysql.Config{})(b)
	ctx := context.Background()
	if err := bundle.CreateWallet(ctx, "w1"); err != nil {
		b.Fatal(err)
	}
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = "evt-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		err := bundle.Store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			n, err := bundle.Credit(ctx, tx, ids[i], "w1", 1)
			if err != nil {
				return err
			}
			return idem.ExpectRows(n, 1)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkQueuePublish: publishing to a topic with 0, 1 and 4 subscriptions.
func BenchmarkQueuePublish(b *testing.B) { storetest.BenchmarkQueuePublish(b, queueFactory) }
