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
// placeholders. migration/partitioned holds the variants that replace a migration of the same
// name when Config.Partition is set, with a {{bucket_unit}} placeholder ("day" or "hour"): the
// layout changes what a version creates, never which versions exist.
//
//go:embed migration/*.sql migration/partitioned/*.sql
var migrationFS embed.FS

// migration is one embedded migration with the schema and prefix substituted.
type migration struct {
	version int
	name    string // file name, "001_claims.up.sql"
	sql     string
	// partitioned marks the partitioned variant of a migration.
	partitioned bool
}

// loadMigrations reads the embedded migrations in version order, takes the partitioned variants
// when bucket is not 0, and substitutes schema, prefix and bucket unit into them.
func loadMigrations(schema, prefix string, bucket time.Duration) ([]migration, error) {
	r := strings.NewReplacer("{{schema}}", schema, "{{prefix}}", prefix, "{{bucket_unit}}", bucketUnit(bucket))
	read := func(dir string) (map[string]string, error) {
		entries, err := fs.ReadDir(migrationFS, dir)
		if err != nil {
			return nil, fmt.Errorf("idempg: read embedded migrations: %w", err)
		}
		files := make(map[string]string, len(entries))
		for _, e := range entries {
			if e.IsDir() {
				continue
			}
			body, err := migrationFS.ReadFile(path.Join(dir, e.Name()))
			if err != nil {
				return nil, fmt.Errorf("idempg: read embedded migration %s: %w", e.Name(), err)
			}
			files[e.Name()] = r.Replace(string(body))
		}
		return files, nil
	}
	base, err := read("migration")
	if err != nil {
		return nil, err
	}
	variants, err := read("migration/partitioned")
	if err != nil {
		return nil, err
	}
	var migs []migration
	for name, sql := range base {
		num, _, ok := strings.Cut(name, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || version <= 0 || !strings.HasSuffix(name, ".up.sql") {
			return nil, fmt.Errorf("idempg: embedded migration %s: want a name like 001_name.up.sql", name)
		}
		m := migration{version: version, name: name, sql: sql}
		if v, ok := variants[name]; ok && bucket != 0 {
			m.sql, m.partitioned = v, true
		}
		migs = append(migs, m)
	}
	for name := range variants {
		if _, ok := base[name]; !ok {
			return nil, fmt.Errorf("idempg: embedded partitioned migration %s replaces no migration", name)
		}
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

// bucketUnit names a bucket width as date_trunc does.
func bucketUnit(bucket time.Duration) string {
	if bucket == time.Hour {
		return "hour"
	}
	return "day"
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
//
// The claims table's layout (plain, or partitioned by Config.Partition.Bucket) is fixed when it
// is created: Migrate refuses, changing nothing, a database whose claims table has another
// layout or bucket width than the config, and checks again after migrating (a migrator with
// another config may have created it meanwhile). On a partitioned store it then refuses a
// default transaction isolation above READ COMMITTED (see Store.ClaimTx) and creates the
// partitions from the retention horizon to Partition.Ahead past now (EnsurePartitions).
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.checkLayout(ctx); err != nil {
		return err
	}
	for _, m := range s.migrations {
		if err := s.migrate(ctx, m); err != nil {
			return err
		}
	}
	if err := s.checkLayout(ctx); err != nil {
		return err
	}
	if s.bucket != 0 {
		var level string
		if err := s.pool.QueryRow(ctx, `SELECT current_setting('default_transaction_isolation')`).Scan(&level); err != nil {
			return fmt.Errorf("idempg: read default_transaction_isolation: %w", err)
		}
		if level != "read committed" {
			return fmt.Errorf("idempg: Config.Partition is set, but the database's default_transaction_isolation is %q: %w",
				level, isolationError(level))
		}
		if _, err := s.EnsurePartitions(ctx, time.Now()); err != nil {
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
//
// With Config.Partition set it holds the partitioned claims table, but no partition: those
// depend on the date, and the application creates them with EnsurePartitions.
func (s *Store) MigrationSQL() string {
	var b strings.Builder
	fmt.Fprintf(&b, "-- idem PostgreSQL schema: schema %s, prefix %q\n", s.cfg.Schema, s.cfg.Prefix)
	if s.bucket != 0 {
		fmt.Fprintf(&b, "-- Claims partitioned by %s of their creation time; create the partitions with\n"+
			"-- Store.EnsurePartitions (Migrate calls it) before consuming, and at least every %v after.\n",
			bucketUnit(s.bucket), s.cfg.Partition.Ahead)
	}
	b.WriteString("\n")
	b.WriteString(s.q.createSchema)
	b.WriteString(";\n")
	for _, m := range s.migrations {
		variant := ""
		if m.partitioned {
			variant = " (partitioned by " + bucketUnit(s.bucket) + ")"
		}
		fmt.Fprintf(&b, "\n-- Migration %03d: %s%s\n\n", m.version, m.name, variant)
		b.WriteString(strings.TrimSpace(m.sql))
		b.WriteString("\n")
	}
	return b.String()
}
