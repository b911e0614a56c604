package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMainHelp(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"--help"}, strings.NewReader(""), &out, &errb)
	require.Equal(t, ExitOK, code)
	require.Empty(t, errb.String())
	for _, c := range []string{"demo", "migrate", "relay", "gc", "status", "dlq", "queue"} {
		require.Contains(t, out.String(), "\n  "+c+" ")
	}

	r := idemCLI(t, "dlq", "--help")
	requireOK(t, r)
	for _, c := range []string{"list", "show", "replay", "discard", "audit"} {
		require.Contains(t, r.stdout, "\n  "+c+" ")
	}
}

func TestMigratePrint(t *testing.T) {
	t.Parallel()
	tables := []string{"claims", "dead_letters", "audit", "queue", "outbox", "leases"}
	sqlitePath := filepath.Join(t.TempDir(), "never-created.db")
	for _, dsn := range []string{
		"sqlite://" + sqlitePath,
		"postgres://app:secretpw@db.invalid:5432/app?idem_schema=idem",
	} {
		r := idemCLI(t, "migrate", "--print", "--store", dsn)
		requireOK(t, r)
		for _, table := range tables {
			require.Regexp(t, `(?i)CREATE TABLE IF NOT EXISTS "?(idem"\.")?idem_`+table+`"? \(`, r.stdout, "table %s in %s", table, dsn)
		}
		require.NotContains(t, r.stdout, "secretpw")
	}
	// --print does not connect, so it does not create the SQLite file either.
	_, err := os.Stat(sqlitePath)
	require.True(t, os.IsNotExist(err))
}

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			dsn := kind.dsn(t)
			r := idemCLI(t, "migrate", "--store", dsn, "--status")
			requireOK(t, r)
			require.Contains(t, r.stdout, "no idem migrations recorded")

			r = idemCLI(t, "migrate", "--store", dsn)
			requireOK(t, r)
			require.Regexp(t, `is migrated: applied \d+ \(001_claims, 002_dead_letters, .*090_dead_letter_owner`, r.stdout)

			r = idemCLI(t, "migrate", "--store", dsn, "--json")
			requireOK(t, r)
			var out migrateJSON
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
			require.Empty(t, out.Applied, "the second run applies nothing")
			require.NotEmpty(t, out.Migrations)
			require.EqualValues(t, 1, out.Migrations[0].Version)

			r = idemCLI(t, "migrate", "--store", dsn)
			requireOK(t, r)
			require.Contains(t, r.stdout, "is migrated: nothing to apply")

			r = idemCLI(t, "migrate", "--store", dsn, "--status")
			requireOK(t, r)
			require.Regexp(t, `(?m)^090\s+\S*dead_letter_owner`, r.stdout)
			// The migrated store answers the operator commands.
			requireOK(t, idemCLI(t, "dlq", "list", "--store", dsn))
		})
	}
}

// TestErrors checks the error contract: one line on stderr naming the problem, no usage dump, no
// password, and exit code 2 for a wrong invocation or 1 for a runtime failure.
func TestErrors(t *testing.T) {
	t.Parallel()
	migrated := sqliteDSN(t)
	requireOK(t, idemCLI(t, "migrate", "--store", migrated))
	missing := sqliteDSN(t)
	const unreachablePG = "postgres://u:secretpw@127.0.0.1:1/db"

	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown store scheme", []string{"migrate", "--store", "mongodb://x"}, ExitUsage, `unknown scheme "mongodb"`},
		{"mysql store without database", []string{"migrate", "--store", "mysql://x"}, ExitUsage, "names no database: use mysql://USER@HOST:PORT/DB"},
		{"sqlite without path", []string{"migrate", "--store", "sqlite://"}, ExitUsage, "has no file path"},
		{"sqlite chaos on a file in use", []string{"chaos", "--store", migrated}, ExitUsage, "exists; the run needs a file of its own"},
		{"postgres schema that is no identifier", []string{"migrate", "--store", "postgres://app@127.0.0.1:1/app?idem_schema=Bad-Schema!"}, ExitUsage, `idem_schema "Bad-Schema!" is not a schema name`},
		{"sqlite file that is no database", []string{"status", "--store", "sqlite:///etc/passwd"}, ExitFailure, "open /etc/passwd: file is not a database"},
		{"store without scheme", []string{"status", "--store", "idem.db"}, ExitUsage, "has no scheme"},
		{"unreachable postgres", []string{"status", "--store", unreachablePG}, ExitFailure, "postgres://u:[REDACTED]@127.0.0.1:1/db is unreachable"},
		{"unreachable postgres migrate", []string{"migrate", "--store", unreachablePG}, ExitFailure, "is unreachable"},
		{"missing sqlite file", []string{"dlq", "list", "--store", missing}, ExitFailure, "database file does not exist"},
		{"negative limit", []string{"dlq", "list", "--store", migrated, "--limit", "-1"}, ExitUsage, "--limit is -1, want at least 1"},
		{"non-numeric limit", []string{"dlq", "list", "--store", migrated, "--limit", "ten"}, ExitUsage, `invalid argument "ten" for "--limit"`},
		{"unknown reason", []string{"dlq", "list", "--store", migrated, "--reason", "nonsense"}, ExitUsage, `--reason "nonsense" is not a dead-letter reason (want one of invalid_payload,`},
		{"unknown status", []string{"dlq", "list", "--store", migrated, "--status", "lost"}, ExitUsage, `--status "lost" is not a dead-letter status`},
		{"bad duration", []string{"dlq", "list", "--store", migrated, "--older-than", "soon"}, ExitUsage, `invalid duration "soon"`},
		{"unknown dead letter", []string{"dlq", "show", "999", "--store", migrated}, ExitFailure, "dead letter 999 does not exist"},
		{"bad dead-letter id", []string{"dlq", "show", "abc", "--store", migrated}, ExitUsage, `"abc" is not a dead-letter id`},
		{"show without id", []string{"dlq", "show", "--store", migrated}, ExitUsage, "needs --id ID (one dead-letter id)"},
		{"show --id unknown", []string{"dlq", "show", "--id", "999", "--store", migrated}, ExitFailure, "dead letter 999 does not exist"},
		{"show id twice", []string{"dlq", "show", "1", "--id", "2", "--store", migrated}, ExitUsage, "takes the id once"},
		{"relay lease ttl zero", []string{"relay", "--store", migrated, "--lease-ttl", "0"}, ExitUsage, "--lease-ttl is 0s, want at least 30ms (default 10s)"},
		{"replay unknown id", []string{"dlq", "replay", "--id", "999", "--store", migrated}, ExitFailure, "dead letter 999 does not exist"},
		{"replay without selection", []string{"dlq", "replay", "--store", migrated}, ExitUsage, "say which dead letters"},
		{"replay id and filter", []string{"dlq", "replay", "--id", "1", "--consumer", "x@v1", "--store", migrated}, ExitUsage, "do not combine"},
		{"replay amqp without topic", []string{"dlq", "replay", "--id", "1", "--broker", "amqp://127.0.0.1:5672", "--store", migrated}, ExitUsage, "--topic is required"},
		{"replay bad broker", []string{"dlq", "replay", "--id", "1", "--broker", "mqtt://x", "--store", migrated}, ExitUsage, `unknown scheme "mqtt"`},
		{"discard without note", []string{"dlq", "discard", "--id", "1", "--store", migrated}, ExitUsage, "--note is required"},
		{"unknown flag", []string{"dlq", "list", "--bogus"}, ExitUsage, "unknown flag: --bogus"},
		{"unknown command", []string{"dlq", "lst"}, ExitUsage, `unknown command "lst" for "idem dlq"; did you mean "list"?`},
		{"unknown top command", []string{"frobnicate"}, ExitUsage, `unknown command "frobnicate" for "idem"`},
		{"extra argument", []string{"status", "extra", "--store", migrated}, ExitUsage, "takes no arguments"},
		{"gc retention too short", []string{"gc", "--retention", "1h", "--store", migrated}, ExitUsage, "too short"},
		{"gc bad batch", []string{"gc", "--batch", "0", "--store", migrated}, ExitUsage, "--batch is 0"},
		{"relay bad log format", []string{"relay", "--log-format", "xml", "--store", migrated}, ExitUsage, `--log-format "xml"`},
		{"relay unreachable nats", []string{"relay", "--broker", "nats://u:secretpw@127.0.0.1:1", "--store", migrated}, ExitFailure, "broker nats://[REDACTED]@127.0.0.1:1 is unreachable"},
		{"demo bad store", []string{"demo", "--store", "mongodb://u:secretpw@x/db"}, ExitUsage, `unknown scheme "mongodb"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := idemCLI(t, tt.args...)
			requireOneLineError(t, r, tt.code, tt.want)
			require.NotContains(t, r.stderr, "secretpw")
			require.NotContains(t, r.stdout, "secretpw")
		})
	}
	// Read-only commands never create a SQLite file.
	_, err := os.Stat(strings.TrimPrefix(missing, "sqlite://"))
	require.True(t, os.IsNotExist(err))
}

// TestStoreFromEnv: without --store, commands use IDEM_STORE, and help never prints it.
func TestStoreFromEnv(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	vars := map[string]string{StoreEnv: "postgres://u:secretpw@127.0.0.1:1/db"}
	code := run(context.Background(), []string{"status"}, testEnv(&out, &errb, vars))
	require.Equal(t, ExitFailure, code)
	require.Contains(t, errb.String(), "postgres://u:[REDACTED]@127.0.0.1:1/db is unreachable")
	require.NotContains(t, errb.String(), "secretpw")

	out.Reset()
	errb.Reset()
	code = run(context.Background(), []string{"status", "--help"}, testEnv(&out, &errb, vars))
	require.Equal(t, ExitOK, code)
	require.NotContains(t, out.String(), "secretpw")
	require.Contains(t, out.String(), "$"+StoreEnv)

	e := testEnv(&out, &errb, nil)
	require.Equal(t, StoreDefault, e.resolveStore(""))
	require.Equal(t, "sqlite://x.db", e.resolveStore("sqlite://x.db"))
}

func TestParseDuration(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"7d": 7 * day, "1d12h": 36 * time.Hour, "90s": 90 * time.Second, "0": 0, "-2h": -2 * time.Hour, "2d": 48 * time.Hour,
	} {
		got, err := parseDuration(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "d", "1.5d", "7dd", "soon", "1d-1h", "99999999999d"} {
		_, err := parseDuration(in)
		require.Error(t, err, in)
	}
	require.Equal(t, "7d", formatDuration(7*day))
	require.Equal(t, "36h0m0s", formatDuration(36*time.Hour))
}

func TestOneLine(t *testing.T) {
	t.Parallel()
	err := joinErr("idem: relay: config: ID too long\nBatchSize is 0\n\tBatchSize is 0", "dial postgres://u:pw@h/db")
	require.Equal(t, "relay: config: ID too long; BatchSize is 0; dial postgres://u:[REDACTED]@h/db", oneLine(err))
}

type stringErr string

func (s stringErr) Error() string { return string(s) }

func joinErr(parts ...string) error { return stringErr(strings.Join(parts, "\n")) }
