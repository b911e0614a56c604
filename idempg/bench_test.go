package idempg_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempg"
)

// BenchmarkClaim measures the hot path: one transaction holding one claim, for a fresh key
// (new) and for a redelivery of a claimed key (duplicate).
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	store := newStore(b, idempg.Config{})
	fp := idem.Fingerprint{1, 2, 3}
	claim := func(b *testing.B, p idem.ClaimParams, want idem.ClaimStatus) {
		err := store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			res, err := store.ClaimTx(ctx, tx, p)
			if err == nil && res.Status != want {
				b.Fatalf("claim %s: %s, want %s", p.Key, res.Status, want)
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}

	b.Run("new", func(b *testing.B) {
		keys := make([]idem.Key, b.N)
		for i := range keys {
			keys[i] = idem.Key{Tenant: "acme", Consumer: "bench@v1", EventID: "new-" + strconv.Itoa(i) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
		}
		now := time.Now().UTC()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			claim(b, idem.ClaimParams{Key: keys[i], Fingerprint: fp, Now: now}, idem.ClaimNew)
		}
	})

	b.Run("duplicate", func(b *testing.B) {
		p := idem.ClaimParams{Key: idem.Key{Tenant: "acme", Consumer: "bench@v1", EventID: "dup"}, Fingerprint: fp, Now: time.Now().UTC()}
		err := store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := store.ClaimTx(ctx, tx, p)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			claim(b, p, idem.ClaimDuplicate)
		}
	})
}
