package payments

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemstore"
)

// books is a store of each dialect with the scenario's tables, and how to write what a
// consumer writes besides them: a claim and a dead letter.
type books struct {
	db         *DB
	claim      func(t *testing.T, eventID string)
	deadLetter func(t *testing.T, eventID, reason string, headers map[string]string)
}

func sqlClaim(t *testing.T, inTx func(context.Context, func(context.Context, *sql.Tx) error) error,
	claimTx func(context.Context, *sql.Tx, idemstore.ClaimParams) (idemstore.ClaimResult, error), eventID string) {
	t.Helper()
	require.NoError(t, inTx(context.Background(), func(ctx context.Context, tx *sql.Tx) error {
		_, err := claimTx(ctx, tx, idemstore.ClaimParams{Key: idem.Key{Consumer: ConsumerName, EventID: eventID}, Now: time.Now()})
		return err
	}))
}

func openBooks(t *testing.T, d Dialect) books {
	t.Helper()
	var b books
	var dls idemstore.DeadLetterStore
	switch d {
	case SQLite:
		st, _ := testdb.SQLite(t)
		b.db = NewSQLDB(st.DB(), SQLite, st.Config().Prefix)
		b.claim = func(t *testing.T, id string) { sqlClaim(t, st.InTx, st.ClaimTx, id) }
		dls = st
	case MySQL:
		st, _ := testdb.MySQL(t)
		b.db = NewSQLDB(st.DB(), MySQL, st.Config().Prefix)
		b.claim = func(t *testing.T, id string) { sqlClaim(t, st.InTx, st.ClaimTx, id) }
		dls = st
	default:
		st, _ := testdb.Postgres(t)
		b.db = NewPostgresDB(st.Pool(), st.Config().Schema, st.Config().Prefix)
		b.claim = func(t *testing.T, id string) {
			require.NoError(t, st.InTx(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
				_, err := st.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: idem.Key{Consumer: ConsumerName, EventID: id}, Now: time.Now()})
				return err
			}))
		}
		dls = st
	}
	b.deadLetter = func(t *testing.T, id, reason string, headers map[string]string) {
		now := time.Now()
		_, err := dls.InsertDeadLetter(context.Background(), idem.DeadLetter{
			Consumer: ConsumerName, Message: idem.Message{EventID: id, Type: EventType, Headers: headers, Payload: []byte(`{}`)},
			Reason: idem.Reason(reason), Error: "planted", Attempts: 1, FirstFailed: now, LastFailed: now,
		})
		require.NoError(t, err)
	}
	for _, s := range Tables(d) {
		_, err := b.db.Exec(context.Background(), s)
		require.NoError(t, err, s)
	}
	return b
}

// plantCleanRun writes what a correct run of run leaves behind: a valid order applied once, an
// invalid-JSON order dead-lettered as invalid_payload, a key-reuse order of the valid one's id
// dead-lettered as key_reuse, and a poison identity (a NUL id) dead-lettered under an id of
// its own, matched by the order index its message carries.
func plantCleanRun(t *testing.T, b books, run string) {
	t.Helper()
	ctx := context.Background()
	exec := func(q string, args ...any) {
		_, err := b.db.Exec(ctx, q, args...)
		require.NoError(t, err, q)
	}
	exec(InsertValues("{orders}", []string{"id", "run_id", "event_id", "wallet_id", "amount_cents", "valid", "poison"}, 4),
		0, run, run+"-0", "w000", 100, true, "",
		1, run, run+"-1", "w001", 50, false, PoisonInvalidJSON,
		2, run, run+"-0", "w000", 101, false, PoisonKeyReuse,
		3, run, run+"-3", "w003", 70, false, IdentNUL)
	exec(InsertValues("{wallets}", []string{"run_id", "id", "balance_cents"}, 2), run, "w000", 100, run, "w001", 0)
	exec(`INSERT INTO {ledger} (run_id, event_id, wallet_id, amount_cents) VALUES (?, ?, 'w000', 100)`, run, run+"-0")
	b.claim(t, run+"-0")
	b.deadLetter(t, run+"-1", "invalid_payload", nil)
	b.deadLetter(t, run+"-0", "key_reuse", nil)
	b.deadLetter(t, "sha256:0123", "invalid_payload", map[string]string{HeaderOrder: "3"})
}

// TestCheck: the one verdict of the demo and chaos reads the same books the same way on every
// store, and finds each planted violation.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range []Dialect{SQLite, Postgres, MySQL} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			b := openBooks(t, d)
			plantCleanRun(t, b, "r")
			own := Scope{RunID: "r", Own: true}
			books, err := Check(ctx, b.db, own)
			require.NoError(t, err)
			require.Empty(t, books.Problems())
			require.Equal(t, 4, books.Events)
			require.Equal(t, 1, books.Valid)
			require.Equal(t, map[string]int{"invalid_payload": 2, "key_reuse": 1}, books.DeadLetters)
			valid, poison, err := Unsettled(ctx, b.db, own)
			require.NoError(t, err)
			require.Equal(t, [2]int{0, 0}, [2]int{valid, poison})
			left, err := UnsettledOrders(ctx, b.db, own, 10)
			require.NoError(t, err)
			require.Empty(t, left)

			// Shared with other runs, the identity's dead letter (its id is not the run's) is
			// out of scope: the identity has none.
			shared, err := Check(ctx, b.db, Scope{RunID: "r"})
			require.NoError(t, err)
			require.Equal(t, 1, shared.BadIdents)

			// A second run beside it is checked on its own rows.
			plantCleanRun(t, b, "s")
			again, err := Check(ctx, b.db, own)
			require.NoError(t, err)
			require.Equal(t, 4, again.Events)

			// Planted violations.
			_, err = b.db.Exec(ctx, `INSERT INTO {ledger} (run_id, event_id, wallet_id, amount_cents) VALUES ('r', 'r-0', 'w000', 100)`)
			require.NoError(t, err)
			_, err = b.db.Exec(ctx, `INSERT INTO {orders} (id, run_id, event_id, wallet_id, amount_cents, valid, poison) VALUES (4, 'r', 'r-4', 'w004', 5, true, '')`)
			require.NoError(t, err)
			b.claim(t, "r-9")
			_, err = b.db.Exec(ctx, `UPDATE {wallets} SET balance_cents = balance_cents + 1 WHERE run_id = 'r' AND id = 'w001'`)
			require.NoError(t, err)
			// A poison identity committed but never published, and the unapplied valid order:
			// a run that does not drain names both, the identity as never published.
			_, err = b.db.Exec(ctx, `INSERT INTO {orders} (id, run_id, event_id, wallet_id, amount_cents, valid, poison, sent) VALUES (5, 'r', 'r-5', 'w005', 5, false, ?, false)`, IdentUTF8)
			require.NoError(t, err)
			valid, poison, err = Unsettled(ctx, b.db, own)
			require.NoError(t, err)
			require.Equal(t, [2]int{1, 1}, [2]int{valid, poison})
			left, err = UnsettledOrders(ctx, b.db, own, 1)
			require.NoError(t, err)
			require.Equal(t, []UnsettledOrder{{ID: 4, Sent: true}}, left, "the limit holds, lowest index first")
			left, err = UnsettledOrders(ctx, b.db, own, 10)
			require.NoError(t, err)
			require.Equal(t, []UnsettledOrder{{ID: 4, Sent: true}, {ID: 5, Poison: IdentUTF8}}, left)
			require.Equal(t, "order 4 (valid)", left[0].String())
			require.Equal(t, "order 5 ("+IdentUTF8+", never published)", left[1].String())
			bad, err := Check(ctx, b.db, Scope{RunID: "r"})
			require.NoError(t, err)
			require.Equal(t, 1, bad.DoubleApplied)
			require.Equal(t, 1, bad.Lost)
			require.Equal(t, 1, bad.ClaimsWithoutEffect)
			require.Equal(t, 1, bad.BadBalances)
			p := strings.Join(bad.Problems(), "\n")
			for _, want := range []string{"applied more than once", "1 valid events were lost", "1 claims have no effect"} {
				require.Contains(t, p, want)
			}
		})
	}
}

func TestScopeRefusesAnUnsafeRunID(t *testing.T) {
	t.Parallel()
	_, err := Scope{RunID: "r' OR '1'='1"}.sql(qDeadLetters)
	require.ErrorContains(t, err, "run id")
}
