package idem

import (
	"context"
	"fmt"
	"time"
)

// CollectGarbage deletes this consumer's claims older than the retention, in batches of at most
// batch rows (GCBatchDefault when batch <= 0) so that a large backlog never holds long locks,
// and reports how many it deleted. Retention was checked against the redelivery window when
// the consumer was built, so a deleted claim's event can no longer come back un-refused.
func (c *Consumer[TTx]) CollectGarbage(ctx context.Context, batch int) (int, error) {
	return CollectGarbage(ctx, c.store, c.cfg.Name, c.cfg.Now().Add(-c.cfg.Retention), batch)
}

// ClaimGarbageCollector is the part of a Store that deletes expired claims.
type ClaimGarbageCollector interface {
	DeleteExpiredClaims(ctx context.Context, p DeleteExpiredClaimsParams) (int, error)
}

// CollectGarbage deletes claims of consumer (all consumers when empty) created before before, in
// bounded batches, until none is left or ctx ends; it reports how many it deleted.
func CollectGarbage(ctx context.Context, store ClaimGarbageCollector, consumer string, before time.Time, batch int) (int, error) {
	if batch <= 0 {
		batch = GCBatchDefault
	}
	total := 0
	for {
		n, err := store.DeleteExpiredClaims(ctx, DeleteExpiredClaimsParams{Consumer: consumer, Before: before, Limit: batch})
		total += n
		if err != nil {
			return total, fmt.Errorf("idem: garbage collection of claims before %s: %w", before.UTC().Format(time.RFC3339), err)
		}
		if n < batch {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}
