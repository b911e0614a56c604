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

// BenchmarkClaimPartitioned is BenchmarkClaim on a partitioned inbox: day buckets with a week
// of partitions either side of now, and hour buckets with a week back and two days ahead (217
// partitions), claiming into the current bucket.
func BenchmarkClaimPartitioned(b *testing.B) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		p    idempg.PartitionConfig
	}{
		{"day", idempg.PartitionConfig{Bucket: 24 * time.Hour, Retention: 7 * 24 * time.Hour}},
		{"hour", idempg.PartitionConfig{Bucket: time.Hour, Retention: 7 * 24 * time.Hour}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			store := newStore(b, idempg.Config{Partition: tc.p})
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
					claim(b, idem.ClaimParams{Key: keys[i], Fingerprint: fp, Now: now, Bucket: now}, idem.ClaimNew)
				}
			})

			b.Run("duplicate", func(b *testing.B) {
				now := time.Now().UTC()
				p := idem.ClaimParams{Key: idem.Key{Tenant: "acme", Consumer: "bench@v1", EventID: "dup"}, Fingerprint: fp, Now: now, Bucket: now}
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
		})
	}
}
