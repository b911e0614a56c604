// Package storetest is the conformance suite every idem store passes: the same checks of the
// exactly-once guarantee against PostgreSQL and SQLite. A store package runs it from its tests
// with Exercise, giving a Factory that builds an isolated, migrated store plus the business
// effect the checks apply.
package storetest

import (
	"context"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// Bundle is one isolated store plus a deliberately non-idempotent business effect: an
// append-only ledger without a unique key and a wallet balance updated with
// balance = balance + amount. Only idem can keep such an effect single.
type Bundle[TTx any] struct {
	// Store is migrated and private to the test (own schema or database file).
	Store idemstore.Store[TTx]
	// CreateWallet inserts a wallet with balance 0 (committed).
	CreateWallet func(ctx context.Context, wallet string) error
	// Credit, inside tx, appends a ledger row (eventID, wallet, amount) and adds amount to the
	// wallet's balance; it returns how many wallet rows the update touched (0 when the wallet
	// does not exist).
	Credit func(ctx context.Context, tx TTx, eventID, wallet string, amount int64) (int64, error)
	// LedgerRows counts committed ledger rows for eventID.
	LedgerRows func(ctx context.Context, eventID string) (int64, error)
	// Balance returns a wallet's committed balance.
	Balance func(ctx context.Context, wallet string) (int64, error)
	// ClaimRows counts committed claims for a key (0 or 1).
	ClaimRows func(ctx context.Context, key idem.Key) (int64, error)

	// RejectClaims, when set, makes the database refuse every later claim of eventID the way it
	// refuses a row it cannot store (a CHECK constraint or a trigger on the claims table), so
	// the suite can check that one unclaimable event fails alone. Optional: checks that need
	// it are skipped without it.
	RejectClaims func(ctx context.Context, eventID string) error
	// KillTx, when set, ends tx from inside a handler the way a statement of the database can
	// (SQLite: a trigger's RAISE(ROLLBACK); PostgreSQL: a ROLLBACK run on the transaction) and
	// returns what that statement returned (nil when it succeeded). Optional: checks that need
	// it are skipped without it.
	KillTx func(ctx context.Context, tx TTx) error
}

// Factory builds a fresh Bundle for one test or benchmark; cleanup goes through tb.Cleanup.
type Factory[TTx any] func(tb testing.TB) Bundle[TTx]
