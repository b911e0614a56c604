package chaos

import (
	"context"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/internal/testenv"
)

// cleanRun writes, in a fresh schema, what a correct run of four orders leaves behind: a
// valid order (applied once, its event enqueued twice), an invalid-JSON and a missing-field
// order (each dead-lettered as invalid_payload), and a key-reuse order of the valid one's id
// (dead-lettered as key_reuse). It returns the run's database, a schema on PostgreSQL.
func cleanRun(t *testing.T, runID string) *runDB {
	t.Helper()
	ctx := context.Background()
	tb, err := openPostgresRun(ctx, testenv.Postgres(t), testdb.Name("idem_chaos_test_"), runID, 0)
	require.NoError(t, err)
	t.Cleanup(func() { tb.dropAndClose(context.Background()) })
	for _, q := range []string{
		`INSERT INTO {orders} (id, run_id, event_id, wallet_id, amount_cents, valid, poison) VALUES
			(0, 'r', 'r-0', 'w000', 100, true, ''),
			(1, 'r', 'r-1', 'w001', 50, false, 'invalid_json'),
			(2, 'r', 'r-2', 'w002', 70, false, 'missing_field'),
			(3, 'r', 'r-0', 'w000', 101, false, 'key_reuse')`,
		`INSERT INTO {ledger} (run_id, event_id, wallet_id, amount_cents) VALUES ('r', 'r-0', 'w000', 100)`,
		`UPDATE {wallets} SET balance_cents = 100 WHERE run_id = 'r' AND id = 'w000'`,
		`INSERT INTO {claims} (tenant, consumer, event_id, fingerprint, created_at)
			VALUES ('', 'ledger@v1', 'r-0', decode(repeat('01', 32), 'hex'), now())`,
		`INSERT INTO {dead_letters} (consumer, event_id, fingerprint, reason, first_failed_at, last_failed_at) VALUES
			('ledger@v1', 'r-1', decode(repeat('00', 32), 'hex'), 'invalid_payload', now(), now()),
			('ledger@v1', 'r-2', decode(repeat('00', 32), 'hex'), 'invalid_payload', now(), now()),
			('ledger@v1', 'r-0', decode(repeat('02', 32), 'hex'), 'key_reuse', now(), now())`,
		`INSERT INTO {outbox} (partition, event_id, topic, headers, created_at, next_attempt_at, published_at) VALUES
			(0, 'r-0', 't', '{}', now(), now(), now()),
			(0, 'r-0', 't', '{"Idem-Broker-Msg-Id": "r-0/dup-0"}', now(), now(), now()),
			(0, 'r-1', 't', '{}', now(), now(), now()),
			(0, 'r-2', 't', '{}', now(), now(), now()),
			(0, 'r-0', 't', '{"Idem-Broker-Msg-Id": "r-0/reuse-3"}', now(), now(), now())`,
	} {
		require.NoError(t, tb.exec(ctx, q), q)
	}
	return tb
}

func TestCheck(t *testing.T) {
	t.Parallel()
	t.Run("a correct run passes", func(t *testing.T) {
		t.Parallel()
		tb := cleanRun(t, "r")
		var r Report
		require.NoError(t, check(context.Background(), tb, "r", &r))
		require.Empty(t, r.Violations)
		require.True(t, r.OK)
		require.Equal(t, 4, r.Events)
		require.Equal(t, 1, r.Valid)
		require.Equal(t, map[string]int{payments.PoisonInvalidJSON: 1, payments.PoisonMissingField: 1, payments.PoisonKeyReuse: 1}, r.Poison)
		require.Equal(t, 1, r.DuplicatesInjected)
		require.Equal(t, map[string]int{"invalid_payload": 2, "key_reuse": 1}, r.DeadLetters)
	})

	// Each planted violation must be found, and counted where it belongs.
	for _, tc := range []struct {
		name  string
		plant []string
		field func(r Report) int
		// violations is how many violations the plant makes (a lost order also leaves its
		// wallet short, say).
		violations int
	}{
		{"an extra ledger row is a double application",
			[]string{`INSERT INTO {ledger} (run_id, event_id, wallet_id, amount_cents) VALUES ('r', 'r-0', 'w000', 100)`},
			func(r Report) int { return r.DoubleApplied }, 1},
		{"a valid order neither applied nor dead-lettered is lost",
			[]string{`INSERT INTO {orders} (id, run_id, event_id, wallet_id, amount_cents, valid) VALUES (4, 'r', 'r-4', 'w004', 5, true)`},
			func(r Report) int { return r.Lost }, 2},
		{"a poison message applied is a wrong ledger row",
			[]string{`INSERT INTO {ledger} (run_id, event_id, wallet_id, amount_cents) VALUES ('r', 'r-1', 'w001', 50)`,
				`INSERT INTO {claims} (tenant, consumer, event_id, fingerprint, created_at)
					VALUES ('', 'ledger@v1', 'r-1', decode(repeat('01', 32), 'hex'), now())`},
			func(r Report) int { return r.WrongLedger }, 1},
		{"a balance off by one cent",
			[]string{`UPDATE {wallets} SET balance_cents = balance_cents + 1 WHERE id = 'w000'`},
			func(r Report) int { return r.BadBalances }, 1},
		{"a poison message dead-lettered twice",
			[]string{`INSERT INTO {dead_letters} (consumer, event_id, fingerprint, reason, first_failed_at, last_failed_at)
				VALUES ('ledger@v1', 'r-1', decode(repeat('03', 32), 'hex'), 'invalid_payload', now(), now())`},
			func(r Report) int { return r.BadPoison }, 1},
		{"a relay dead letter is stray",
			[]string{`INSERT INTO {dead_letters} (consumer, event_id, fingerprint, reason, first_failed_at, last_failed_at)
				VALUES ('relay', 'r-9', decode(repeat('00', 32), 'hex'), 'retries_exhausted', now(), now())`},
			func(r Report) int { return r.StrayDeadLetters }, 2},
		{"an outbox row never published",
			[]string{`UPDATE {outbox} SET published_at = NULL WHERE event_id = 'r-2'`},
			func(r Report) int { return r.Unpublished }, 1},
		{"a claim without its effect",
			[]string{`INSERT INTO {claims} (tenant, consumer, event_id, fingerprint, created_at)
				VALUES ('', 'ledger@v1', 'r-1', decode(repeat('01', 32), 'hex'), now())`},
			func(r Report) int { return r.ClaimsWithoutEffect }, 1},
		{"an effect without its claim",
			[]string{`DELETE FROM {claims}`},
			func(r Report) int { return r.EffectsWithoutClaim }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := cleanRun(t, "r")
			for _, q := range tc.plant {
				require.NoError(t, tb.exec(context.Background(), q), q)
			}
			var r Report
			require.NoError(t, check(context.Background(), tb, "r", &r))
			require.Equal(t, 1, tc.field(r))
			require.False(t, r.OK)
			require.Len(t, r.Violations, tc.violations, "%q", r.Violations)
		})
	}
}

// TestCheckFaultClasses plants what the fault classes of issue 10 leave behind, right and
// wrong, on a correct run.
func TestCheckFaultClasses(t *testing.T) {
	t.Parallel()
	const (
		identOrder = `INSERT INTO {orders} (id, run_id, event_id, wallet_id, amount_cents, valid, poison) VALUES (5, 'r', 'r-5', 'w005', 10, false, 'id_nul')`
		identDL    = `INSERT INTO {dead_letters} (consumer, event_id, headers, fingerprint, reason, first_failed_at, last_failed_at)
			VALUES ('ledger@v1', 'sha256:0123', '{"Scenario-Order": "5"}', decode(repeat('04', 32), 'hex'), 'invalid_payload', now(), now())`
		validOrder  = `INSERT INTO {orders} (id, run_id, event_id, wallet_id, amount_cents, valid) VALUES (4, 'r', 'r-4', 'w004', 5, true)`
		exhaustedDL = `INSERT INTO {dead_letters} (consumer, event_id, fingerprint, reason, first_failed_at, last_failed_at)
			VALUES ('ledger@v1', 'r-4', decode(repeat('05', 32), 'hex'), 'retries_exhausted', now(), now())`
		outage = `INSERT INTO {outages} (started_at, ended_at, grace) VALUES (now() - interval '20 seconds', now() - interval '5 seconds', interval '40 seconds')`
	)
	for _, tc := range []struct {
		name  string
		plant []string
		field func(r Report) int
		want  int
		// violations is how many violations the plant makes (a valid event dead-lettered is
		// also a stray dead letter and leaves its wallet short).
		violations int
	}{
		{"a poison identity dead-lettered once, matched by its order index",
			[]string{identOrder, identDL}, func(r Report) int { return r.badIdents }, 0, 0},
		{"a poison identity without its dead letter",
			[]string{identOrder}, func(r Report) int { return r.badIdents }, 1, 1},
		{"a poison identity dead-lettered twice",
			[]string{identOrder, identDL, `INSERT INTO {dead_letters} (consumer, event_id, headers, fingerprint, reason, first_failed_at, last_failed_at)
				VALUES ('ledger@v1', '', '{"Scenario-Order": "5"}', decode(repeat('06', 32), 'hex'), 'invalid_payload', now(), now())`},
			func(r Report) int { return r.badIdents }, 1, 1},
		{"a poison identity the outbox accepted",
			[]string{identOrder, identDL, `UPDATE {orders} SET edge_accepted = true WHERE id = 5`},
			func(r Report) int { return r.edgeAccepted }, 1, 1},
		{"a valid event an outage dead-lettered as retries_exhausted is settled",
			[]string{validOrder, exhaustedDL, outage}, func(r Report) int { return r.exhausted }, 1, 0},
		{"a valid event dead-lettered as retries_exhausted outside any outage",
			[]string{validOrder, exhaustedDL}, func(r Report) int { return r.validDeadLettered }, 1, 3},
		{"a valid event dead-lettered for another reason during an outage",
			[]string{validOrder, outage, `INSERT INTO {dead_letters} (consumer, event_id, fingerprint, reason, first_failed_at, last_failed_at)
				VALUES ('ledger@v1', 'r-4', decode(repeat('05', 32), 'hex'), 'permanent_error', now(), now())`},
			func(r Report) int { return r.validDeadLettered }, 1, 3},
		{"a re-send is counted",
			[]string{`INSERT INTO {outbox} (partition, event_id, topic, headers, created_at, next_attempt_at, published_at)
				VALUES (0, 'r-0', 't', '{"Idem-Broker-Msg-Id": "r-0/resend-0"}', now(), now(), now())`},
			func(r Report) int { return r.resends }, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := cleanRun(t, "r")
			for _, q := range tc.plant {
				require.NoError(t, tb.exec(context.Background(), q), q)
			}
			var r Report
			require.NoError(t, check(context.Background(), tb, "r", &r))
			require.Equal(t, tc.want, tc.field(r))
			require.Len(t, r.Violations, tc.violations, "%q", r.Violations)
			require.Equal(t, tc.violations == 0, r.OK)
		})
	}
}

// TestDeadLetterRefusal: while the switch is on, the trigger refuses every dead-letter write
// with a transient SQLSTATE and counts it; off, writes go through.
func TestDeadLetterRefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		open   func(t *testing.T) *runDB
		insert string
		code   func(t *testing.T, err error)
	}{
		{"postgres", func(t *testing.T) *runDB { return cleanRun(t, "r") },
			`INSERT INTO {dead_letters} (consumer, event_id, fingerprint, reason, first_failed_at, last_failed_at)
				VALUES ('ledger@v1', ?, decode(repeat('07', 32), 'hex'), 'invalid_payload', now(), now())`,
			func(t *testing.T, err error) {
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				require.Equal(t, "53100", pgErr.Code)
			}},
		{"mysql", func(t *testing.T) *runDB {
			r, err := openMySQLRun(ctx, testenv.URL(t, testenv.MySQLVar), testdb.Name("idem_chaos_test_"), "r")
			require.NoError(t, err)
			t.Cleanup(func() { r.dropAndClose(context.Background()) })
			return r
		},
			`INSERT INTO {dead_letters} (consumer, tenant, event_id, type, headers, fingerprint, key_hash, reason, error,
				first_failed_at, last_failed_at, source) VALUES ('ledger@v1', '', ?, '', '{}', UNHEX(REPEAT('07', 32)),
				UNHEX(SHA2(?, 256)), 'invalid_payload', '', 1, 1, '')`,
			func(t *testing.T, err error) {
				var myErr *mysql.MySQLError
				require.ErrorAs(t, err, &myErr)
				require.EqualValues(t, 1041, myErr.Number)
				require.Equal(t, idem.ClassTransient, (&idemmysql.Store{}).ClassifyError(err))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := tc.open(t)
			args := func(id string) []any {
				if tc.name == "mysql" {
					return []any{id, id}
				}
				return []any{id}
			}
			require.NoError(t, tb.setRefuseDeadLetters(ctx, true))
			tc.code(t, tb.exec(ctx, tc.insert, args("x-1")...))
			tc.code(t, tb.exec(ctx, tc.insert, args("x-2")...))
			refused, err := tb.refused(ctx)
			require.NoError(t, err)
			require.Equal(t, 2, refused, "the count survives the rollback")
			require.NoError(t, tb.setRefuseDeadLetters(ctx, false))
			require.NoError(t, tb.exec(ctx, tc.insert, args("x-3")...))
		})
	}
}
