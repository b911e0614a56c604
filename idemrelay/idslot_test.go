//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package idemrelay

import (
	"bufio"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Not parallel: a fork by another test (TestStableIDAfterKill) briefly holds copies of this
// test's descriptors, and with them its flocks, until the child execs.
func TestStableIDSlots(t *testing.T) {
	dir := t.TempDir()
	id0, lock0, ok := stableID(dir, "host")
	require.True(t, ok)
	require.Equal(t, "host-0", id0)
	id1, lock1, ok := stableID(dir, "host")
	require.True(t, ok)
	require.Equal(t, "host-1", id1, "a live relay's ID is never handed out twice")
	require.NoError(t, lock0.Close())
	again, lock, ok := stableID(dir, "host")
	require.True(t, ok)
	require.Equal(t, "host-0", again, "a freed slot is taken again")
	require.NoError(t, lock.Close())
	require.NoError(t, lock1.Close())

	_, _, ok = stableID("/dev/null/not-a-dir", "host")
	require.False(t, ok, "an unusable directory falls back (to a random ID)")
}

// TestStableIDAfterKill: a relay process killed with SIGKILL frees its ID for the next one on
// the machine, which is what lets a restarted relay resume its leases at once.
func TestStableIDAfterKill(t *testing.T) {
	if os.Getenv("IDEMRELAY_HOLD_SLOT") != "" {
		t.Skip("helper process only")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHoldSlotHelper$")
	cmd.Env = append(os.Environ(), "IDEMRELAY_HOLD_SLOT="+dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "holding host-0\n", line)

	id, lock, ok := stableID(dir, "host")
	require.True(t, ok)
	require.Equal(t, "host-1", id, "the child holds host-0")
	require.NoError(t, lock.Close())

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	id, lock, ok = stableID(dir, "host")
	require.True(t, ok)
	require.Equal(t, "host-0", id, "the killed relay's ID is free again")
	require.NoError(t, lock.Close())
}

// TestHoldSlotHelper is the child of TestStableIDAfterKill: it takes a slot and waits to be
// killed.
func TestHoldSlotHelper(t *testing.T) {
	dir := os.Getenv("IDEMRELAY_HOLD_SLOT")
	if dir == "" {
		t.Skip("helper process of TestStableIDAfterKill")
	}
	id, lock, ok := stableID(dir, "host")
	require.True(t, ok)
	defer lock.Close()
	os.Stdout.WriteString("holding " + id + "\n")
	time.Sleep(time.Minute)
}
