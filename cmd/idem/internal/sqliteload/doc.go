// Package sqliteload holds the multi-process load test of the embedded default: a producer
// (business write plus outbox row), a relay (outbox to queue table) and a consumer (queue table,
// handlers that spend time in their transaction) run as separate processes on one SQLite file,
// and each must keep making progress without SQLITE_BUSY reaching it (docs/sqlite.md). It has
// no code outside its test; it lives in the cmd/idem module so that it can import the relay,
// the queue transport and the SQLite store without adding requirements to a library module.
package sqliteload
