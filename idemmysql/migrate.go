package idemmysql

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
// prefix goes. Statements end with a semicolon at the end of a line.
//
//go:embed migration/*.sql
var migrationFS embed.FS

// prefixPlaceholder is replaced by Config.Prefix in every migration.
const prefixPlaceholder = "{{prefix}}"

// migrateLockTimeout bounds how long Migrate waits for another process's migration.
const migrateLockTimeout = 60

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
			return nil, fmt.Errorf("idemmysql: migration file %s: name must be NNN_name.up.sql", n)
		}
		b, err := migrationFS.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("idemmysql: read migration %s: %w", n, err)
		}
		ms = append(ms, migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("idemmysql: two migrations have version %d", ms[i].Version)
		}
	}
	return ms, nil
}

// statements splits a migration into its statements: the driver runs one per call unless the
// DSN allows multiple statements, which idem does not require. A chunk of comments only is
// dropped.
func statements(script string) []string {
	var out []string
	for _, chunk := range strings.Split(script, ";\n") {
		code := false
		for _, line := range strings.Split(chunk, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "--") {
				code = true
				break
			}
		}
		if code {
			out = append(out, strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(chunk), ";")))
		}
	}
	return out
}

// migrationsTable is the DDL of the version table, with the placeholder.
const migrationsTable = `CREATE TABLE IF NOT EXISTS {{prefix}}migrations (
    version    INT          NOT NULL,
    name       VARCHAR(200) NOT NULL,
    applied_at BIGINT       NOT NULL COMMENT 'unix microseconds, UTC',
    PRIMARY KEY (version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
`

func (s *Store) sub(sql string) string {
	return strings.ReplaceAll(sql, prefixPlaceholder, s.cfg.Prefix)
}

// Migrate applies every embedded migration not yet recorded in the {prefix}migrations table, in
// version order. MySQL commits DDL implicitly, so a migration cannot share a transaction with
// its version row; instead every statement is idempotent (CREATE TABLE IF NOT EXISTS), a
// migration interrupted halfway is finished by the next run, and concurrent migrators of the
// same database and prefix take turns under a named lock (GET_LOCK) held on one connection.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idemmysql: migrate: connect: %w", err)
	}
	defer conn.Close()
	var db sql.NullString
	if err := conn.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&db); err != nil {
		return fmt.Errorf("idemmysql: migrate: current database: %w", err)
	}
	if !db.Valid {
		return errors.New("idemmysql: migrate: the connection has no current database: name one in the DSN (user@tcp(host:3306)/dbname)")
	}
	// Lock names are at most 64 characters; a long database name is cut, which at worst makes
	// two databases' migrations take turns.
	lock := "idem_migrate " + s.cfg.Prefix + " " + db.String
	if len(lock) > 64 {
		lock = lock[:64]
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, ?)`, lock, migrateLockTimeout).Scan(&got); err != nil {
		return fmt.Errorf("idemmysql: migrate: lock %q: %w", lock, err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("idemmysql: migrate: another migration held lock %q for %d s", lock, migrateLockTimeout)
	}
	defer func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `DO RELEASE_LOCK(?)`, lock)
	}()
	if _, err := conn.ExecContext(ctx, s.sub(migrationsTable)); err != nil {
		return fmt.Errorf("idemmysql: create %smigrations: %w", s.cfg.Prefix, err)
	}
	for _, m := range ms {
		if err := s.applyMigration(ctx, conn, m); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) applyMigration(ctx context.Context, conn *sql.Conn, m migration) error {
	var one int
	err := conn.QueryRowContext(ctx, s.sub(`SELECT 1 FROM {{prefix}}migrations WHERE version = ?`), m.Version).Scan(&one)
	if err == nil {
		return nil // applied before
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("idemmysql: migration %03d_%s: read version: %w", m.Version, m.Name, err)
	}
	for i, stmt := range statements(s.sub(m.SQL)) {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("idemmysql: migration %03d_%s, statement %d: %w", m.Version, m.Name, i+1, err)
		}
	}
	if _, err := conn.ExecContext(ctx, s.sub(`INSERT INTO {{prefix}}migrations (version, name, applied_at) VALUES (?, ?, ?)`),
		m.Version, m.Name, time.Now().UnixMicro()); err != nil {
		return fmt.Errorf("idemmysql: migration %03d_%s: record version: %w", m.Version, m.Name, err)
	}
	return nil
}

// MigrationSQL returns all migrations as one plain SQL script with the configured prefix, for
// teams that run their own migration tool. It also creates and fills the version table, so that
// a later Migrate finds everything applied and does nothing.
func (s *Store) MigrationSQL() string {
	ms, err := migrations()
	if err != nil {
		// The migrations are embedded and checked by the tests; report it in the script.
		return "-- idemmysql: " + err.Error() + "\n"
	}
	var b strings.Builder
	b.WriteString("-- idem schema for MySQL 8 and MariaDB 10.6+, table prefix " + s.cfg.Prefix + "\n\n")
	b.WriteString(s.sub(migrationsTable))
	for _, m := range ms {
		fmt.Fprintf(&b, "\n-- %03d_%s\n\n", m.Version, m.Name)
		b.WriteString(s.sub(m.SQL))
		fmt.Fprintf(&b, "\nINSERT IGNORE INTO %smigrations (version, name, applied_at)\n"+
			"    VALUES (%d, '%s', CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED));\n",
			s.cfg.Prefix, m.Version, m.Name)
	}
	return b.String()
}
