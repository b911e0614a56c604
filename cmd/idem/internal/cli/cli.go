// Package cli is the idem command line. cmd/idem/main.go only wires the process to Main; every
// command lives here, builds its flags on its own cobra.Command (no globals, no init) and
// writes to the writers it is given, so tests drive it exactly as a user would.
//
// Commands are grouped noun first (idem dlq list, idem dlq replay). Output meant for people
// goes to stdout as aligned tables; --json gives machines one JSON document instead. Progress
// and logs go to stderr. A failure is one line on stderr, "idem: …", naming what is wrong,
// with every password masked, and a non-zero exit code: ExitUsage for a bad invocation,
// ExitFailure for anything that went wrong while running.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem/cmd/idem/internal/demo"
	"github.com/idemkit/idem/idemredact"
)

// Exit codes of Main.
const (
	// ExitOK: the command did what was asked (for demo: the verdict is ok).
	ExitOK = 0
	// ExitFailure: a runtime failure (unreachable store, unknown dead letter, failed verdict).
	ExitFailure = 1
	// ExitUsage: the invocation is wrong (unknown command or flag, invalid flag value, a
	// missing confirmation such as --yes).
	ExitUsage = 2
)

// Environment variables the command reads.
const (
	// StoreEnv is the --store default of every command but demo.
	StoreEnv = "IDEM_STORE"
	// StoreDefault is the --store default when StoreEnv is unset.
	StoreDefault = "sqlite://idem.db"
	// DemoStoreDefault is demo's --store default. demo ignores StoreEnv on purpose: it fills
	// the store with synthetic events and must never land in a real deployment's database
	// because of an exported variable.
	DemoStoreDefault = demo.StoreDefault
)

// env is what a command may touch of the outside world; tests replace parts of it.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	now            func() time.Time
	// username names the operator for audit rows when --actor is not given ("" if unknown).
	username func() string
	// isTerminal reports whether w is an interactive terminal (for the demo progress bar).
	isTerminal func(w io.Writer) bool
}

// Main runs the idem command with args (without the program name) and returns the exit code.
// ctx ends the command early (main cancels it on SIGINT and SIGTERM); long-running commands
// such as relay shut down gracefully and return ExitOK.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return run(ctx, args, &env{
		stdin:      stdin,
		stdout:     stdout,
		stderr:     stderr,
		getenv:     os.Getenv,
		now:        time.Now,
		username:   osUsername,
		isTerminal: isTerminal,
	})
}

func run(ctx context.Context, args []string, e *env) int {
	root := newRootCmd(e)
	root.SetArgs(args)
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	var ex exitError
	code := ExitFailure
	msg := oneLine(err)
	var ue usageError
	if errors.As(err, &ue) {
		code = ExitUsage
		if cmd != nil {
			msg += fmt.Sprintf(" (see '%s --help')", cmd.CommandPath())
		}
	} else if errors.As(err, &ex) {
		code = ex.code
	} else if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		msg = "interrupted"
	}
	fmt.Fprintln(e.stderr, "idem: "+msg)
	return code
}

// newRootCmd builds the whole command tree for one run.
func newRootCmd(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "idem",
		Short: "Exactly-once effects over at-least-once delivery",
		Long: `idem operates the exactly-once toolkit: it migrates the store, runs the outbox
relay, inspects and replays the dead-letter queue, collects old claims, reports status, and runs
a self-checking demo.

Every command takes --store: sqlite://PATH, postgres://USER:PASSWORD@HOST:PORT/DB (add
?idem_schema=NAME for a schema other than public) or mysql://USER:PASSWORD@HOST:PORT/DB (MySQL 8
or MariaDB 10.6+). Without --store, commands use $` + StoreEnv + `
if set, else ` + StoreDefault + ` (demo uses ` + DemoStoreDefault + `). Commands that publish take
--broker: sql (the queue table in the store), nats://HOST:PORT, amqp://USER:PASSWORD@HOST:PORT/VHOST,
redis://USER:PASSWORD@HOST:PORT/DB or sqs://HOST:PORT?region=REGION. Passwords are never printed.

Exit status: 0 ok, 1 failure (or demo verdict not ok), 2 usage error.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.ArbitraryArgs,
		RunE:          groupRunE,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		newDemoCmd(e),
		newMigrateCmd(e),
		newRelayCmd(e),
		newGCCmd(e),
		newStatusCmd(e),
		newDLQCmd(e),
		newQueueCmd(e),
		newServeCmd(e),
		newBenchCmd(e),
		newChaosCmd(e),
		newChaosRoleCmd(e),
		newChaosSQLiteRoleCmd(e),
		newVersionCmd(e),
	)
	return root
}

// groupRunE is the RunE of commands that only group others (idem, idem dlq): without arguments
// it shows help, with one it reports the unknown command (cobra would show help and succeed).
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf("; did you mean %q?", s[0])
	}
	return usageError{errors.New(msg)}
}

// usageError is a wrong invocation: exit code ExitUsage.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// usagef returns a usageError.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// exitError ends the command with code, for failures that are neither a usage error nor
// ExitFailure, or that must not get the usage hint.
type exitError struct {
	code int
	err  error
}

func (x exitError) Error() string {
	if x.err == nil {
		return fmt.Sprintf("exit %d", x.code)
	}
	return x.err.Error()
}
func (x exitError) Unwrap() error { return x.err }

// noArgs and exactArgs report extra or missing positional arguments as usage errors.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args[0])
	}
	return nil
}

// oneLine makes err printable as one line: the lines of a multi-line error (errors.Join, pgx's
// per-host connect errors) are trimmed, repeated ones dropped and the rest joined, a repeated
// "idem: " prefix goes, and anything that looks like a password in a URL or key=value pair is
// masked as a last line of defence.
func oneLine(err error) string {
	var (
		b    strings.Builder
		seen = map[string]bool{}
	)
	for _, line := range strings.FieldsFunc(err.Error(), func(r rune) bool { return r == '\n' || r == '\r' }) {
		line = strings.Join(strings.Fields(line), " ")
		if line == "" || seen[line] {
			continue
		}
		seen[line] = true
		if b.Len() > 0 {
			if strings.HasSuffix(b.String(), ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(line)
	}
	s := b.String()
	for strings.HasPrefix(s, "idem: ") {
		s = strings.TrimPrefix(s, "idem: ")
	}
	return escapeControls(idemredact.MaskText(s))
}

// osUsername is the operator's login name, from the OS or $USER.
func osUsername() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return os.Getenv("USER")
}

// isTerminal reports whether w is a character device (a terminal rather than a file or pipe).
// golang.org/x/term is in the module graph but not required by go.mod, and this check is all
// the progress bar needs.
func isTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Stat() (os.FileInfo, error) })
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
