package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
)

// TestCheckDrainFindsDoubleAndLost checks the books check the drain cases rely on: a drained
// queue with one claim and one ledger row per event passes; an event applied twice, an event
// not applied, or a job left in the queue fails the case.
func TestCheckDrainFindsDoubleAndLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, err := newEnv(ctx, Options{PostgresURL: testenv.Postgres(t)}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.close)
	const n = 3
	// Apply n events by hand, as a drain would: a claim and the effect each.
	for _, m := range e.messages(n) {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+e.schema+`.idem_claims (tenant, consumer, event_id, fingerprint, created_at)
				VALUES ($1, 'drain@v1', $2, $3, now())`, m.Tenant, m.EventID, make([]byte, 32)); err != nil {
				return err
			}
			return e.credit(ctx, tx, m.EventID, walletOf(m, e.opts.Wallets))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		setup  string // SQL run before the check, in the env's schema (%s)
		queue  string
		n      int
		effect bool
		ok     bool
	}{
		{"books balance", "", "empty", n, true, true},
		{"books balance, no effect", "", "empty", n, false, true},
		{"one event not applied", "", "empty", n + 1, true, false},
		{"one claim not made", "", "empty", n + 1, false, false},
		{"a job left in the queue", "", "left", n, false, false},
		{"an event applied twice", `INSERT INTO %[1]s.ledger (event_id, wallet, amount) SELECT event_id, wallet, amount FROM %[1]s.ledger LIMIT 1`, "empty", n, true, false},
	} {
		if tc.queue == "left" {
			if err := e.store.QueuePublish(ctx, "left", idem.Message{EventID: "left-1", Tenant: "bench", Type: "t", Payload: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
		if tc.setup != "" {
			if _, err := e.pool.Exec(ctx, fmt.Sprintf(tc.setup, e.schema)); err != nil {
				t.Fatal(err)
			}
		}
		err := e.checkDrain(ctx, tc.queue, "drain@v1", tc.n, tc.effect)
		if (err == nil) != tc.ok {
			t.Errorf("%s: checkDrain = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
