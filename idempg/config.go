package idempg

import (
	"fmt"

	"github.com/idemkit/idem"
)

// Defaults for Config.
const (
	// SchemaDefault is the schema idem's tables live in when Config.Schema is empty.
	SchemaDefault = "public"
	// PrefixDefault starts the name of every table, index and notification channel the store
	// uses, so idem's tables sit beside the application's without clashing.
	PrefixDefault = "idem_"
	// identMaxLen bounds Schema and Prefix: a prefix of this length plus the longest suffix the
	// store appends still fits PostgreSQL's 63-byte identifiers, so no name is truncated.
	identMaxLen = 41
)

// Config configures a Store. Zero fields take the documented defaults (see WithDefaults).
type Config struct {
	// Schema holds idem's tables (default SchemaDefault, "public"); Migrate creates it when it is
	// missing. It must be an SQL identifier: a letter or underscore, then up to 40 letters, digits
	// or underscores. It is quoted in SQL, so its case is kept. Tests use a schema per test.
	Schema string
	// Prefix starts the name of every table and index (default PrefixDefault, "idem_") and of
	// the notification channels {Prefix}queue and {Prefix}outbox. It must be an SQL identifier
	// like Schema; an empty Prefix takes the default.
	Prefix string
	// OutboxPartitions is the number of partitions outbox rows are hashed into (default
	// idem.OutboxPartitionsDefault). It is fixed per database: changing it re-hashes ordering
	// keys and breaks per-key order for rows already enqueued.
	OutboxPartitions int
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = SchemaDefault
	}
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if c.OutboxPartitions == 0 {
		c.OutboxPartitions = idem.OutboxPartitionsDefault
	}
	return c
}

// validate reports the first invalid field, naming it and its value. Schema and Prefix are
// pasted into SQL, so nothing but plain identifiers may pass.
func (c Config) validate() error {
	if c.Schema == "" || !validIdent(c.Schema) {
		return fmt.Errorf("idempg: Config.Schema %q is not an SQL identifier "+
			"(want a letter or underscore, then up to 40 letters, digits or underscores)", c.Schema)
	}
	if !validIdent(c.Prefix) {
		return fmt.Errorf("idempg: Config.Prefix %q is not an SQL identifier "+
			"(want a letter or underscore, then up to 40 letters, digits or underscores)", c.Prefix)
	}
	if c.OutboxPartitions < 1 {
		return fmt.Errorf("idempg: Config.OutboxPartitions is %d, want at least 1", c.OutboxPartitions)
	}
	return nil
}

// validIdent reports whether s matches ^[A-Za-z_][A-Za-z0-9_]{0,40}$ or is empty.
func validIdent(s string) bool {
	if len(s) > identMaxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
