package serve

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/cmd/idem/internal/inspect"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	// Chromium's pipes and the HTTP clients' connections take a moment to close on a loaded
	// machine: look for leaks for up to ten seconds, not goleak's one.
	testenv.MainWith(m, func() error { return testenv.FindLeaks(10 * time.Second) })
}

// storeKind opens a fresh, migrated store of one kind for a test.
type storeKind struct {
	name string
	open func(t testing.TB) *connect.Stores
}

var storeKinds = []storeKind{
	{"sqlite", sqliteStores},
	{"postgres", postgresStores},
	{"mysql", mysqlStores},
}

// openStores opens dsn, migrates it and closes it at cleanup.
func openStores(t testing.TB, dsn string) *connect.Stores {
	t.Helper()
	ctx := context.Background()
	st, err := connect.OpenStore(ctx, dsn, connect.Options{MaxConns: 4})
	require.NoError(t, err)
	require.NoError(t, st.Migrator.Migrate(ctx))
	return st
}

// sqliteStores is a store in a fresh file.
func sqliteStores(t testing.TB) *connect.Stores {
	t.Helper()
	st := openStores(t, "sqlite://"+filepath.Join(t.TempDir(), "idem.db"))
	t.Cleanup(st.Close)
	return st
}

// postgresStores is a store in a fresh schema of IDEM_POSTGRES_URL (or a skip), dropped at cleanup.
func postgresStores(t testing.TB) *connect.Stores {
	t.Helper()
	u, err := url.Parse(testenv.Postgres(t))
	require.NoError(t, err)
	schema := testdb.Name("servetest_")
	q := u.Query()
	q.Set("idem_schema", schema)
	u.RawQuery = q.Encode()
	st := openStores(t, u.String())
	t.Cleanup(func() {
		_, _ = st.Postgres.Pool().Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		st.Close()
	})
	return st
}

// mysqlStores is a store in a fresh database of IDEM_MYSQL_URL (or a skip), dropped at cleanup.
func mysqlStores(t testing.TB) *connect.Stores {
	t.Helper()
	_, dsn := testdb.MySQLDatabase(t)
	st := openStores(t, dsn)
	t.Cleanup(st.Close) // before the database is dropped: cleanups run last first
	return st
}

// seeded is what seed put into a store.
type seeded struct {
	// ledgerOld is ledger@v1's permanent_error dead letter of tenant acme, failed 3h ago.
	ledgerOld int64
	// ledgerNew is ledger@v1's retries_exhausted dead letter of tenant globex, failed 5m ago.
	ledgerNew int64
	// mailer is mailer@v2's dead letter of tenant acme, whose payload holds a password.
	mailer int64
}

// seed writes three dead letters from queue "payments" and claims of ledger@v1.
func seed(t testing.TB, st *connect.Stores, now time.Time) seeded {
	t.Helper()
	ctx := context.Background()
	ins := func(consumer, tenant, eventID string, reason idem.Reason, payload string, failed time.Time) int64 {
		owner := ""
		if consumer == "mailer@v2" {
			owner = "team-mail"
		}
		msg := idem.Message{EventID: eventID, Tenant: tenant, Type: "payment.captured", Payload: []byte(payload),
			Headers: map[string]string{"Authorization": "Bearer s3cr3t-token", "Trace": "abc"}}
		fp, err := idem.ComputeFingerprint(msg, idem.FingerprintConfig{})
		require.NoError(t, err)
		dl, err := st.DeadLetters.InsertDeadLetter(ctx, idem.DeadLetter{Consumer: consumer, Message: msg,
			Fingerprint: fp, Reason: reason, Error: "wallet " + eventID + " is closed",
			Attempts: 3, FirstFailed: failed.Add(-time.Minute), LastFailed: failed, Status: idem.DeadLetterPending,
			Source: "queue:payments", Owner: owner})
		require.NoError(t, err)
		return dl.ID
	}
	s := seeded{
		ledgerOld: ins("ledger@v1", "acme", "evt-old", idem.ReasonPermanentError, `{"wallet":"w1","amount":5}`, now.Add(-3*time.Hour)),
		ledgerNew: ins("ledger@v1", "globex", "evt-new", idem.ReasonRetriesExhausted, `{"wallet":"w2","amount":7}`, now.Add(-5*time.Minute)),
		mailer:    ins("mailer@v2", "acme", "evt-mail", idem.ReasonPermanentError, `{"to":"a@example.com","password":"hunter2"}`, now.Add(-10*time.Minute)),
	}
	claim := func(eventID string, at time.Time) {
		k := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: eventID}
		p := idemstore.ClaimParams{Key: k, Now: at}
		var err error
		switch {
		case st.SQLite != nil:
			err = st.SQLite.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error { _, err := st.SQLite.ClaimTx(ctx, tx, p); return err })
		case st.Postgres != nil:
			err = st.Postgres.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { _, err := st.Postgres.ClaimTx(ctx, tx, p); return err })
		case st.MySQL != nil:
			err = st.MySQL.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error { _, err := st.MySQL.ClaimTx(ctx, tx, p); return err })
		}
		require.NoError(t, err)
	}
	for i, ago := range []time.Duration{30 * time.Minute, 2 * time.Minute, time.Minute, 10 * time.Second} {
		claim("done-"+string(rune('a'+i)), now.Add(-ago))
	}

	// Three outbox rows waiting, and a relay holding the first one's partition.
	var out []idem.Outgoing
	for _, w := range []string{"w1", "w2", "w3"} {
		out = append(out, idem.Outgoing{EventID: "out-" + w, Tenant: "acme", Topic: "payments.captured", Key: w, Payload: []byte(`{}`)})
	}
	var err error
	switch {
	case st.SQLite != nil:
		err = st.SQLite.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return st.SQLite.EnqueueTx(ctx, tx, out...) })
	case st.Postgres != nil:
		err = st.Postgres.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return st.Postgres.EnqueueTx(ctx, tx, out...) })
	case st.MySQL != nil:
		err = st.MySQL.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return st.MySQL.EnqueueTx(ctx, tx, out...) })
	}
	require.NoError(t, err)
	parts, err := inspect.OutboxPartitions(ctx, st)
	require.NoError(t, err)
	require.NotEmpty(t, parts)
	_, ok, err := st.Outbox.LeaseAcquire(ctx, idemstore.LeaseParams{Name: idemrelay.PartitionLeasePrefix + strconv.Itoa(parts[0].Partition),
		Owner: "relay-a", TTL: time.Hour, Now: time.Now()})
	require.NoError(t, err)
	require.True(t, ok)
	return s
}

// browser is an HTTP client with cookies, like a person's browser.
type browser struct {
	t    testing.TB
	base string
	c    *http.Client
	// header is added to every request.
	header http.Header
}

func newBrowser(t testing.TB, srv *httptest.Server) *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &browser{t: t, base: srv.URL, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}, header: http.Header{}}
}

func (b *browser) do(req *http.Request) (int, string) {
	b.t.Helper()
	for k, v := range b.header {
		req.Header[k] = v
	}
	resp, err := b.c.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	var sb strings.Builder
	_, err = io.Copy(&sb, resp.Body)
	require.NoError(b.t, err)
	return resp.StatusCode, sb.String()
}

func (b *browser) get(path string) (int, string) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.base+path, nil)
	require.NoError(b.t, err)
	return b.do(req)
}

func (b *browser) post(path string, form url.Values) (int, string) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req)
}

var csrfRE = regexp.MustCompile(`<meta name="idem-csrf" content="([0-9a-f]+)">`)

// csrf loads a page and returns the CSRF token its forms carry.
func (b *browser) csrf() string {
	b.t.Helper()
	_, body := b.get("/audit")
	m := csrfRE.FindStringSubmatch(body)
	require.NotNil(b.t, m, "no CSRF token in /audit:\n%s", body)
	return m[1]
}

// login logs in with token as name.
func (b *browser) login(token, name string) (int, string) {
	b.t.Helper()
	return b.post("/login", url.Values{"csrf": {b.csrf()}, "token": {token}, "name": {name}})
}
