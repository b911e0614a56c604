// Package idemmysql is idem's MySQL and MariaDB store: claims, dead letters, the queue table, the
// outbox and leases in InnoDB tables, through database/sql and github.com/go-sql-driver/mysql. A
// handler receives the *sql.Tx that holds its event's claim and writes its business change in
// it, so the claim and the effect commit or roll back together.
//
// It runs on MySQL 8.0 and MariaDB 10.6 or later (FOR UPDATE SKIP LOCKED, CHECK constraints,
// stored generated columns) at READ COMMITTED, REPEATABLE READ (InnoDB's default) or
// SERIALIZABLE; Config.Isolation picks one per transaction. A claim is a plain INSERT whose
// duplicate-key error (1062) says the key is taken, followed by a locking read of the claim
// that took it: a locking read sees the latest committed row at every isolation level, so a
// claim always sees a concurrent claim that committed while it waited. Deadlocks (1213) and lock
// wait timeouts (1205) are transient and retried by the consumer. docs/mysql.md says why and
// lists the differences between MySQL and MariaDB.
//
// Times are stored as unix microseconds (BIGINT, UTC), so that no DSN option (parseTime, loc)
// and no server time zone changes what is stored or read back.
package idemmysql
