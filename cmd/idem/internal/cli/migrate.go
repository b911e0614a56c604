package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem/cmd/idem/internal/connect"
)

func newMigrateCmd(e *env) *cobra.Command {
	var (
		store    string
		printSQL bool
	)
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or update idem's tables in the store",
		Long: `migrate applies every embedded migration the store has not applied yet (claims, dead
letters and audit, queue table, outbox and leases), each recorded in a version table. Running it
again does nothing. --print writes the SQL instead, for teams that run their own migration tool;
it does not connect to the store.`,
		Example: `  idem migrate --store sqlite://app.db
  idem migrate --store 'postgres://app@db:5432/app?idem_schema=idem'
  idem migrate --store postgres://app@db/app --print > idem.sql
  idem migrate --store mysql://app:secret@db:3306/app`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn := e.resolveStore(store)
			if printSQL {
				sql, err := connect.MigrationSQL(dsn)
				if err != nil {
					return usageError{fmt.Errorf("--store: %w", err)}
				}
				_, err = io.WriteString(e.stdout, sql)
				return err
			}
			s, err := e.openStore(cmd.Context(), store, false)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.Migrator.Migrate(cmd.Context()); err != nil {
				return fmt.Errorf("migrate store %s: %w", s.URL, err)
			}
			_, err = fmt.Fprintf(e.stdout, "store %s is migrated\n", s.URL)
			return err
		},
	}
	storeFlag(cmd, &store)
	cmd.Flags().BoolVar(&printSQL, "print", false, "write the migrations' SQL to stdout instead of applying them")
	return cmd
}
