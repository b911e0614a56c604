package idem

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// CollectGarbage deletes this consumer's claims older than the retention, in batches of at most
// batch rows (GCBatchDefault when batch <= 0) so that a large backlog never holds long locks,
// and reports how many it deleted. Retention was checked against the redelivery window when
// the consumer was built, so a deleted claim's event can no longer come back un-refused.
func (c *Consumer[TTx]) CollectGarbage(ctx context.Context, batch int) (int, error) {
	return CollectGarbage(ctx, c.store, c.cfg.Name, c.cfg.Now().Add(-c.cfg.Claims.Retention), batch)
}

// CollectGarbage deletes claims of consumer (all consumers when empty) created before before, in
// bounded batches, until none is left or ctx ends; it reports how many it deleted.
func CollectGarbage(ctx context.Context, store idemstore.ClaimGarbageCollector, consumer string, before time.Time, batch int) (int, error) {
	if batch <= 0 {
		batch = GCBatchDefault
	}
	total := 0
	for {
		n, err := store.DeleteExpiredClaims(ctx, idemstore.DeleteExpiredClaimsParams{Consumer: consumer, Before: before, Limit: batch})
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

// maintain collects this consumer's expired claims every Maintenance.Interval until ctx ends,
// the first time after a random delay in [0, Interval) so that processes started together
// spread their deletes. Each collection is logged and reported to a MaintenanceObserver; a
// failure is retried at the next interval (the rows stay past the horizon, nothing is lost).
func (c *Consumer[TTx]) maintain(ctx context.Context) {
	m := c.cfg.Claims.Maintenance
	if m.Disabled {
		return
	}
	var first int64
	if c.cfg.Failure.Rand != nil {
		first = c.cfg.Failure.Rand.Int64N(int64(m.Interval))
	} else {
		first = rand.Int64N(int64(m.Interval))
	}
	t := time.NewTimer(time.Duration(first))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.collectOnce(ctx)
		t.Reset(m.Interval)
	}
}

// collectOnce runs one collection of maintain and reports it.
func (c *Consumer[TTx]) collectOnce(ctx context.Context) {
	n, err := c.CollectGarbage(ctx, c.cfg.Claims.Maintenance.Batch)
	if err != nil && ctx.Err() != nil {
		return // shutting down: not a failure worth an alert
	}
	if o, ok := c.cfg.Observe.Observer.(MaintenanceObserver); ok {
		o.ClaimsCollected(c.cfg.Name, n, err)
	}
	attrs := []slog.Attr{slog.String("consumer", c.cfg.Name), slog.Int("deleted", n), slog.String("retention", c.cfg.Claims.Retention.String())}
	switch {
	case err != nil:
		c.cfg.Observe.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: claim garbage collection failed",
			append(attrs, slog.String("error", c.redactor.Text(err.Error())), slog.String("retry_in", c.cfg.Claims.Maintenance.Interval.String()))...)
	case n > 0:
		c.cfg.Observe.Logger.LogAttrs(ctx, slog.LevelInfo, "idem: expired claims collected", attrs...)
	default:
		c.cfg.Observe.Logger.LogAttrs(ctx, slog.LevelDebug, "idem: expired claims collected", attrs...)
	}
}
