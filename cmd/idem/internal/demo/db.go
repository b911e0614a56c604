package demo

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
)

// newDatabase returns the scenario's database over an open store: the demo's tables sit beside
// idem's, in the schema of the --store URL's idem_schema on PostgreSQL.
func newDatabase(st *connect.Stores) *payments.DB {
	switch {
	case st.SQLite != nil:
		return payments.NewSQLDB(st.SQLite.DB(), payments.SQLite, st.SQLite.Config().Prefix)
	case st.MySQL != nil:
		return payments.NewSQLDB(st.MySQL.DB(), payments.MySQL, st.MySQL.Config().Prefix)
	}
	cfg := st.Postgres.Config()
	return payments.NewPostgresDB(st.Postgres.Pool(), cfg.Schema, cfg.Prefix)
}

// createTables creates the demo's tables if they are missing. On PostgreSQL concurrent demos
// serialise on an advisory lock, since CREATE TABLE IF NOT EXISTS can still race.
func createTables(ctx context.Context, d *payments.DB) error {
	// The e-mail consumer's receipts (--fanout) have the ledger's shape.
	schema := slices.Concat(payments.Tables(d.Dialect()), payments.ReceiptTables(d.Dialect(), "{emails}", "demo_emails_event"))
	if d.Dialect() != payments.Postgres {
		for _, s := range schema {
			if _, err := d.Exec(ctx, s); err != nil {
				return fmt.Errorf("create demo tables: %w", err)
			}
		}
		return nil
	}
	err := pgx.BeginFunc(ctx, d.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "idem demo tables "+d.Schema()); err != nil {
			return err
		}
		for _, s := range schema {
			if _, err := tx.Exec(ctx, d.SQL(s)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create demo tables in schema %s: %w", d.Schema(), err)
	}
	return nil
}
