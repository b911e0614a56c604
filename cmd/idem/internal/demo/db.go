package demo

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
)

// database runs the demo's own SQL on either store. Statements are written with ? placeholders
// and {orders}, {ledger}, {wallets}, {emails}, {dead_letters}, {outbox} for table names; the database
// rewrites both for its dialect and schema.
type database struct {
	sqlite *sql.DB       // set for SQLite and MySQL (database/sql, ? placeholders)
	pg     *pgxpool.Pool // set for PostgreSQL
	mysql  bool          // sqlite is a MySQL or MariaDB database
	names  *strings.Replacer
	// schema is the PostgreSQL schema of idem's and the demo's tables ("" on SQLite).
	schema string
}

// newDatabase returns the database of an open store: the demo's tables sit beside idem's, in
// the schema of the --store URL's idem_schema on PostgreSQL.
func newDatabase(st *connect.Stores) *database {
	d := &database{}
	var prefix string
	qual := func(name string) string { return name }
	switch {
	case st.SQLite != nil:
		d.sqlite = st.SQLite.DB()
		prefix = st.SQLite.Config().Prefix
	case st.MySQL != nil:
		d.sqlite, d.mysql = st.MySQL.DB(), true
		prefix = st.MySQL.Config().Prefix
	default:
		d.pg = st.Postgres.Pool()
		cfg := st.Postgres.Config()
		prefix, d.schema = cfg.Prefix, cfg.Schema
		qual = func(name string) string { return pgx.Identifier{d.schema, name}.Sanitize() }
	}
	d.names = strings.NewReplacer(
		"{orders}", qual("demo_orders"),
		"{ledger}", qual("demo_ledger"),
		"{wallets}", qual("demo_wallets"),
		"{emails}", qual("demo_emails"),
		"{dead_letters}", qual(prefix+"dead_letters"),
		"{outbox}", qual(prefix+"outbox"),
	)
	return d
}

func (d *database) postgres() bool { return d.pg != nil }

// sql fills in table names and, on PostgreSQL, numbers the placeholders. The demo's statements
// have no ? inside string literals.
func (d *database) sql(q string) string {
	q = d.names.Replace(q)
	if !d.postgres() {
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

func (d *database) exec(ctx context.Context, q string, args ...any) error {
	q = d.sql(q)
	var err error
	if d.postgres() {
		_, err = d.pg.Exec(ctx, q, args...)
	} else {
		_, err = d.sqlite.ExecContext(ctx, q, args...)
	}
	return err
}

// count runs a query returning one integer (NULL reads as 0).
func (d *database) count(ctx context.Context, q string, args ...any) (int, error) {
	q = d.sql(q)
	var n sql.NullInt64
	var err error
	if d.postgres() {
		err = d.pg.QueryRow(ctx, q, args...).Scan(&n)
	} else {
		err = d.sqlite.QueryRowContext(ctx, q, args...).Scan(&n)
	}
	return int(n.Int64), err
}

// rows runs a query and calls each with a scan function for every row.
func (d *database) rows(ctx context.Context, q string, args []any, each func(scan func(dest ...any) error) error) error {
	q = d.sql(q)
	if d.postgres() {
		rows, err := d.pg.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := each(rows.Scan); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	rows, err := d.sqlite.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

// The e-mail consumer's receipts (--fanout), append-only like the ledger (no unique key on
// event_id: a second row is a double send), per database.
var (
	sqliteEmailTables = []string{
		`CREATE TABLE IF NOT EXISTS {emails} (
			id           INTEGER PRIMARY KEY AUTOINCREMENT,
			run_id       TEXT    NOT NULL,
			event_id     TEXT    NOT NULL,
			wallet_id    TEXT    NOT NULL,
			amount_cents INTEGER NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS demo_emails_event ON {emails} (run_id, event_id)`,
	}
	mysqlEmailTables = []string{
		`CREATE TABLE IF NOT EXISTS {emails} (
			id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
			run_id       VARCHAR(64)  NOT NULL,
			event_id     VARCHAR(255) NOT NULL,
			wallet_id    VARCHAR(64)  NOT NULL,
			amount_cents BIGINT       NOT NULL,
			KEY demo_emails_event (run_id, event_id)
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
	}
	postgresEmailTables = []string{
		`CREATE TABLE IF NOT EXISTS {emails} (
			id           bigserial PRIMARY KEY,
			run_id       text      NOT NULL,
			event_id     text      NOT NULL,
			wallet_id    text      NOT NULL,
			amount_cents bigint    NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS demo_emails_event ON {emails} (run_id, event_id)`,
	}
)

// createTables creates the demo's tables if they are missing. On PostgreSQL concurrent demos
// serialise on an advisory lock, since CREATE TABLE IF NOT EXISTS can still race.
func (d *database) createTables(ctx context.Context) error {
	if !d.postgres() {
		schema := append(slices.Clone(payments.SQLiteTables), sqliteEmailTables...)
		if d.mysql {
			schema = append(slices.Clone(payments.MySQLTables), mysqlEmailTables...)
		}
		for _, s := range schema {
			if err := d.exec(ctx, s); err != nil {
				return fmt.Errorf("create demo tables: %w", err)
			}
		}
		return nil
	}
	err := pgx.BeginFunc(ctx, d.pg, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "idem demo tables "+d.schema); err != nil {
			return err
		}
		for _, s := range append(slices.Clone(payments.PostgresTables), postgresEmailTables...) {
			if _, err := tx.Exec(ctx, d.sql(s)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create demo tables in schema %s: %w", d.schema, err)
	}
	return nil
}

// insertValues returns "INSERT INTO table (cols) VALUES (?,…),(?,…)…" for rows rows.
func insertValues(table string, cols []string, rows int) string {
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
