// Package chaos is idem's chaos harness: it runs the demo's payments scenario with the
// producer, the outbox relays and the consumers as separate OS processes, on PostgreSQL
// (Options.PostgresURL, a schema of the run's own) or MySQL/MariaDB (Options.MySQLDSN, a
// database of the run's own), and, while they work,
//
//   - sends SIGKILL to a random one of them every KillEvery (1–3 s) and restarts it;
//   - cuts the database connections (all dropped, new ones refused for a moment) or stalls them
//     (no byte moves for 2–4 s) through a TCP proxy it owns ([Proxy]);
//   - restarts the NATS server, an embedded JetStream server with a file store that it owns; or,
//     with Options.BrokerURL, runs the events through a RabbitMQ or Redis server (a queue or
//     stream of the run's own, reached through a second proxy) and, every BrokerFaultEvery,
//     cuts the run's broker connections for BrokerDown, closes them from the server's side
//     (rabbitmqctl close_connection, CLIENT KILL ID) or stalls them (broker_connection_kills,
//     broker_stalls_and_cuts) — never anyone else's, as the server may be shared;
//   - keeps producing events with duplicates, transient failures and poison messages.
//
// It also injects these fault classes, each reported in [Report.Faults] with what it injected,
// how many times, and the verdict counts it bears on:
//
//   - db_outage: a database outage longer than the consumers' retry budget (Options.RetryBudget,
//     10 s by default, against a cut of 12–15 s): every connection dropped, new ones refused.
//     A valid event may then end as a retries_exhausted dead letter (the guarantee: applied, or
//     a dead letter says why not), but only one written during the outage or its grace
//     (budget + 30 s, the outages table); none may be lost or applied twice.
//   - dead_letter_write_failures: windows in which a trigger on the dead-letter table refuses
//     every insert as a full disk would (SQLSTATE 53100; on MySQL a SIGNAL of error 1041, counted
//     by AUTO_INCREMENT values a rollback keeps). The poison messages of the window must
//     still end as exactly one dead letter each, none dropped, none looping. A consumer that
//     pauses itself over it (ErrPaused) is started again in its process after a second, as an
//     orchestrator would; the pauses are counted (consumer_pauses).
//   - poison_identities: payments whose identity is not one — no event id, a whitespace-only
//     one, ASCII control characters, a NUL, invalid UTF-8, 3 KB and 12 KB ids, a 10 KB tenant.
//     The producer first offers each to the outbox (with CR/LF too, which no NATS header can
//     carry), which must refuse it, then publishes it straight to the stream as a foreign
//     producer would; each must end as exactly one invalid_payload dead letter, matched by the
//     order index it carries (header payments.HeaderOrder), and never be applied.
//   - resent_occurred_at: valid events enqueued again with the same id and payload but an
//     OccurredAt moved by 1 to 72 hours either way; each must still be applied once. The
//     claims table is partitioned by day of OccurredAt (Options.InboxBucket; PlainInbox for the
//     plain table, the only one on MySQL), so most re-sends land in another partition than
//     their first claim.
//   - sink_refusals: the relay's broker refuses one message of a pipelined batch now and then
//     (0.5% of pipelined messages: its PubAck fails while the rest of the batch goes on); each
//     wallet's payments must still reach the stream in commit order.
//
// Then it lets the system drain and checks, from the database alone (payments.Check, the
// verdict the demo reads too, in every dialect, to rerun by hand on a schema kept with
// Options.Keep): every valid event applied
// exactly once, none lost, balances exact, every poison message dead-lettered once with the
// right reason, no outbox row left unpublished, no claim without its effect and no effect
// without its claim. From the stream (order.go) it checks per-key order: the events are keyed
// by wallet, and a payment that reached the stream after a later payment of its wallet is an
// order violation. The order in which the consumers apply a wallet's payments is reported for
// information only: they apply concurrently, and idem orders publishes, not applications.
// [Run] returns a [Report]; its WriteTable prints the numbers.
//
// The roles reach the database through a small generic layer (store.go: the scenario's SQL
// written once, and a store as a few functions over its transaction type), so every role runs
// the same code on either database.
//
// The roles run as child processes of one binary: the idem command's hidden `idem chaos-role`,
// which calls [RoleMain]. Each child is in a process group of its own, killed when the run ends
// however it ends; a child also stops when its stdin (a pipe the harness holds) closes, so
// none outlives the harness.
//
// The misbehaviour of each event is a pure function of the seed and the event's index (as in
// the demo), so a restarted producer makes the same decisions, a consumer decides whether to
// fail an event's first attempt from the seed and the event id alone, and a relay whether the
// broker refuses a message from the seed and its broker message id alone.
package chaos
