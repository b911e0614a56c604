package sqliteload

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// envArgs carries a role process's arguments (JSON) to the test binary.
const envArgs = "IDEM_SQLITELOAD_ARGS"

func TestMain(m *testing.M) {
	if a := os.Getenv(envArgs); a != "" {
		var args []string
		if err := json.Unmarshal([]byte(a), &args); err != nil {
			fmt.Fprintf(os.Stderr, "sqliteload: %s: %v\n", envArgs, err)
			os.Exit(2)
		}
		if err := RoleMain(context.Background(), args, os.Stdin, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintf(os.Stderr, "sqliteload %s: %v\n", args[0], err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testCommand runs a role in a process of this test binary.
func testCommand(args []string) *exec.Cmd {
	b, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envArgs+"="+string(b))
	return cmd
}

// TestThreeProcesses runs producer, relay and consumer as three processes of this test binary
// on one SQLite file with a backlog and handlers that hold their transaction, first under load
// alone (15 s) and then SIGKILLing a random one every 1–3 s for 20 s (the short form of `idem chaos --store
// sqlite://…`). Afterwards the database must show no event applied twice, none lost, nothing
// pending, and integrity_check ok; without kills every role must also make progress in every
// 2-second window and no SQLITE_BUSY may reach it.
func TestThreeProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("a 15 s load test and a 20 s crash test; not in -short")
	}
	for _, tc := range []struct {
		name     string
		noKills  bool
		duration time.Duration
	}{
		{"load", true, 15 * time.Second},
		{"crash", false, 20 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			rep, err := Run(context.Background(), Options{
				Path:           filepath.Join(t.TempDir(), "load.db"),
				Duration:       tc.duration,
				DrainTimeout:   time.Minute,
				Backlog:        2000,
				NoKills:        tc.noKills,
				ProgressWindow: 2 * time.Second,
				Command:        testCommand,
				Out:            &out,
			})
			require.NoError(t, err)
			var table strings.Builder
			require.NoError(t, rep.WriteTable(&table))
			t.Logf("%s\n%s", out.String(), table.String())
			require.True(t, rep.OK, "violations: %v", rep.Violations)
			require.True(t, rep.Drained)
			require.Positive(t, rep.Applied)
			for _, r := range rep.Roles {
				require.Positive(t, r.Total, "%s made no progress", r.Role)
				if tc.noKills {
					require.Zero(t, r.Busy, "%s saw SQLITE_BUSY: %q", r.Role, r.FirstError)
					require.Zero(t, r.Errors, "%s saw errors: %q", r.Role, r.FirstError)
					require.Positive(t, r.Floor, "%s made no progress in some 2 s window: %v", r.Role, r.PerSecond)
				}
			}
			if !tc.noKills {
				require.Positive(t, rep.Kills)
			}
		})
	}
}
