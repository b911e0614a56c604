//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package idemrelay

import "os"

// tryLock reports false where flock is not available: default relay IDs are then random.
func tryLock(*os.File) bool { return false }
