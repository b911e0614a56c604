package idemmysql

// UseTxProbe makes s's TxEnded probe with a savepoint, as it does on a server that refused
// @@in_transaction (MySQL 8), so the probe is tested on MariaDB too.
func UseTxProbe(s *Store) { s.noInTransaction.Store(true) }

// IsUnknownVariable reports whether err is the server's refusal of an unknown system variable,
// the refusal that switches TxEnded to the probe.
func IsUnknownVariable(err error) bool { return isMySQLError(err, errUnknownSystemVariable) }
