package payments

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Dialect is the SQL dialect of a store the scenario runs on.
type Dialect string

// The dialects of idem's three stores.
const (
	Postgres Dialect = "postgres"
	MySQL    Dialect = "mysql" // MySQL 8 and MariaDB 10.6+
	SQLite   Dialect = "sqlite"
)

// HeaderOrder carries the order index on every message of the scenario (originals, copies,
// re-sends and poison), so that the broker's messages and the dead letters can be matched
// with the orders table whatever their event id is.
const HeaderOrder = "Scenario-Order"

// DB runs the scenario's SQL on any of the three stores. Statements are written once, with ?
// placeholders and {orders}, {ledger}, {wallets}, {emails}, {claims}, {dead_letters},
// {outbox} and {outages} for table names, plus a few fragments whose SQL differs by dialect
// ({ident}, {dl_order}, {broker_msg_id}, {dl_event_id}, {claim_event_id}); DB rewrites them
// for its dialect and schema.
type DB struct {
	pg      *pgxpool.Pool // set for PostgreSQL
	sdb     *sql.DB       // set for SQLite and MySQL
	dialect Dialect
	names   *strings.Replacer
	// schema is the PostgreSQL schema of idem's and the scenario's tables ("" elsewhere).
	schema string
}

// NewPostgresDB returns the DB of idem's tables with prefix in schema, the scenario's beside them.
func NewPostgresDB(pool *pgxpool.Pool, schema, prefix string) *DB {
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	return &DB{pg: pool, dialect: Postgres, schema: schema, names: newNames(Postgres, q, prefix)}
}

// NewSQLDB returns the DB of a SQLite or MySQL database whose idem tables start with prefix
// (the connection's current database on MySQL).
func NewSQLDB(db *sql.DB, d Dialect, prefix string) *DB {
	return &DB{sdb: db, dialect: d, names: newNames(d, func(name string) string { return name }, prefix)}
}

// jsonText is the SQL of the text value of key in the JSON object column col.
func jsonText(d Dialect, col, key string) string {
	switch d {
	case Postgres:
		return col + `->>'` + key + `'`
	case MySQL:
		// MariaDB has no ->> operator.
		return `JSON_UNQUOTE(JSON_EXTRACT(` + col + `, '$."` + key + `"'))`
	default:
		return `json_extract(` + col + `, '$."` + key + `"')`
	}
}

func newNames(d Dialect, qual func(string) string, prefix string) *strings.Replacer {
	order := jsonText(d, "d.headers", HeaderOrder)
	var dlOrder, dlEventID, claimEventID string
	switch d {
	case Postgres:
		dlOrder = `(CASE WHEN ` + order + ` ~ '^[0-9]{1,18}$' THEN (` + order + `)::bigint END)`
		dlEventID, claimEventID = "d.event_id", "c.event_id"
	case MySQL:
		dlOrder = `(CASE WHEN ` + order + ` REGEXP '^[0-9]{1,18}$' THEN CAST(` + order + ` AS SIGNED) END)`
		// idem's id columns are binary; compared as such with the scenario's utf8mb4_bin
		// columns, their indexes could not be used (a scan per row).
		dlEventID = "CONVERT(d.event_id USING utf8mb4) COLLATE utf8mb4_bin"
		claimEventID = "CONVERT(c.event_id USING utf8mb4) COLLATE utf8mb4_bin"
	default:
		dlOrder = `(CASE WHEN ` + order + ` GLOB '[0-9]*' AND NOT ` + order + ` GLOB '*[^0-9]*' AND length(` + order + `) <= 18
			THEN CAST(` + order + ` AS INTEGER) END)`
		dlEventID, claimEventID = "d.event_id", "c.event_id"
	}
	return strings.NewReplacer(
		"{orders}", qual("demo_orders"),
		"{ledger}", qual("demo_ledger"),
		"{wallets}", qual("demo_wallets"),
		"{emails}", qual("demo_emails"),
		"{claims}", qual(prefix+"claims"),
		"{dead_letters}", qual(prefix+"dead_letters"),
		"{outbox}", qual(prefix+"outbox"),
		"{outages}", qual("scenario_outages"),
		// {ident}: order o is a poison identity, matched with its dead letter by the order
		// index its message carries ({dl_order}, NULL when d carries none), not by event id.
		"{ident}", `(o.poison LIKE 'id!_%' ESCAPE '!' OR o.poison LIKE 'tenant!_%' ESCAPE '!')`,
		"{dl_order}", dlOrder,
		"{dl_event_id}", dlEventID,
		"{claim_event_id}", claimEventID,
		"{broker_msg_id}", jsonText(d, "headers", "Idem-Broker-Msg-Id"),
	)
}

// Dialect returns the DB's dialect.
func (d *DB) Dialect() Dialect { return d.dialect }

// Schema returns the PostgreSQL schema of the tables ("" on SQLite and MySQL).
func (d *DB) Schema() string { return d.schema }

// Pool returns the PostgreSQL pool (nil on SQLite and MySQL).
func (d *DB) Pool() *pgxpool.Pool { return d.pg }

// SQLDB returns the database/sql handle (nil on PostgreSQL).
func (d *DB) SQLDB() *sql.DB { return d.sdb }

// SQL fills in table names and dialect fragments and, on PostgreSQL, numbers the
// placeholders. The scenario's statements have no ? inside string literals.
func (d *DB) SQL(q string) string {
	q = d.names.Replace(q)
	if d.dialect != Postgres {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Exec runs a statement and returns the rows it affected.
func (d *DB) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	q = d.SQL(q)
	if d.pg != nil {
		tag, err := d.pg.Exec(ctx, q, args...)
		return tag.RowsAffected(), err
	}
	res, err := d.sdb.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Count runs a query returning one integer (NULL reads as 0).
func (d *DB) Count(ctx context.Context, q string, args ...any) (int, error) {
	q = d.SQL(q)
	var n sql.NullInt64
	var err error
	if d.pg != nil {
		err = d.pg.QueryRow(ctx, q, args...).Scan(&n)
	} else {
		err = d.sdb.QueryRowContext(ctx, q, args...).Scan(&n)
	}
	return int(n.Int64), err
}

// Rows runs a query and calls each with a scan function for every row.
func (d *DB) Rows(ctx context.Context, q string, args []any, each func(scan func(dest ...any) error) error) error {
	q = d.SQL(q)
	if d.pg != nil {
		rows, err := d.pg.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		return eachRow(rows, each)
	}
	rows, err := d.sdb.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return eachRow(rows, each)
}

// resultRows is what pgx.Rows and *sql.Rows share.
type resultRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// eachRow calls each for every row of rows.
func eachRow(rows resultRows, each func(scan func(dest ...any) error) error) error {
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Tables returns the statements that create the scenario's tables in dialect d.
func Tables(d Dialect) []string {
	switch d {
	case Postgres:
		return PostgresTables
	case MySQL:
		return MySQLTables
	}
	return SQLiteTables
}

// ReceiptTables returns the statements that create table (a placeholder such as {emails}) with
// the ledger's shape and an index named index, in dialect d: a second consumer of the scenario
// (the demo's e-mail one, --fanout) keeps its receipts there, append-only like the ledger, so
// that a second row is a double send.
func ReceiptTables(d Dialect, table, index string) []string {
	r := strings.NewReplacer("{ledger}", table, "demo_ledger_event", index)
	var out []string
	for _, s := range Tables(d) {
		if strings.Contains(s, "{ledger}") {
			out = append(out, r.Replace(s))
		}
	}
	return out
}

// OutageTables returns the statements that create the {outages} table in dialect d: the
// database outages a run had that were longer than its consumers' retry budget, with the grace
// after each in which a valid event may end as a retries_exhausted dead letter. Its times have
// the unit of the dead-letter table's (timestamptz on PostgreSQL, unix microseconds elsewhere).
func OutageTables(d Dialect) []string {
	if d == Postgres {
		return []string{`CREATE TABLE IF NOT EXISTS {outages} (
			started_at timestamptz NOT NULL,
			ended_at   timestamptz NOT NULL,
			grace      interval    NOT NULL)`}
	}
	return []string{`CREATE TABLE IF NOT EXISTS {outages} (
			started_at BIGINT NOT NULL,
			ended_at   BIGINT NOT NULL,
			grace      BIGINT NOT NULL)`}
}

// RecordOutage records a database outage from started to ended, after which retries_exhausted
// dead letters are excused for grace (see OutageTables and Scope.Outages).
func (d *DB) RecordOutage(ctx context.Context, started, ended time.Time, grace time.Duration) error {
	args := []any{started, ended, grace}
	if d.dialect != Postgres {
		args = []any{started.UnixMicro(), ended.UnixMicro(), grace.Microseconds()}
	}
	if _, err := d.Exec(ctx, `INSERT INTO {outages} (started_at, ended_at, grace) VALUES (?, ?, ?)`, args...); err != nil {
		return fmt.Errorf("record a database outage: %w", err)
	}
	return nil
}

// InsertValues returns "INSERT INTO table (cols) VALUES (?,…),(?,…)…" for rows rows.
func InsertValues(table string, cols []string, rows int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + table + " (" + strings.Join(cols, ", ") + ") VALUES ")
	one := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ")"
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(one)
	}
	return b.String()
}

// Placeholders returns n placeholders for an IN list: "?, ?, ?".
func Placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
