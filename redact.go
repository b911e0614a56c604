package idem

import "github.com/idemkit/idem/idemredact"

// The redactor lives in package idemredact; these aliases keep idem's configuration
// (Config.Redact) and existing callers spelled as before.

// Masked replaces every secret value a Redactor finds (idemredact.Masked).
const Masked = idemredact.Masked

// DefaultMaxErrorLen bounds redacted error summaries (idemredact.DefaultMaxErrorLen).
const DefaultMaxErrorLen = idemredact.DefaultMaxErrorLen

// RedactConfig configures a Redactor (idemredact.Config).
type RedactConfig = idemredact.Config

// Redactor masks secrets in everything that leaves the process (idemredact.Redactor).
type Redactor = idemredact.Redactor

// NewRedactor returns a Redactor for cfg (idemredact.New).
func NewRedactor(cfg RedactConfig) *Redactor { return idemredact.New(cfg) }

// RedactURL masks the credentials of a connection URL (idemredact.URL).
func RedactURL(raw string) string { return idemredact.URL(raw) }

// DefaultSecretNames returns the names masked by default (idemredact.DefaultSecretNames).
func DefaultSecretNames() []string { return idemredact.DefaultSecretNames() }
