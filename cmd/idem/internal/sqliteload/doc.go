// Package sqliteload is the multi-process scenario of the embedded default: a producer
// (business write plus outbox row), a relay (outbox to queue table) and a consumer (queue table,
// handlers that spend time in their transaction) run as separate processes on one SQLite file,
// with a backlog, optionally SIGKILLing a random one every 1–3 s and restarting it; then the
// harness drains the outbox and the queue and checks from the database that nothing was applied
// twice or lost and that the file is intact, and reports each role's progress per second from
// the database's own timestamps (docs/sqlite.md).
//
// [Run] is the harness and [RoleMain] the body of a role process; `idem chaos --store
// sqlite://…` runs it with the idem binary's hidden chaos-sqlite-role command, the test with
// processes of the test binary. It lives in the cmd/idem module so that it can import the
// relay, the queue transport and the SQLite store without adding requirements to a library
// module.
package sqliteload
