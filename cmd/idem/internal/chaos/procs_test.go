//go:build unix

package chaos

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// shSupervisor runs `sh -c script` as every process (the flags the supervisor appends become
// ignored positional parameters).
func shSupervisor(t *testing.T, ctx context.Context, script string) (*supervisor, func() []string, func() map[string]int) {
	t.Helper()
	var mu sync.Mutex
	var logs []string
	counters := map[string]int{}
	s := newSupervisor(ctx, "/bin/sh", []string{"-c", script, "sh"}, false,
		func(f string, args ...any) { mu.Lock(); logs = append(logs, fmt.Sprintf(f, args...)); mu.Unlock() },
		func(_, c string, n int) { mu.Lock(); counters[c] += n; mu.Unlock() })
	t.Cleanup(s.killAll)
	return s,
		func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), logs...) },
		func() map[string]int { mu.Lock(); defer mu.Unlock(); return maps.Clone(counters) }
}

func TestSupervisor(t *testing.T) {
	t.Parallel()
	t.Run("an exit on its own is counted, explained and its stats read", func(t *testing.T) {
		t.Parallel()
		s, logs, counters := shSupervisor(t, context.Background(), `echo "@chaos produced 3"; echo "boom" >&2; exit 3`)
		require.NoError(t, s.start("p", RoleProducer, nil))
		<-s.get("p").done
		require.Equal(t, 1, s.unexpectedExits())
		require.Equal(t, 3, counters()["produced"])
		require.Contains(t, strings.Join(logs(), "\n"), "[p] boom")
	})

	t.Run("kill reaches the whole process group and is not unexpected", func(t *testing.T) {
		t.Parallel()
		// The child starts a grandchild and reports its pid.
		s, _, counters := shSupervisor(t, context.Background(), `sleep 60 & echo "@chaos pid $!"; wait`)
		require.NoError(t, s.start("c", RoleConsumer, nil))
		require.Eventually(t, func() bool { return counters()["pid"] != 0 }, 10*time.Second, 10*time.Millisecond)
		grandchild := counters()["pid"]
		require.Equal(t, []string{"c"}, s.running())
		start := time.Now()
		require.True(t, s.kill("c"))
		require.Less(t, time.Since(start), 5*time.Second)
		require.Eventually(t, func() bool { return syscall.Kill(grandchild, 0) != nil }, 5*time.Second, 10*time.Millisecond,
			"the grandchild dies with its group")
		require.Zero(t, s.unexpectedExits())
		require.Empty(t, s.running())
		require.False(t, s.kill("c"), "nothing left to kill")

		require.NoError(t, s.restart("c"))
		require.Equal(t, []string{"c"}, s.running())
	})

	t.Run("stop lets a process that starts slowly finish its work", func(t *testing.T) {
		t.Parallel()
		// A role restarted a moment before the drain: it reaches its stop handling only after
		// a while (here a sleep a SIGTERM would kill), and then must still flush.
		s, _, counters := shSupervisor(t, context.Background(), `sleep 0.3; cat >/dev/null; echo "@chaos flushed 1"`)
		require.NoError(t, s.start("p", RoleProducer, nil))
		require.True(t, s.stop("p", 10*time.Second))
		require.Equal(t, 1, counters()["flushed"], "the process saw the stop and finished")
		require.Zero(t, s.unexpectedExits())
		require.False(t, s.stop("p", time.Second), "nothing left to stop")
	})

	t.Run("stop kills a process that does not stop within the grace", func(t *testing.T) {
		t.Parallel()
		s, _, counters := shSupervisor(t, context.Background(), `exec 0</dev/null; sleep 60; echo "@chaos flushed 1"`)
		require.NoError(t, s.start("p", RoleProducer, nil))
		start := time.Now()
		require.True(t, s.stop("p", 200*time.Millisecond))
		require.Less(t, time.Since(start), 5*time.Second)
		require.Zero(t, counters()["flushed"])
		require.Zero(t, s.unexpectedExits())
	})

	t.Run("the end of the run kills every group", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		s, _, _ := shSupervisor(t, ctx, `sleep 60`)
		require.NoError(t, s.start("a", RoleRelay, nil))
		require.NoError(t, s.start("b", RoleRelay, nil))
		cancel()
		for _, name := range []string{"a", "b"} {
			select {
			case <-s.get(name).done:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s outlived the run's context", name)
			}
		}
		require.Zero(t, s.unexpectedExits(), "a kill at the end of the run is not unexpected")
		s.killAll()
		require.Error(t, s.start("a", RoleRelay, nil), "no process starts once the run is over")
	})
}
