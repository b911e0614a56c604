package idempg_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/storetest"
)

// BenchmarkClaim measures the hot path: one transaction holding one claim, for a fresh key
// (new) and for a redelivery of a claimed key (duplicate).
func BenchmarkClaim(b *testing.B) {
	benchmarkClaims(b, newStore(b, idempg.Config{}))
}

// BenchmarkClaimPartitioned is BenchmarkClaim on a partitioned inbox: day buckets with a week
// of partitions either side of now, and hour buckets with a week back and two days ahead (217
// partitions), claiming into the current bucket.
func BenchmarkClaimPartitioned(b *testing.B) {
	for _, tc := range []struct {
		name string
		p    idempg.PartitionConfig
	}{
		{"day", idempg.PartitionConfig{Bucket: 24 * time.Hour, Retention: 7 * 24 * time.Hour}},
		{"hour", idempg.PartitionConfig{Bucket: time.Hour, Retention: 7 * 24 * time.Hour}},
	} {
		b.Run(tc.name, func(b *testing.B) { benchmarkClaims(b, newStore(b, idempg.Config{Partition: tc.p})) })
	}
}

// benchmarkClaims runs the new and duplicate cases on store, in the current bucket when the
// inbox is partitioned.
func benchmarkClaims(b *testing.B, store *idempg.Store) {
	ctx := context.Background()
	fp := idem.Fingerprint{1, 2, 3}
	now := time.Now().UTC()
	var bucket time.Time
	if w := store.ClaimBucket(); w > 0 {
		bucket = now.Truncate(w)
	}
	claim := func(b *testing.B, p idemstore.ClaimParams, want idemstore.ClaimStatus) {
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
	params := func(eventID string) idemstore.ClaimParams {
		return idemstore.ClaimParams{Key: idem.Key{Tenant: "acme", Consumer: "bench@v1", EventID: eventID}, Fingerprint: fp, Now: now, Bucket: bucket}
	}

	b.Run("new", func(b *testing.B) {
		run := strconv.FormatInt(time.Now().UnixNano(), 36)
		ps := make([]idemstore.ClaimParams, b.N)
		for i := range ps {
			ps[i] = params("new-" + strconv.Itoa(i) + "-" + run)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			claim(b, ps[i], idemstore.ClaimNew)
		}
	})

	b.Run("duplicate", func(b *testing.B) {
		p := params("dup")
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
			claim(b, p, idemstore.ClaimDuplicate)
		}
	})
}

// BenchmarkQueuePublish: publishing to a topic with 0, 1 and 4 subscriptions.
func BenchmarkQueuePublish(b *testing.B) { storetest.BenchmarkQueuePublish(b, queueFactory) }
