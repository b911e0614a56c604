// Package relaytest holds the outbox relay's tests against real stores (PostgreSQL, SQLite) and
// sinks (JetStream, HTTP). They live beside the command, in the module that may depend on every
// adapter, so the relay's own package stays in the core module with no third-party requirement.
package relaytest
