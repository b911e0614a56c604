package idempg

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// migrationFS holds the versioned migrations, NNN_name.up.sql, with {{schema}} and {{prefix}}
// placeholders.
//
//go:embed migration/*.sql
var migrationFS embed.FS

// migration is one embedded migration with the schema and prefix substituted.
type migration struct {
	version int
	name    string // file name, "001_claims.up.sql"
	sql     string
}

// loadMigrations reads the embedded migrations in version order and substitutes schema and
// prefix into them.
func loadMigrations(schema, prefix string) ([]migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migration")
	if err != nil {
		return nil, fmt.Errorf("idempg: read embedded migrations: %w", err)
	}
	r := strings.NewReplacer("{{schema}}", schema, "{{prefix}}", prefix)
	var migs []migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || version <= 0 || !strings.HasSuffix(name, ".up.sql") {
			return nil, fmt.Errorf("idempg: embedded migration %s: want a name like 001_name.up.sql", name)
		}
		body, err := migrationFS.ReadFile(path.Join("migration", name))
		if err != nil {
			return nil, fmt.Errorf("idempg: read embedded migration %s: %w", name, err)
		}
		migs = append(migs, migration{version: version, name: name, sql: r.Replace(string(body))})
	}
	sort.Slice(migs, func(i, j int) bool { return migs[i].version < migs[j].version })
	for i := 1; i < len(migs); i++ {
		if migs[i].version == migs[i-1].version {
			return nil, fmt.Errorf("idempg: embedded migrations %s and %s share version %d",
				migs[i-1].name, migs[i].name, migs[i].version)
		}
	}
	return migs, nil
}

// advisoryKey hashes s to a pg_advisory_xact_lock key.
func advisoryKey(s string) int64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return int64(h.Sum64())
}

// Migrate applies every embedded migration not yet applied, in version order, each in a
// transaction of its own that also records it in the {prefix}migrations table. Every one of
// those transactions first takes a transaction-scoped advisory lock for this schema and prefix,
// so concurrent migrators (several replicas starting at once) serialise and each migration is
// applied once. The schema is created when it is missing. Running Migrate again is a no-op.
func (s *Store) Migrate(ctx context.Context) error {
	for _, m := range s.migrations {
		if err := s.migrate(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// migrate applies m unless it already is.
func (s *Store) migrate(ctx context.Context, m migration) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", s.migrateLock); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		// CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the database even when the
		// schema exists, so look first.
		var exists bool
		if err := tx.QueryRow(ctx, s.q.schemaExists, s.cfg.Schema).Scan(&exists); err != nil {
			return fmt.Errorf("look for schema %s: %w", s.cfg.Schema, err)
		}
		if !exists {
			if _, err := tx.Exec(ctx, s.q.createSchema); err != nil {
				return fmt.Errorf("create schema %s: %w", s.cfg.Schema, err)
			}
		}
		if _, err := tx.Exec(ctx, s.q.createMigrations); err != nil {
			return fmt.Errorf("create migrations table: %w", err)
		}
		var applied bool
		if err := tx.QueryRow(ctx, s.q.migrationApplied, m.version).Scan(&applied); err != nil {
			return fmt.Errorf("read migrations table: %w", err)
		}
		if applied {
			return nil
		}
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.q.migrationRecord, m.version, m.name, time.Now().UTC()); err != nil {
			return fmt.Errorf("record: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("idempg: migration %s (schema %s, prefix %q): %w", m.name, s.cfg.Schema, s.cfg.Prefix, err)
	}
	return nil
}

// MigrationSQL returns every migration as plain SQL for the configured schema and prefix, each
// under a comment naming it, for teams that run their own migration tool. It starts by creating
// the schema; it does not write the {prefix}migrations table, which only Migrate uses. Every
// statement is idempotent (IF NOT EXISTS).
func (s *Store) MigrationSQL() string {
	var b strings.Builder
	fmt.Fprintf(&b, "-- idem PostgreSQL schema: schema %s, prefix %q\n\n", s.cfg.Schema, s.cfg.Prefix)
	b.WriteString(s.q.createSchema)
	b.WriteString(";\n")
	for _, m := range s.migrations {
		fmt.Fprintf(&b, "\n-- Migration %03d: %s\n\n", m.version, m.name)
		b.WriteString(strings.TrimSpace(m.sql))
		b.WriteString("\n")
	}
	return b.String()
}
