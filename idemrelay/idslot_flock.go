//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package idemrelay

import (
	"os"
	"syscall"
)

// tryLock takes an exclusive, non-blocking flock on f: held until f is closed or the process
// ends, however it ends.
func tryLock(f *os.File) bool {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}
