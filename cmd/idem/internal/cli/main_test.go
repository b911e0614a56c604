package cli

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	// The demo links Google's Pub/Sub client, whose opencensus dependency starts its stats worker
	// in an init function: a goroutine of the process, not of a test.
	testenv.MainWith(m, func() error {
		return goleak.Find(goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
	})
}

// result is what one run of the command produced.
type result struct {
	code           int
	stdout, stderr string
}

// syncBuffer is a bytes.Buffer safe for a command writing while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testEnv is an env with the user "tester", no environment variables but vars, and no terminal.
func testEnv(stdout, stderr io.Writer, vars map[string]string) *env {
	return &env{
		stdin:      strings.NewReader(""),
		stdout:     stdout,
		stderr:     stderr,
		getenv:     func(k string) string { return vars[k] },
		now:        time.Now,
		username:   func() string { return "tester" },
		isTerminal: func(io.Writer) bool { return false },
	}
}

// idemCLI runs the command as a user would, with the test environment.
func idemCLI(t testing.TB, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, testEnv(&out, &errb, nil))
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// requireOK fails unless the run exited 0 with nothing on stderr.
func requireOK(t testing.TB, r result) {
	t.Helper()
	require.Equal(t, ExitOK, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.Empty(t, r.stderr)
}

// requireOneLineError checks the error contract: exit code, one "idem: " line on stderr
// containing want.
func requireOneLineError(t testing.TB, r result, code int, want string) {
	t.Helper()
	require.Equal(t, code, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.True(t, strings.HasPrefix(r.stderr, "idem: "), "stderr: %q", r.stderr)
	require.True(t, strings.HasSuffix(r.stderr, "\n"), "stderr: %q", r.stderr)
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "want one line, got %q", r.stderr)
	require.Contains(t, r.stderr, want)
	require.NotContains(t, r.stderr, "Usage:")
	require.NotContains(t, r.stderr, "goroutine ")
}

// storeKind makes a fresh, empty store DSN for a test.
type storeKind struct {
	name string
	dsn  func(t testing.TB) string
}

var storeKinds = []storeKind{
	{"sqlite", sqliteDSN},
	{"postgres", postgresDSN},
}

// sqliteDSN is a database file in the test's temporary directory (not created yet).
func sqliteDSN(t testing.TB) string {
	return "sqlite://" + filepath.Join(t.TempDir(), "idem.db")
}

// postgresDSN is IDEM_POSTGRES_URL (or a skip) with a fresh idem_schema, dropped at cleanup.
func postgresDSN(t testing.TB) string {
	t.Helper()
	base := testenv.Postgres(t)
	u, err := url.Parse(base)
	require.NoError(t, err)
	schema := testdb.Name("clitest_")
	q := u.Query()
	q.Set("idem_schema", schema)
	u.RawQuery = q.Encode()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return u.String()
}

// openMigrated migrates dsn through the command and opens it for the test to seed and check.
func openMigrated(t testing.TB, dsn string) *connect.Stores {
	t.Helper()
	requireOK(t, idemCLI(t, "migrate", "--store", dsn))
	st, err := connect.OpenStore(context.Background(), dsn, connect.Options{MaxConns: 2})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	return st
}

// seedDeadLetter writes a pending dead letter of consumer ledger@v1 from queue payments.
func seedDeadLetter(t testing.TB, st *connect.Stores, eventID string, reason idem.Reason, failedAgo time.Duration) idem.DeadLetter {
	t.Helper()
	at := time.Now().Add(-failedAgo).Truncate(time.Microsecond)
	msg := idem.Message{
		EventID: eventID,
		Tenant:  "acme",
		Type:    "payment.captured",
		Payload: []byte(`{"order_id":42,"amount_cents":1250,"card":{"password":"hunter2","last4":"4242"}}`),
		Headers: map[string]string{"Authorization": "Bearer s3cr3t-token", "X-Trace-Id": "trace-1"},
	}
	fp, err := idem.ComputeFingerprint(msg, idem.FingerprintConfig{})
	require.NoError(t, err)
	dl, err := st.DeadLetters.InsertDeadLetter(context.Background(), idem.DeadLetter{
		Consumer:    "ledger@v1",
		Owner:       "payments",
		Message:     msg,
		Fingerprint: fp,
		Reason:      reason,
		Error:       "charge failed: card declined",
		Attempts:    3,
		FirstFailed: at.Add(-time.Minute),
		LastFailed:  at,
		Source:      "queue:payments",
	})
	require.NoError(t, err)
	return dl
}

// seedClaim claims key at now in the store's own transaction type.
func seedClaim(t testing.TB, st *connect.Stores, key idem.Key, now time.Time) {
	t.Helper()
	ctx := context.Background()
	p := idemstore.ClaimParams{Key: key, Fingerprint: idem.Fingerprint{9}, Now: now}
	var err error
	switch {
	case st.SQLite != nil:
		err = st.SQLite.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := st.SQLite.ClaimTx(ctx, tx, p)
			return err
		})
	default:
		err = st.Postgres.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := st.Postgres.ClaimTx(ctx, tx, p)
			return err
		})
	}
	require.NoError(t, err)
}

// seedIgnore writes the audit row of an event key's handler ignored (idem.Ignore).
func seedIgnore(t testing.TB, st *connect.Stores, key idem.Key, reason string) {
	t.Helper()
	ctx := context.Background()
	p := idemstore.RecordIgnoreParams{Key: key, Reason: reason, Now: time.Now()}
	var err error
	switch {
	case st.SQLite != nil:
		err = st.SQLite.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return st.SQLite.RecordIgnoreTx(ctx, tx, p) })
	default:
		err = st.Postgres.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return st.Postgres.RecordIgnoreTx(ctx, tx, p) })
	}
	require.NoError(t, err)
}

// claimStatus claims key again and reports what the store found.
func claimStatus(t testing.TB, st *connect.Stores, key idem.Key) idemstore.ClaimStatus {
	t.Helper()
	ctx := context.Background()
	p := idemstore.ClaimParams{Key: key, Fingerprint: idem.Fingerprint{9}, Now: time.Now()}
	var (
		res idemstore.ClaimResult
		err error
	)
	errRollback := errors.New("roll back: only looking")
	switch {
	case st.SQLite != nil:
		err = st.SQLite.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			res, err = st.SQLite.ClaimTx(ctx, tx, p)
			if err != nil {
				return err
			}
			return errRollback
		})
	default:
		err = st.Postgres.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			res, err = st.Postgres.ClaimTx(ctx, tx, p)
			if err != nil {
				return err
			}
			return errRollback
		})
	}
	require.ErrorIs(t, err, errRollback)
	return res.Status
}

// seedOutbox enqueues events to the outbox as a producer would, in its own transaction.
func seedOutbox(t testing.TB, st *connect.Stores, msgs ...idem.Outgoing) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch {
	case st.SQLite != nil:
		err = st.SQLite.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return st.SQLite.EnqueueTx(ctx, tx, msgs...) })
	default:
		err = st.Postgres.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return st.Postgres.EnqueueTx(ctx, tx, msgs...) })
	}
	require.NoError(t, err)
}

// allPartitions lists every outbox partition of st.
func allPartitions(st *connect.Stores) []int {
	ps := make([]int, st.Outbox.OutboxPartitions())
	for i := range ps {
		ps[i] = i
	}
	return ps
}
