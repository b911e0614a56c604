package idemrelay

// CrashOnExit makes Run return without releasing its leases, as a killed process would, so that
// tests can watch the other relays take its partitions over after the TTL.
func (r *Relay) CrashOnExit() { r.crashOnExit = true }
