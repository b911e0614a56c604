package chaos

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/cmd/idem/internal/payments"
)

// The verdict's SQL is payments' (payments.Check), the same the demo reads, in every dialect:
// anyone can rerun it by hand on a kept run (--keep). The run has idem's tables to itself and
// records its database outages, hence its scope.
func runScope(runID string) payments.Scope {
	return payments.Scope{RunID: runID, Own: true, Outages: true}
}

// drainState counts what is left to do: orders not yet settled and outbox rows not yet
// published.
type drainState struct {
	unsettled, outbox int
}

func readDrainState(ctx context.Context, db *runDB, runID string) (drainState, error) {
	var d drainState
	valid, poison, err := payments.Unsettled(ctx, db.DB, runScope(runID))
	if err != nil {
		return d, err
	}
	d.unsettled = valid + poison
	if d.outbox, err = payments.OutboxBacklog(ctx, db.DB, runScope(runID)); err != nil {
		return d, err
	}
	return d, nil
}

// check fills the database half of r for run runID: the counts of orders and dead letters and
// every guarantee (payments.Check), with a violation for each that does not hold, and the
// dead-letter writes the harness's trigger refused.
func check(ctx context.Context, db *runDB, runID string, r *Report) error {
	if err := db.analyze(ctx); err != nil {
		return fmt.Errorf("check run %s: analyze: %w", runID, err)
	}
	b, err := payments.Check(ctx, db.DB, runScope(runID))
	if err != nil {
		return err
	}
	r.Events, r.Valid, r.Poison, r.DeadLetters = b.Events, b.Valid, b.Poison, b.DeadLetters
	r.DuplicatesInjected, r.resends = b.DuplicatesEnqueued, b.ResendsEnqueued
	r.DoubleApplied, r.Lost, r.lostPoison, r.exhausted = b.DoubleApplied, b.Lost, b.LostPoison, b.Exhausted
	r.DeadLetteredValid, r.validDeadLettered = b.DeadLetteredValid, b.ValidDeadLettered()
	r.WrongLedger, r.BadBalances, r.BadPoison, r.badIdents = b.WrongLedger, b.BadBalances, b.BadPoison, b.BadIdents
	r.StrayDeadLetters, r.edgeAccepted, r.Unpublished = b.StrayDeadLetters, b.EdgeAcceptedCount(), b.Unpublished
	r.ClaimsWithoutEffect, r.EffectsWithoutClaim = b.ClaimsWithoutEffect, b.EffectsWithoutClaim
	if r.dlRefused, err = db.refused(ctx); err != nil {
		return fmt.Errorf("check run %s: count refused dead-letter writes: %w", runID, err)
	}
	r.Violations = append(r.Violations, b.Problems()...)
	r.OK = len(r.Violations) == 0
	return nil
}
