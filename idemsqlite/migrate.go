package idemsqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

// migrationFS holds the versioned schema, NNN_name.up.sql, with {{prefix}} where the table
// prefix goes.
//
//go:embed migration/*.sql
var migrationFS embed.FS

// prefixPlaceholder is replaced by Config.Prefix in every migration.
const prefixPlaceholder = "{{prefix}}"

// migration is one embedded schema version.
type migration struct {
	Version int
	Name    string
	SQL     string // with the placeholder
}

// migrations returns the embedded migrations in version order.
func migrations() ([]migration, error) {
	names, err := fs.Glob(migrationFS, "migration/*.up.sql")
	if err != nil {
		return nil, err
	}
	ms := make([]migration, 0, len(names))
	for _, n := range names {
		base := strings.TrimSuffix(path.Base(n), ".up.sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("idemsqlite: migration file %s: name must be NNN_name.up.sql", n)
		}
		b, err := migrationFS.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("idemsqlite: read migration %s: %w", n, err)
		}
		ms = append(ms, migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("idemsqlite: two migrations have version %d", ms[i].Version)
		}
	}
	return ms, nil
}

// migrationsTable is the DDL of the version table, with the placeholder.
const migrationsTable = `CREATE TABLE IF NOT EXISTS {{prefix}}migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL -- unix microseconds, UTC
);
`

func (s *Store) sub(sql string) string {
	return strings.ReplaceAll(sql, prefixPlaceholder, s.cfg.Prefix)
}

// Migrate applies every embedded migration not yet recorded in the {prefix}migrations table, in
// version order, each in a transaction of its own together with its version row. It first reads
// the applied versions without a transaction, so that on an up-to-date database it takes no
// write lock and does not wait for another process's writes. Running it again, or from two
// processes at once, applies nothing twice: each transaction checks the version again under
// the write lock.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	applied, err := s.appliedVersions(ctx, s.db)
	if err != nil {
		return err
	}
	var pending []migration
	for _, m := range ms {
		if !applied[m.Version] {
			pending = append(pending, m)
		}
	}
	if len(pending) == 0 {
		return nil
	}
	if err := s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, s.sub(migrationsTable))
		return err
	}); err != nil {
		return fmt.Errorf("idemsqlite: create %smigrations: %w", s.cfg.Prefix, err)
	}
	for _, m := range pending {
		if err := s.applyMigration(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// querier is a *sql.DB or *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// appliedVersions reads the versions recorded in {prefix}migrations; none when the table does
// not exist yet. It is a plain read: in WAL mode it never waits for the write lock.
func (s *Store) appliedVersions(ctx context.Context, q querier) (map[int]bool, error) {
	applied := make(map[int]bool)
	var n int
	rows, err := q.QueryContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`,
		s.cfg.Prefix+"migrations")
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: read applied migrations: %w", err)
	}
	if rows.Next() {
		err = rows.Scan(&n)
	}
	err = errors.Join(err, rows.Err(), rows.Close())
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: read applied migrations: %w", err)
	}
	if n == 0 {
		return applied, nil
	}
	rows, err = q.QueryContext(ctx, s.sub(`SELECT version FROM {{prefix}}migrations`))
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: read applied migrations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("idemsqlite: read applied migrations: %w", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemsqlite: read applied migrations: %w", err)
	}
	return applied, nil
}

// applyMigration applies m in a transaction of its own with its version row, unless the
// version is recorded by then (another process applied it since Migrate read the versions).
func (s *Store) applyMigration(ctx context.Context, m migration) error {
	return s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var one int
		err := tx.QueryRowContext(ctx, s.sub(`SELECT 1 FROM {{prefix}}migrations WHERE version = ?`), m.Version).Scan(&one)
		if err == nil {
			return nil // applied meanwhile
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("idemsqlite: migration %03d_%s: read version: %w", m.Version, m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, s.sub(m.SQL)); err != nil {
			return fmt.Errorf("idemsqlite: migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, s.sub(`INSERT INTO {{prefix}}migrations (version, name, applied_at) VALUES (?, ?, ?)`),
			m.Version, m.Name, time.Now().UnixMicro()); err != nil {
			return fmt.Errorf("idemsqlite: migration %03d_%s: record version: %w", m.Version, m.Name, err)
		}
		return nil
	})
}

// MigrationSQL returns all migrations as one plain SQL script with the configured prefix, for
// teams that run their own migration tool. It also creates and fills the version table, so that
// a later Migrate finds everything applied and does nothing.
func (s *Store) MigrationSQL() string {
	ms, err := migrations()
	if err != nil {
		// The migrations are embedded and checked by the tests; report it in the script.
		return "-- idemsqlite: " + err.Error() + "\n"
	}
	var b strings.Builder
	b.WriteString("-- idem schema for SQLite, table prefix " + s.cfg.Prefix + "\n\n")
	b.WriteString(s.sub(migrationsTable))
	for _, m := range ms {
		fmt.Fprintf(&b, "\n-- %03d_%s\n\n", m.Version, m.Name)
		b.WriteString(s.sub(m.SQL))
		fmt.Fprintf(&b, "\nINSERT OR IGNORE INTO %smigrations (version, name, applied_at)\n"+
			"    VALUES (%d, '%s', CAST(unixepoch('subsec') * 1000000 AS INTEGER));\n",
			s.cfg.Prefix, m.Version, m.Name)
	}
	return b.String()
}
