//go:build unix && !linux

package chaos

import "syscall"

// sysProcAttr puts a child in a process group of its own.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
