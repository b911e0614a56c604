package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem/cmd/idem/internal/sqliteload"
)

// sqliteRoleCommand is the hidden command `idem chaos --store sqlite://…` starts its role
// processes with.
const sqliteRoleCommand = "chaos-sqlite-role"

// sqliteChaos holds what `idem chaos` passes to its SQLite mode.
type sqliteChaos struct {
	path                   string
	duration, drainTimeout time.Duration
	seed                   int64
	asJSON                 bool
}

// runSQLiteChaos is `idem chaos --store sqlite://…`: producer, relay and consumer as processes of
// this binary on one SQLite file, SIGKILLed every 1–3 s, then drained and checked from the file
// (sqliteload.Run). It exits 1 on a broken guarantee.
func runSQLiteChaos(ctx context.Context, e *env, c sqliteChaos) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("chaos: find the idem binary: %w", err)
	}
	o := sqliteload.Options{
		Path: c.path, Duration: c.duration, DrainTimeout: c.drainTimeout, Seed: c.seed,
		Command: func(args []string) *exec.Cmd {
			return exec.Command(exe, append([]string{sqliteRoleCommand}, args...)...)
		},
	}
	if !c.asJSON {
		o.Out = e.stderr
	}
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return usageError{err}
	}
	rep, err := sqliteload.Run(ctx, o)
	if err != nil {
		return err
	}
	return writeChaosReport(e, c.asJSON, rep, rep.OK, rep.Violations)
}

// writeChaosReport prints a chaos run's report, as a table or JSON, and turns a broken
// guarantee into the exit code ExitFailure; both modes (PostgreSQL or MySQL, and SQLite) end so.
func writeChaosReport(e *env, asJSON bool, rep interface{ WriteTable(io.Writer) error }, ok bool, violations []string) error {
	var err error
	if asJSON {
		err = writeJSON(e.stdout, rep)
	} else {
		err = rep.WriteTable(e.stdout)
	}
	if err != nil {
		return err
	}
	if !ok {
		return exitError{code: ExitFailure, err: fmt.Errorf("chaos: %d violations: %s", len(violations), strings.Join(violations, "; "))}
	}
	return nil
}

// newChaosSQLiteRoleCmd is the hidden command that runs one role of the SQLite chaos.
func newChaosSQLiteRoleCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:                sqliteRoleCommand,
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return sqliteload.RoleMain(cmd.Context(), args, e.stdin, e.stdout, e.stderr)
		},
	}
}
