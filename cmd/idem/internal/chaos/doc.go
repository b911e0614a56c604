// Package chaos is idem's chaos harness: it runs the demo's payments scenario with the
// producer, the outbox relays and the consumers as separate OS processes and, while they work,
//
//   - sends SIGKILL to a random one of them every KillEvery (1–3 s) and restarts it;
//   - cuts the database connections (all dropped, new ones refused for a moment) or stalls them
//     (no byte moves for 2–4 s) through a TCP proxy it owns ([Proxy]);
//   - restarts the NATS server, an embedded JetStream server with a file store that it owns;
//   - keeps producing events with duplicates, transient failures and poison messages.
//
// Then it lets the system drain and checks, from the database alone (the queries are in
// verdict.go, to rerun by hand on a schema kept with Options.Keep): every valid event applied
// exactly once, none lost, balances exact, every poison message dead-lettered once with the
// right reason, no outbox row left unpublished, no claim without its effect and no effect
// without its claim. [Run] returns a [Report]; its WriteTable prints the numbers.
//
// The roles run as child processes of one binary: the idem command's hidden `idem chaos-role`,
// which calls [RoleMain]. Each child is in a process group of its own, killed when the run ends
// however it ends; a child also stops when its stdin (a pipe the harness holds) closes, so
// none outlives the harness.
//
// The misbehaviour of each event is a pure function of the seed and the event's index (as in
// the demo), so a restarted producer makes the same decisions, and a consumer decides whether
// to fail an event's first attempt from the seed and the event id alone.
package chaos
