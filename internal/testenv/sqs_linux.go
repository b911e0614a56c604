package testenv

import (
	"os/exec"
	"syscall"
)

// detach puts the server in its own process group, killed with the test process even when that
// dies without running its cleanup.
func detach(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// stopProcess kills the server's process group.
func stopProcess(cmd *exec.Cmd) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}
