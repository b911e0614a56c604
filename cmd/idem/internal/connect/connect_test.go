package connect_test

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.MainWith(m, func() error { return goleak.Find() })
}

func TestParseStore(t *testing.T) {
	t.Parallel()
	tests := []struct {
		raw    string
		want   connect.StoreURL
		str    string // String(); "" means raw
		errHas string
	}{
		{raw: "sqlite://idem.db", want: connect.StoreURL{Kind: connect.KindSQLite, Path: "idem.db"}},
		{raw: "sqlite:///var/lib/idem/idem.db", want: connect.StoreURL{Kind: connect.KindSQLite, Path: "/var/lib/idem/idem.db"}},
		{raw: "  sqlite://./data/../idem.db?cache=shared ", want: connect.StoreURL{Kind: connect.KindSQLite, Path: "idem.db"}, str: "sqlite://idem.db"},
		{raw: "SQLITE3://x.db", want: connect.StoreURL{Kind: connect.KindSQLite, Path: "x.db"}, str: "sqlite://x.db"},
		{raw: "file://x.db", want: connect.StoreURL{Kind: connect.KindSQLite, Path: "x.db"}, str: "sqlite://x.db"},
		{
			raw:  "postgres://app:secretpw@db:5432/app?sslmode=disable",
			want: connect.StoreURL{Kind: connect.KindPostgres, URL: "postgres://app:secretpw@db:5432/app?sslmode=disable"},
			str:  "postgres://app:[REDACTED]@db:5432/app?sslmode=disable",
		},
		{
			raw:  "postgresql://app@db/app?idem_schema=idem&sslmode=require",
			want: connect.StoreURL{Kind: connect.KindPostgres, URL: "postgresql://app@db/app?sslmode=require", Schema: "idem"},
			str:  "postgresql://app@db/app?idem_schema=idem&sslmode=require",
		},
		{
			raw:  "postgres:///app?host=/var/run/postgresql",
			want: connect.StoreURL{Kind: connect.KindPostgres, URL: "postgres:///app?host=%2Fvar%2Frun%2Fpostgresql"},
			str:  "postgres:///app?host=%2Fvar%2Frun%2Fpostgresql",
		},
		{raw: "", errHas: "store URL is empty"},
		{raw: "idem.db", errHas: "has no scheme"},
		{raw: "sqlite://", errHas: "has no file path"},
		{raw: "sqlite://?mode=memory", errHas: "has no file path"},
		{raw: "sqlite://a\x00b", errHas: "NUL byte"},
		{
			raw:  "mysql://app:secretpw@db:3307/app?tls=skip-verify",
			want: connect.StoreURL{Kind: connect.KindMySQL, URL: "mysql://app:secretpw@db:3307/app?tls=skip-verify", DSN: "app:secretpw@tcp(db:3307)/app?tls=skip-verify"},
			str:  "mysql://app:[REDACTED]@db:3307/app?tls=skip-verify",
		},
		{
			raw:  "mariadb://root@127.0.0.1/test",
			want: connect.StoreURL{Kind: connect.KindMySQL, URL: "mariadb://root@127.0.0.1/test", DSN: "root@tcp(127.0.0.1:3306)/test"},
			str:  "mariadb://[REDACTED]@127.0.0.1/test", // a scheme idemredact.URL does not know: all userinfo masked
		},
		{raw: "mysql://u:secretpw@h", errHas: "names no database"},
		{raw: "mysql:///db", errHas: "has no host"},
		{raw: "mysql://u:secretpw@h/db?tls=x;y", errHas: `query parameter "tls" contains ';'`},
		{raw: "mysql://u:secretpw@h/db?timeout=soon", errHas: "invalid parameters"},
		{raw: "mongodb://u:secretpw@h/db", errHas: `unknown scheme "mongodb"`},
		{raw: "postgres:///app", errHas: "has no host"},
		{raw: "postgres://u:secretpw@h:port/db", errHas: "is not a valid URL"},
		// Finding 4: a password with an unescaped '#', '?' or '/' was echoed by url.Parse's error.
		{raw: "postgres://u:secretpw#1@h:5432/db", errHas: `store URL "postgres://[REDACTED]" is not a valid URL: invalid port after host`},
		{raw: "postgres://u:secretpw?1@h:5432/db", errHas: "is not a valid URL"},
		{raw: "postgres://u:secretpw/1@h:5432/db", errHas: "is not a valid URL"},
		{raw: "postgres://u:secretpw%zz@h:5432/db", errHas: "is not a valid URL"},
		// Finding 10: a malformed query was dropped whole, silently.
		{raw: "postgres://u@h/db?idem_schema=tenant_a;x", errHas: `query parameter "idem_schema" contains ';'`},
		{raw: "postgres://u@h/db?sslmode=verify-full;", errHas: `query parameter "sslmode" contains ';'`},
		{raw: "postgres://u@h/db?password=secretpw%zz", errHas: `query parameter "password" has a bad %-escape`},
		{raw: "postgres://u@h/db?sslmode=disable&sslmode=verify-full", errHas: `query parameter "sslmode" is given twice`},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			got, err := connect.ParseStore(tt.raw)
			if tt.errHas != "" {
				require.ErrorContains(t, err, tt.errHas)
				require.NotContains(t, err.Error(), "secretpw")
				require.NotContains(t, err.Error(), "\n")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			str := tt.str
			if str == "" {
				str = strings.TrimSpace(tt.raw)
			}
			require.Equal(t, str, got.String())
		})
	}
}

func TestParseBroker(t *testing.T) {
	t.Parallel()
	tests := []struct {
		raw    string
		want   connect.BrokerURL
		str    string
		errHas string
	}{
		{raw: "sql", want: connect.BrokerURL{Kind: connect.BrokerSQL}, str: "sql"},
		{raw: " sql:// ", want: connect.BrokerURL{Kind: connect.BrokerSQL}, str: "sql"},
		{raw: "nats://127.0.0.1:4222", want: connect.BrokerURL{Kind: connect.BrokerNATS, URL: "nats://127.0.0.1:4222"}, str: "nats://127.0.0.1:4222"},
		{raw: "nats://u:secretpw@n1:4222,nats://n2:4222", want: connect.BrokerURL{Kind: connect.BrokerNATS, URL: "nats://u:secretpw@n1:4222,nats://n2:4222"},
			str: "nats://[REDACTED]@n1:4222,nats://n2:4222"},
		{raw: "nats://s3cr3ttoken@n1:4222", want: connect.BrokerURL{Kind: connect.BrokerNATS, URL: "nats://s3cr3ttoken@n1:4222"}, str: "nats://[REDACTED]@n1:4222"},
		{raw: "tls://n1:4443", want: connect.BrokerURL{Kind: connect.BrokerNATS, URL: "tls://n1:4443"}, str: "tls://n1:4443"},
		{raw: "", errHas: "broker URL is empty"},
		{raw: "localhost:4222", errHas: "has no scheme"},
		{raw: "nats://", errHas: "has no host"},
		{raw: "mqtt://b:1883", errHas: `unknown scheme "mqtt" (want sql, nats, amqp, redis, sqs, pubsub or kafka`},
		{raw: "pubsub://embedded", want: connect.BrokerURL{Kind: connect.BrokerPubSub, URL: "pubsub://embedded"}, str: "pubsub://embedded"},
		{raw: "PubSub://Embedded/", want: connect.BrokerURL{Kind: connect.BrokerPubSub, URL: "pubsub://embedded"}, str: "pubsub://embedded"},
		{raw: "pubsub://pubsub.googleapis.com:443", errHas: "only pubsub://embedded is supported"},
		{raw: "pubsub://u:secretpw@embedded", errHas: "only pubsub://embedded is supported"},
		{raw: "kafka://embedded", want: connect.BrokerURL{Kind: connect.BrokerKafka, URL: "kafka://embedded"}, str: "kafka://embedded"},
		{raw: "kafka://b:9092", errHas: "only kafka://embedded is supported"},
		{raw: "nats://n1:4222,amqp://u:secretpw@r", errHas: `unknown scheme "amqp"`},
		{raw: "nats://u:secretpw@h:port", errHas: "is not a valid URL"},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			got, err := connect.ParseBroker(tt.raw)
			if tt.errHas != "" {
				require.ErrorContains(t, err, tt.errHas)
				require.NotContains(t, err.Error(), "secretpw")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.str, got.String())
		})
	}
}

func TestMigrationSQL(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "none.db")
	sqliteSQL, err := connect.MigrationSQL("sqlite://" + path)
	require.NoError(t, err)
	require.Contains(t, sqliteSQL, "CREATE TABLE IF NOT EXISTS idem_claims")
	require.NoFileExists(t, path)

	pgSQL, err := connect.MigrationSQL("postgres://u:secretpw@nowhere.invalid/db?idem_schema=billing")
	require.NoError(t, err)
	require.Contains(t, pgSQL, `CREATE TABLE IF NOT EXISTS "billing"."idem_claims"`)

	_, err = connect.MigrationSQL("postgres://h/db?idem_schema=bad-name")
	require.ErrorContains(t, err, `idem_schema "bad-name" is not a schema name`)
}

func TestOpenStoreAndBroker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	_, err := connect.OpenStore(ctx, "sqlite://"+path, connect.Options{MustExist: true})
	require.ErrorContains(t, err, "database file does not exist")

	st, err := connect.OpenStore(ctx, "sqlite://"+path, connect.Options{})
	require.NoError(t, err)
	defer st.Close()
	require.NotNil(t, st.SQLite)
	require.NoError(t, st.Migrator.Migrate(ctx))

	b, err := connect.OpenBroker(ctx, "sql", st, connect.BrokerOptions{})
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.Sink.Publish(ctx, "q", idem.Message{EventID: "e1"}))
	qs, err := st.Queue.QueueStats(ctx, "q")
	require.NoError(t, err)
	require.EqualValues(t, 1, qs.Backlog)

	_, err = connect.OpenBroker(ctx, "sql", nil, connect.BrokerOptions{})
	require.ErrorContains(t, err, "needs an open store")
	_, err = connect.OpenBroker(ctx, "pubsub://embedded", st, connect.BrokerOptions{})
	require.ErrorContains(t, err, "runs inside idem demo only")
	_, err = connect.OpenBroker(ctx, "kafka://embedded", st, connect.BrokerOptions{})
	require.ErrorContains(t, err, "runs inside idem demo only")

	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = connect.OpenBroker(cctx, "nats://u:secretpw@127.0.0.1:1", st, connect.BrokerOptions{})
	require.ErrorContains(t, err, "is unreachable")
	require.NotContains(t, err.Error(), "secretpw")

	_, err = connect.OpenStore(ctx, "postgres://u:secretpw@127.0.0.1:1/db", connect.Options{})
	require.ErrorContains(t, err, "is unreachable")
	require.NotContains(t, err.Error(), "secretpw")
}

func TestOpenPostgresAndNATS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	st, err := connect.OpenStore(ctx, pg, connect.Options{MaxConns: 2})
	require.NoError(t, err)
	defer st.Close()
	require.NotNil(t, st.Postgres)
	require.EqualValues(t, 2, st.Postgres.Pool().Config().MaxConns)

	natsURL := testenv.NATS(t)
	b, err := connect.OpenBroker(ctx, natsURL, st, connect.BrokerOptions{Name: "connect test", Reconnect: true})
	require.NoError(t, err)
	defer b.Close()
	require.NotNil(t, b.JetStream)
	require.Equal(t, connect.BrokerNATS, b.URL.Kind)
}

// FuzzParseStore: ParseStore never panics, accepts only the two kinds, and never lets the
// password of a postgres URL through String() or an error message.
func FuzzParseStore(f *testing.F) {
	for _, s := range []string{
		"sqlite://idem.db",
		"postgres://u:secretpw@127.0.0.1:5432/db?sslmode=disable&idem_schema=s",
		"postgres://u@h/db?password=secretpw",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		su, err := connect.ParseStore(raw)
		if err != nil {
			// Messages quote the URL with %q, whose escapes ("\x00") could spell the password.
			if pw := rawPassword(raw); pw != "" && !strings.Contains(strconv.Quote(withoutRawPassword(raw)), pw) {
				require.NotContains(t, err.Error(), pw, "error of %q", raw)
			}
			return
		}
		switch su.Kind {
		case connect.KindSQLite:
			require.NotEmpty(t, su.Path)
		case connect.KindPostgres:
			require.NotEmpty(t, su.URL)
		default:
			t.Fatalf("ParseStore(%q) = kind %q, want sqlite or postgres", raw, su.Kind)
		}
		if su.Kind != connect.KindPostgres {
			return
		}
		s := su.String()
		for _, pw := range passwords(raw) {
			require.NotContains(t, s, pw, "String() of %q", raw)
		}
	})
}

// passwords returns the passwords url.Parse sees in a postgres URL (userinfo and the password
// query parameter), leaving out those that String() may show without leaking anything: those
// that also occur in the rest of the URL, or in it as masked (across the user name, the mask
// and the host).
func passwords(raw string) []string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return nil
	}
	var (
		pws  []string
		user string
	)
	if u.User != nil {
		if pw, ok := u.User.Password(); ok {
			pws = append(pws, pw)
		}
		user = url.User(u.User.Username()).String()
		u.User = nil
	}
	// ParseStore re-encodes the query, so String() shows it re-encoded, with the passwords masked.
	q := u.Query()
	pws = append(pws, q["password"]...)
	if q.Has("password") {
		q.Set("password", idemredact.Masked)
	}
	u.RawQuery = q.Encode()
	s := strings.ReplaceAll(u.String(), url.QueryEscape(idemredact.Masked), idemredact.Masked)
	scheme, tail, _ := strings.Cut(s, "://")
	// The rest of the URL, without and with the mask where the userinfo was.
	rest := fmt.Sprintf("%s %s://%s:%s@%s", s, scheme, user, idemredact.Masked, tail)
	var out []string
	for _, pw := range pws {
		if len(pw) >= 3 && !strings.Contains(rest, pw) {
			out = append(out, pw)
		}
	}
	return out
}

// rawPassword is the password of raw as written (undecoded), found the way url.Parse finds it:
// the userinfo ends at the last '@' of the authority, the password starts after its first ':'.
func rawPassword(raw string) string {
	raw = strings.TrimSpace(raw)
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return ""
	}
	_, pw, ok := strings.Cut(rest[:at], ":")
	if !ok || len(pw) < 3 || strings.Contains(idemredact.Masked, pw) {
		return ""
	}
	return pw
}

// withoutRawPassword is raw with its password cut out.
func withoutRawPassword(raw string) string {
	return strings.Replace(strings.TrimSpace(raw), ":"+rawPassword(raw)+"@", ":@", 1)
}

func TestParseStoreKeepsSpacesInParameters(t *testing.T) {
	t.Parallel()
	su, err := connect.ParseStore("postgres://u@h/db?options=-c%20synchronous_commit%3Doff&idem_schema=s1")
	if err != nil {
		t.Fatal(err)
	}
	if su.Schema != "s1" || strings.Contains(su.URL, "+") || !strings.Contains(su.URL, "options=-c%20synchronous_commit%3Doff") {
		t.Fatalf("got %+v", su)
	}
}
