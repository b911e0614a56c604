package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem/cmd/idem/internal/connect"
)

// migrationJSON is one migration in idem migrate --json.
type migrationJSON struct {
	Version int64  `json:"version"`
	Name    string `json:"name"`
}

// migrateJSON is the output of idem migrate --json (and --status --json).
type migrateJSON struct {
	Store string `json:"store"`
	// Applied lists what this run applied (empty with --status, or when up to date).
	Applied []migrationJSON `json:"applied"`
	// Migrations lists every migration recorded in the store, oldest first.
	Migrations []migrationJSON `json:"migrations"`
}

func newMigrateCmd(e *env) *cobra.Command {
	var (
		store    string
		printSQL bool
		status   bool
		jsonOut  bool
	)
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or update idem's tables in the store",
		Long: `migrate applies every embedded migration the store has not applied yet (claims, dead
letters and audit, queue table, outbox and leases), each recorded in a version table, and says
which it applied. Running it again does nothing. --status lists the migrations the store has
recorded without applying any. --print writes the SQL instead, for teams that run their own
migration tool; it does not connect to the store.`,
		Example: `  idem migrate --store sqlite://app.db
  idem migrate --store 'postgres://app@db:5432/app?idem_schema=idem'
  idem migrate --store postgres://app@db/app --status --json
  idem migrate --store postgres://app@db/app --print > idem.sql
  idem migrate --store mysql://app:secret@db:3306/app`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			dsn := e.resolveStore(store)
			if printSQL {
				if status || jsonOut {
					return usagef("--print writes SQL: it takes neither --status nor --json")
				}
				sql, err := connect.MigrationSQL(dsn)
				if err != nil {
					return usageError{fmt.Errorf("--store: %w", err)}
				}
				_, err = io.WriteString(e.stdout, sql)
				return err
			}
			s, err := e.openStore(ctx, store, false)
			if err != nil {
				return err
			}
			defer s.Close()
			out := migrateJSON{Store: s.URL.String(), Applied: []migrationJSON{}}
			// A store never migrated has no version table yet: nothing is recorded.
			before, _ := recordedMigrations(ctx, s)
			if !status {
				if err := s.Migrator.Migrate(ctx); err != nil {
					return fmt.Errorf("migrate store %s: %w", s.URL, err)
				}
			}
			after, err := recordedMigrations(ctx, s)
			if err != nil {
				if !status {
					return storeErr(s, "list applied migrations", err)
				}
				after = nil // never migrated
			}
			seen := map[int64]bool{}
			for _, m := range before {
				seen[m.Version] = true
			}
			for _, m := range after {
				if !seen[m.Version] {
					out.Applied = append(out.Applied, m)
				}
			}
			out.Migrations = append([]migrationJSON{}, after...)
			if jsonOut {
				return writeJSON(e.stdout, out)
			}
			w := e.stdout
			switch {
			case status && len(after) == 0:
				_, err = fmt.Fprintf(w, "store %s has no idem migrations recorded: run idem migrate\n", s.URL)
				return err
			case status:
				fmt.Fprintf(w, "store %s has %d migrations recorded:\n", s.URL, len(after))
				t := newTable(w, "VERSION", "NAME")
				for _, m := range after {
					t.row(fmt.Sprintf("%03d", m.Version), m.Name)
				}
				return t.flush()
			case len(out.Applied) == 0:
				_, err = fmt.Fprintf(w, "store %s is migrated: nothing to apply (%d migrations recorded, latest %s)\n", s.URL, len(after), migrationName(after[len(after)-1]))
				return err
			}
			names := make([]string, len(out.Applied))
			for i, m := range out.Applied {
				names[i] = migrationName(m)
			}
			_, err = fmt.Fprintf(w, "store %s is migrated: applied %d (%s)\n", s.URL, len(names), strings.Join(names, ", "))
			return err
		},
	}
	storeFlag(cmd, &store)
	cmd.Flags().BoolVar(&printSQL, "print", false, "write the migrations' SQL to stdout instead of applying them")
	cmd.Flags().BoolVar(&status, "status", false, "list the migrations the store has recorded; apply nothing")
	jsonFlag(cmd, &jsonOut)
	return cmd
}

// migrationName is "090_dead_letter_owner" for version 90, name "dead_letter_owner" (stores
// record the name with or without the version prefix and the .up.sql suffix).
func migrationName(m migrationJSON) string {
	name := strings.TrimSuffix(m.Name, ".up.sql")
	if prefix := fmt.Sprintf("%03d_", m.Version); !strings.HasPrefix(name, prefix) {
		name = prefix + name
	}
	return name
}

// recordedMigrations reads the store's version table, oldest first.
func recordedMigrations(ctx context.Context, s *connect.Stores) ([]migrationJSON, error) {
	var out []migrationJSON
	err := queryStore(ctx, s, "migrations", func(table, _ string) string {
		return `SELECT version, name FROM ` + table + ` ORDER BY version`
	}, nil, func(scan func(...any) error) error {
		var m migrationJSON
		if err := scan(&m.Version, &m.Name); err != nil {
			return err
		}
		out = append(out, m)
		return nil
	})
	return out, err
}
