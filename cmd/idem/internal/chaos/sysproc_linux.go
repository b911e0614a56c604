package chaos

import "syscall"

// sysProcAttr puts a child in a process group of its own and has the kernel kill it when the
// harness dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
