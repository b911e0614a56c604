package idemrelay

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// maxIDSlots bounds how many relays with a default ID one machine (one user) numbers before
// falling back to a random ID.
const maxIDSlots = 64

// slotDir holds the machine-local lock files behind default relay IDs, one directory per user.
func slotDir() string {
	return filepath.Join(os.TempDir(), "idem-relay-ids-"+strconv.Itoa(os.Getuid()))
}

// stableID returns "<host>-<slot>" for the lowest slot whose lock file in dir this process can
// hold, and the lock, which the operating system releases when the process ends. A relay that
// is killed and restarted on the same machine therefore gets the same ID back and resumes its
// partition leases at once (LeaseAcquire renews a lease its owner asks for), while two live
// relays on one machine never share an ID. ok is false when no slot can be locked (locks not
// supported, the directory not writable, every slot taken).
func stableID(dir, host string) (id string, lock io.Closer, ok bool) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, false
	}
	for n := range maxIDSlots {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("%s-%d.lock", host, n)), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return "", nil, false
		}
		if tryLock(f) {
			return host + "-" + strconv.Itoa(n), f, true
		}
		f.Close()
	}
	return "", nil, false
}
