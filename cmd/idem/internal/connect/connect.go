// Package connect turns the --store and --broker URLs of the idem command into open stores and
// transports. Parsing is separate from opening so that it can be tested and fuzzed without
// services, and every error names the URL with its password masked.
package connect

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemstore"
)

// Store kinds.
const (
	KindSQLite   = "sqlite"
	KindPostgres = "postgres"
	KindMySQL    = "mysql"
)

// StoreURL is a parsed --store value.
type StoreURL struct {
	Kind string
	// Path is the SQLite database file.
	Path string
	// URL is the PostgreSQL connection string (postgres://…), passed to pgx as is, or the
	// MySQL URL (mysql://…) as given.
	URL string
	// DSN is the go-sql-driver/mysql data source name the MySQL URL translates to
	// (USER:PASSWORD@tcp(HOST:PORT)/DB?PARAMS).
	DSN string
	// Schema is the PostgreSQL schema for idem's tables (query parameter idem_schema, default public).
	Schema string
}

// String returns the URL with any password masked, for messages.
func (s StoreURL) String() string {
	if s.Kind == KindSQLite {
		return "sqlite://" + s.Path
	}
	if s.Schema != "" {
		// Show the schema too: it is part of which store this is.
		if u, err := url.Parse(s.URL); err == nil {
			q := u.Query()
			q.Set("idem_schema", s.Schema)
			u.RawQuery = q.Encode()
			return redactDSN(u.String())
		}
	}
	return redactDSN(s.URL)
}

// ParseStore parses sqlite://PATH (relative or absolute: sqlite:///var/lib/idem.db),
// postgres://… or postgresql://… URLs, and mysql://USER:PASSWORD@HOST:PORT/DB?PARAMS (MySQL or
// MariaDB; PARAMS are go-sql-driver/mysql's DSN parameters).
func ParseStore(raw string) (StoreURL, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return StoreURL{}, errors.New("store URL is empty: use sqlite://PATH or postgres://USER@HOST:PORT/DB")
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return StoreURL{}, fmt.Errorf("store URL %q has no scheme: use sqlite://PATH or postgres://USER@HOST:PORT/DB", redactDSN(raw))
	}
	switch strings.ToLower(scheme) {
	case "sqlite", "sqlite3", "file":
		path := rest
		if i := strings.IndexByte(path, '?'); i >= 0 {
			path = path[:i]
		}
		if path == "" {
			return StoreURL{}, fmt.Errorf("store URL %q has no file path: use sqlite://PATH", redactDSN(raw))
		}
		if strings.ContainsRune(path, 0) {
			return StoreURL{}, fmt.Errorf("store URL %q: file path contains a NUL byte", redactDSN(raw))
		}
		return StoreURL{Kind: KindSQLite, Path: filepath.Clean(path)}, nil
	case "postgres", "postgresql":
		u, err := url.Parse(raw)
		if err != nil {
			return StoreURL{}, fmt.Errorf("store URL %q is not a valid URL: %s", redactDSN(raw), urlErr(err))
		}
		if u.Host == "" && u.Query().Get("host") == "" {
			return StoreURL{}, fmt.Errorf("store URL %q has no host", redactDSN(raw))
		}
		q, err := parseQuery(u.RawQuery)
		if err != nil {
			return StoreURL{}, fmt.Errorf("store URL %q: %w", redactDSN(raw), err)
		}
		schema := q.Get("idem_schema")
		q.Del("idem_schema")
		if schema != "" && !validSchemaName(schema) {
			// Checked here so that the message names the URL's parameter, not a library field.
			return StoreURL{}, fmt.Errorf("store URL %q: idem_schema %q is not a schema name idem can use (want a letter or underscore, then up to 40 letters, digits or underscores)",
				redactDSN(raw), schema)
		}
		// Encode writes a space as '+', which pgx reads literally ("options=-c x=y" would break);
		// a literal '+' is already %2B, so every '+' left is a space.
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
		return StoreURL{Kind: KindPostgres, URL: u.String(), Schema: schema}, nil
	case "mysql", "mariadb":
		dsn, err := mysqlDSN(raw)
		if err != nil {
			return StoreURL{}, fmt.Errorf("store URL %q: %w", redactDSN(raw), err)
		}
		return StoreURL{Kind: KindMySQL, URL: raw, DSN: dsn}, nil
	default:
		if !validScheme(scheme) {
			return StoreURL{}, fmt.Errorf("store URL %q has no valid scheme: use sqlite://PATH or postgres://USER@HOST:PORT/DB", redactDSN(raw))
		}
		return StoreURL{}, fmt.Errorf("store URL %q: unknown scheme %q (want sqlite, postgres or mysql)", redactDSN(raw), scheme)
	}
}

// validSchemaName is idempg's rule for Config.Schema: a letter or underscore, then letters,
// digits or underscores, at most 41 bytes in all.
func validSchemaName(s string) bool {
	if s == "" || len(s) > 41 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// mysqlDSN translates mysql://USER:PASSWORD@HOST:PORT/DB?PARAMS into the driver's DSN,
// USER:PASSWORD@tcp(HOST:PORT)/DB?PARAMS, checking it with the driver's own parser. The database
// is required: idem's tables go in it.
func mysqlDSN(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("not a valid URL: %s", urlErr(err))
	}
	if u.Host == "" {
		return "", errors.New("has no host: use mysql://USER@HOST:PORT/DB")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return "", errors.New("names no database: use mysql://USER@HOST:PORT/DB")
	}
	q, err := parseQuery(u.RawQuery)
	if err != nil {
		return "", err
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, db
	if u.Port() == "" {
		cfg.Addr = u.Host + ":3306"
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	dsn := cfg.FormatDSN()
	if len(q) > 0 {
		dsn += "?" + q.Encode()
	}
	if _, err := mysql.ParseDSN(dsn); err != nil {
		return "", fmt.Errorf("invalid parameters: %s", redactErr(err))
	}
	return dsn, nil
}

// parseQuery parses a URL query strictly: url.URL.Query drops the whole query when one part is
// malformed, so "idem_schema=tenant_a;x" ran in public and "sslmode=verify-full;" vanished. A
// ';', a bad %-escape or a repeated parameter is an error naming the parameter (its value is not
// repeated: it may be a password).
func parseQuery(raw string) (url.Values, error) {
	q := url.Values{}
	if raw == "" {
		return q, nil
	}
	for _, part := range strings.Split(raw, "&") {
		if part == "" {
			continue
		}
		k, v, _ := strings.Cut(part, "=")
		name, err := url.QueryUnescape(k)
		if err != nil {
			return nil, errors.New("query has a parameter name with a bad %-escape")
		}
		shown := strconv.Quote(name)
		if len(name) > 64 || strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			shown = "(unprintable)"
		}
		if strings.Contains(part, ";") {
			return nil, fmt.Errorf("query parameter %s contains ';' (separate parameters with '&'; write a literal ';' as %%3B)", shown)
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			return nil, fmt.Errorf("query parameter %s has a bad %%-escape in its value (write '%%' as %%25)", shown)
		}
		if q.Has(name) {
			return nil, fmt.Errorf("query parameter %s is given twice", shown)
		}
		q.Set(name, val)
	}
	return q, nil
}

// validScheme reports whether s is a URL scheme (RFC 3986: a letter, then letters, digits, '+',
// '-' or '.'), so that it can be named in a message without echoing anything else.
func validScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

// redactDSN masks the credentials of raw for messages. Beyond idemredact.URL, it masks every
// userinfo password the way url.Parse finds it (up to the last '@' before the path), and
// everything before the last '@' of a string without "://" (user:password@tcp(host)/db), so
// that a DSN too malformed for RedactURL's reading leaks nothing either.
func redactDSN(raw string) string {
	if !strings.Contains(raw, "://") {
		if at := strings.LastIndexByte(raw, '@'); at >= 0 {
			raw = idemredact.Masked + raw[at:]
		}
		return idemredact.URL(raw)
	}
	var b strings.Builder
	for {
		i := strings.Index(raw, "://")
		if i < 0 {
			break
		}
		start := i + 3
		end := len(raw)
		if j := strings.IndexAny(raw[start:], "/?#"); j >= 0 {
			end = start + j
		}
		b.WriteString(raw[:start])
		auth := raw[start:end]
		if at := strings.LastIndexByte(auth, '@'); at >= 0 {
			if c := strings.IndexByte(auth[:at], ':'); c >= 0 {
				auth = auth[:c+1] + idemredact.Masked + auth[at:]
			}
		}
		b.WriteString(auth)
		raw = raw[end:]
	}
	b.WriteString(raw)
	return idemredact.URL(b.String())
}

// urlErr is the reason of a url.Parse error without the URL it repeats.
func urlErr(err error) string { return idemredact.URLError(err) }

// redactErr masks passwords that driver errors may repeat.
func redactErr(err error) string { return redactDSN(err.Error()) }

// notReached says why a store or broker could not be reached: "rejected the credentials" for
// an authentication failure (a wrong password is not a network problem, and the fix differs),
// else "is unreachable"; kind is "store" or "broker" and what its redacted URL.
func notReached(kind string, what fmt.Stringer, err error) error {
	if isAuthFailure(err) {
		return fmt.Errorf("%s %s rejected the credentials (check the user and password in the URL): %s", kind, what, redactErr(err))
	}
	return fmt.Errorf("%s %s is unreachable: %s", kind, what, redactErr(err))
}

// isAuthFailure recognises the authentication failures of the databases and brokers the CLI
// speaks to.
func isAuthFailure(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// 28P01 invalid_password, 28000 invalid_authorization_specification.
		return pgErr.Code == "28P01" || pgErr.Code == "28000"
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		// 1045 access denied for user, 1044 access denied to database, 1698 no password.
		return myErr.Number == 1045 || myErr.Number == 1044 || myErr.Number == 1698
	}
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) {
		return true
	}
	msg := err.Error()
	for _, s := range []string{
		"Authorization Violation", // NATS, when the error is only text
		"WRONGPASS", "NOAUTH",     // Redis
		"ACCESS_REFUSED",                   // RabbitMQ
		"username or password not allowed", // RabbitMQ (amqp091's ErrCredentials)
	} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// Broker kinds.
const (
	// BrokerSQL is the queue table in the store (--broker sql).
	BrokerSQL = "sql"
	// BrokerNATS is NATS JetStream (--broker nats://HOST:PORT).
	BrokerNATS = "nats"
)

// BrokerURL is a parsed --broker value.
type BrokerURL struct {
	// Kind is BrokerSQL (the queue table in the store) or BrokerNATS.
	Kind string
	// URL is the NATS server URL, or a comma-separated list of them, as given.
	URL string
}

// String returns the broker with any password or token masked, for messages.
func (b BrokerURL) String() string {
	if b.Kind == BrokerSQL {
		return BrokerSQL
	}
	return redactDSN(b.URL)
}

// ParseBroker parses "sql" and nats://HOST:PORT (also tls://, and a comma-separated list of
// servers of one cluster, as the NATS client accepts).
func ParseBroker(raw string) (BrokerURL, error) {
	raw = strings.TrimSpace(raw)
	switch {
	case raw == BrokerSQL || raw == "sql://":
		return BrokerURL{Kind: BrokerSQL}, nil
	case raw == "":
		return BrokerURL{}, errors.New("broker URL is empty: use sql (the queue table in the store) or nats://HOST:PORT")
	}
	if bu, ok, err := parseAMQP(raw); ok {
		return bu, err
	}
	if bu, ok, err := parseRedis(raw); ok {
		return bu, err
	}
	if bu, ok, err := parseSQS(raw); ok {
		return bu, err
	}
	if bu, ok, err := parseEmbedded(raw); ok {
		return bu, err
	}
	for _, one := range strings.Split(raw, ",") {
		one = strings.TrimSpace(one)
		if !strings.Contains(one, "://") {
			return BrokerURL{}, fmt.Errorf("broker URL %q has no scheme: use sql or nats://HOST:PORT", redactDSN(raw))
		}
		u, err := url.Parse(one)
		if err != nil {
			return BrokerURL{}, fmt.Errorf("broker URL %q is not a valid URL: %s", redactDSN(raw), urlErr(err))
		}
		switch strings.ToLower(u.Scheme) {
		case "nats", "tls":
			if u.Host == "" {
				return BrokerURL{}, fmt.Errorf("broker URL %q has no host: use nats://HOST:PORT", redactDSN(raw))
			}
		default:
			return BrokerURL{}, fmt.Errorf("broker URL %q: unknown scheme %q (want sql, nats, amqp, redis, sqs, pubsub or kafka)", redactDSN(raw), u.Scheme)
		}
	}
	return BrokerURL{Kind: BrokerNATS, URL: raw}, nil
}

// Stores is an open store of either kind, with the interfaces the command needs.
type Stores struct {
	URL StoreURL
	// Exactly one of SQLite, Postgres and MySQL is set.
	SQLite   *idemsqlite.Store
	Postgres *idempg.Store
	MySQL    *idemmysql.Store

	DeadLetters idemstore.DeadLetterStore
	Queue       idemstore.QueueStore
	Outbox      idemstore.OutboxRelayStore
	Migrator    idemstore.Migrator
	GC          idemstore.ClaimGarbageCollector

	closers []func()
}

// Close closes the store and its connections.
func (s *Stores) Close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// Options tunes OpenStore.
type Options struct {
	// MaxConns bounds the PostgreSQL or MySQL pool (default 16).
	MaxConns int32
	// MustExist refuses to create a missing SQLite file (for commands that only read).
	MustExist bool
}

// OpenStore parses raw and opens the store, checking that the database answers.
func OpenStore(ctx context.Context, raw string, opts Options) (*Stores, error) {
	su, err := ParseStore(raw)
	if err != nil {
		return nil, err
	}
	s := &Stores{URL: su}
	switch su.Kind {
	case KindSQLite:
		if opts.MustExist {
			if _, err := os.Stat(su.Path); err != nil {
				return nil, fmt.Errorf("store %s: database file does not exist (run idem migrate first?)", su)
			}
		}
		db, err := idemsqlite.Open(su.Path)
		if err != nil {
			return nil, fmt.Errorf("store %s: %w", su, err)
		}
		if err := pingSQL(ctx, db); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("store %s: %w", su, err)
		}
		st := idemsqlite.New(db)
		s.SQLite = st
		s.DeadLetters, s.Queue, s.Outbox, s.Migrator, s.GC = st, st, st, st, st
		s.closers = append(s.closers, func() { _ = db.Close() }, func() { _ = st.Close() })
	case KindPostgres:
		cfg, err := pgxpool.ParseConfig(su.URL)
		if err != nil {
			return nil, fmt.Errorf("store %s: %s", su, redactErr(err))
		}
		cfg.MaxConns = 16
		if opts.MaxConns > 0 {
			cfg.MaxConns = opts.MaxConns
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("store %s: %s", su, redactErr(err))
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := pool.Ping(pctx); err != nil {
			pool.Close()
			return nil, notReached("store", su, err)
		}
		st, err := idempg.NewWithConfig(pool, idempg.Config{Schema: su.Schema})
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("store %s: %w", su, err)
		}
		s.Postgres = st
		s.DeadLetters, s.Queue, s.Outbox, s.Migrator, s.GC = st, st, st, st, st
		s.closers = append(s.closers, pool.Close, func() { _ = st.Close() })
	case KindMySQL:
		db, err := sql.Open("mysql", su.DSN)
		if err != nil {
			return nil, fmt.Errorf("store %s: %s", su, redactErr(err))
		}
		maxConns := 16
		if opts.MaxConns > 0 {
			maxConns = int(opts.MaxConns)
		}
		db.SetMaxOpenConns(maxConns)
		db.SetMaxIdleConns(maxConns)
		// Below the server's wait_timeout (8 h by default), so the pool never hands out a
		// connection the server has already closed.
		db.SetConnMaxLifetime(time.Hour)
		if err := pingSQL(ctx, db); err != nil {
			_ = db.Close()
			return nil, notReached("store", su, err)
		}
		st := idemmysql.New(db)
		s.MySQL = st
		s.DeadLetters, s.Queue, s.Outbox, s.Migrator, s.GC = st, st, st, st, st
		s.closers = append(s.closers, func() { _ = db.Close() }, func() { _ = st.Close() })
	}
	return s, nil
}

func pingSQL(ctx context.Context, db *sql.DB) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return db.PingContext(pctx)
}

// MigrationSQL returns the SQL of the store's migrations without connecting to it (and, for
// SQLite, without creating the file): `idem migrate --print` works before the database exists.
func MigrationSQL(raw string) (string, error) {
	su, err := ParseStore(raw)
	if err != nil {
		return "", err
	}
	switch su.Kind {
	case KindSQLite:
		// sql.Open does not connect; MigrationSQL only formats the embedded migrations.
		db, err := sql.Open("sqlite", "file::memory:")
		if err != nil {
			return "", fmt.Errorf("store %s: %w", su, err)
		}
		defer db.Close()
		st := idemsqlite.New(db)
		defer st.Close()
		return st.MigrationSQL(), nil
	case KindMySQL:
		// sql.Open does not connect either.
		db, err := sql.Open("mysql", su.DSN)
		if err != nil {
			return "", fmt.Errorf("store %s: %s", su, redactErr(err))
		}
		defer db.Close()
		st := idemmysql.New(db)
		defer st.Close()
		return st.MigrationSQL(), nil
	default:
		st, err := idempg.NewWithConfig(nil, idempg.Config{Schema: su.Schema})
		if err != nil {
			return "", fmt.Errorf("store %s: %w", su, err)
		}
		return st.MigrationSQL(), nil
	}
}

// Broker is an open --broker: the sink that publishes to it, and the JetStream client when it
// is NATS.
type Broker struct {
	URL  BrokerURL
	Sink idem.Sink
	// JetStream is set for BrokerNATS.
	JetStream jetstream.JetStream

	closers []func()
}

// Close closes the sink and the broker connection.
func (b *Broker) Close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

// BrokerOptions tunes OpenBroker.
type BrokerOptions struct {
	// Name is the client name the NATS server shows for the connection (default "idem").
	Name string
	// Reconnect keeps reconnecting forever after a lost connection, for daemons; one-shot
	// commands leave it off and fail instead.
	Reconnect bool
}

// OpenBroker parses raw and opens the broker it names: BrokerSQL publishes into the queue table
// of stores (which must be open), BrokerNATS connects to the server and publishes to JetStream.
func OpenBroker(ctx context.Context, raw string, stores *Stores, opts BrokerOptions) (*Broker, error) {
	bu, err := ParseBroker(raw)
	if err != nil {
		return nil, err
	}
	if bu.Embedded() {
		return nil, fmt.Errorf("broker %s runs inside idem demo only: this command needs a broker that outlives it", bu)
	}
	b := &Broker{URL: bu}
	switch bu.Kind {
	case BrokerSQL:
		if stores == nil || stores.Queue == nil {
			return nil, errors.New("broker sql needs an open store (its queue table)")
		}
		sink := idemqueue.NewSink(stores.Queue)
		b.Sink = sink
		b.closers = append(b.closers, func() { _ = sink.Close() })
	case BrokerNATS:
		name := opts.Name
		if name == "" {
			name = "idem"
		}
		nopts := []nats.Option{nats.Name(name), nats.Timeout(5 * time.Second)}
		if opts.Reconnect {
			nopts = append(nopts, nats.MaxReconnects(-1))
		}
		if dl, ok := ctx.Deadline(); ok {
			nopts = append(nopts, nats.Timeout(time.Until(dl)))
		}
		nc, err := nats.Connect(bu.URL, nopts...)
		if err != nil {
			return nil, notReached("broker", bu, err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("broker %s: JetStream: %s", bu, redactErr(err))
		}
		sink := idemnats.NewSink(js)
		b.Sink, b.JetStream = sink, js
		b.closers = append(b.closers, nc.Close, func() { _ = sink.Close() })
	case BrokerAMQP:
		sink, err := openAMQP(ctx, bu, opts)
		if err != nil {
			return nil, err
		}
		b.Sink = sink
		b.closers = append(b.closers, func() { _ = sink.Close() })
	case BrokerRedis:
		sink, closeFn, err := openRedis(ctx, bu, opts)
		if err != nil {
			return nil, err
		}
		b.Sink = sink
		b.closers = append(b.closers, closeFn)
	case BrokerSQS:
		sink, err := openSQS(ctx, bu)
		if err != nil {
			return nil, err
		}
		b.Sink = sink
		b.closers = append(b.closers, func() { _ = sink.Close() })
	}
	return b, nil
}
