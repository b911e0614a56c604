package idemkafka

// Crash stops s as a dying process would: no final commit, and what it held is redelivered to
// the group.
func Crash(s *Source) { _ = s.shutdown(true) }
