package idemmysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// The Store implements these interfaces; the compiler checks it here.
var (
	_ idemstore.Store[*sql.Tx]        = (*Store)(nil)
	_ idemstore.BatchStore[*sql.Tx]   = (*Store)(nil)
	_ idemstore.QueueTxStore[*sql.Tx] = (*Store)(nil)
	_ idemstore.OutboxStore[*sql.Tx]  = (*Store)(nil)
	_ idemstore.Migrator              = (*Store)(nil)
)

// Defaults for Config.
const (
	// PrefixDefault prefixes every table the store creates, so idem's tables sit beside the
	// application's without clashing.
	PrefixDefault = "idem_"
	// PollIntervalDefault bounds how long QueueWait and OutboxWait sleep before the caller polls
	// again; MySQL has no LISTEN/NOTIFY, so a publish from another process is seen within it.
	PollIntervalDefault = 50 * time.Millisecond
	// prefixMaxLen bounds the prefix so that table and index names stay within MySQL's 64
	// characters.
	prefixMaxLen = 24
)

// Bounds of the claim key, in bytes: the widths of the claims table's key columns. A longer
// identity is refused with an error wrapping idem.ErrInvalidPayload, never truncated (a
// non-strict sql_mode would silently cut it, and two ids would become one key).
const (
	MaxTenantBytes   = 256
	MaxConsumerBytes = 256
	MaxEventIDBytes  = 1024
)

const (
	// claimAttempts bounds how often ClaimTx retries when the claim it collided with vanished
	// (garbage-collected) before it could read it.
	claimAttempts = 3
)

// MySQL and MariaDB error numbers the store acts on.
const (
	errDupEntry              = 1062 // ER_DUP_ENTRY
	errLockWaitTimeout       = 1205 // ER_LOCK_WAIT_TIMEOUT
	errLockDeadlock          = 1213 // ER_LOCK_DEADLOCK
	errConCount              = 1040 // ER_CON_COUNT_ERROR: too many connections
	errOutOfResources        = 1041 // ER_OUT_OF_RESOURCES
	errServerShutdown        = 1053 // ER_SERVER_SHUTDOWN
	errQueryInterrupted      = 1317 // ER_QUERY_INTERRUPTED (KILL QUERY)
	errTooManyUserConns      = 1203 // ER_TOO_MANY_USER_CONNECTIONS
	errLockTableFull         = 1206 // ER_LOCK_TABLE_FULL
	errReadOnly              = 1290 // ER_OPTION_PREVENTS_STATEMENT (--read-only, --super-read-only)
	errNeedReprepare         = 1615 // ER_NEED_REPREPARE
	errUnknownSystemVariable = 1193 // ER_UNKNOWN_SYSTEM_VARIABLE (@@in_transaction on MySQL 8)
	errReadOnlyTx            = 1792 // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
	errReadOnlyMode          = 1836 // ER_READ_ONLY_MODE
	errConnectionKilled      = 1927 // MariaDB ER_CONNECTION_KILLED
	errStatementTimeout      = 1969 // MariaDB ER_STATEMENT_TIMEOUT (max_statement_time)
	errExecutionTimeout      = 3024 // MySQL ER_QUERY_TIMEOUT (max_execution_time)
	errLockNowait            = 3572 // MySQL ER_LOCK_NOWAIT
	errClientInterruption    = 4031 // MySQL ER_CLIENT_INTERACTION_TIMEOUT: idle connection closed
)

// Config configures a Store. Zero fields take the documented defaults (see WithDefaults).
type Config struct {
	// Prefix starts the name of every table and index the store uses (default PrefixDefault,
	// "idem_"). It must be an SQL identifier: a letter or underscore, then up to 23 letters,
	// digits or underscores. The tables live in the connection's current database (the DSN's).
	Prefix string
	// OutboxPartitions is the number of partitions outbox rows are hashed into (default
	// idemstore.OutboxPartitionsDefault). It is fixed per database: changing it re-hashes ordering
	// keys and breaks per-key order for rows already enqueued.
	OutboxPartitions int
	// PollInterval bounds one QueueWait or OutboxWait (default PollIntervalDefault). Work
	// published through this Store wakes waiters in the same process at once; work published by
	// other processes is seen within one interval.
	PollInterval time.Duration
	// Isolation is the isolation level of the transactions InTx opens (default
	// sql.LevelDefault: the server's, REPEATABLE READ unless configured otherwise). Claims are
	// correct at READ COMMITTED, REPEATABLE READ and SERIALIZABLE; READ UNCOMMITTED is refused,
	// because a handler would read business rows that may yet roll back. READ COMMITTED takes
	// no gap locks, so concurrent handlers deadlock less.
	Isolation sql.IsolationLevel
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if c.OutboxPartitions == 0 {
		c.OutboxPartitions = idemstore.OutboxPartitionsDefault
	}
	if c.PollInterval == 0 {
		c.PollInterval = PollIntervalDefault
	}
	return c
}

// validate reports the first invalid field, naming it and its value.
func (c Config) validate() error {
	if !validPrefix(c.Prefix) {
		return fmt.Errorf("idemmysql: Config.Prefix %q is not an SQL identifier "+
			"(want a letter or underscore, then up to %d letters, digits or underscores)", c.Prefix, prefixMaxLen-1)
	}
	if c.OutboxPartitions < 1 {
		return fmt.Errorf("idemmysql: Config.OutboxPartitions is %d, want at least 1", c.OutboxPartitions)
	}
	if c.PollInterval <= 0 {
		return fmt.Errorf("idemmysql: Config.PollInterval is %s, want more than 0", c.PollInterval)
	}
	switch c.Isolation {
	case sql.LevelDefault, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
	default:
		return fmt.Errorf("idemmysql: Config.Isolation is %s, want default, READ COMMITTED, REPEATABLE READ or SERIALIZABLE", c.Isolation)
	}
	return nil
}

// validPrefix reports whether p matches ^[A-Za-z_][A-Za-z0-9_]{0,23}$. The prefix is pasted
// into SQL, so nothing else may pass.
func validPrefix(p string) bool {
	if p == "" || len(p) > prefixMaxLen {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// Store is idem's MySQL and MariaDB store: it implements idemstore.Store, idemstore.BatchStore,
// idemstore.QueueTxStore, idemstore.OutboxStore and idemstore.Migrator over *sql.Tx. It is safe for concurrent
// use.
type Store struct {
	db  *sql.DB
	cfg Config
	q   queries

	// queueWake and outboxWake let an idle QueueWait or OutboxWait in this process return as
	// soon as something is published through this Store, instead of at the next poll.
	queueWake  wake
	outboxWake wake

	// txMu guards txWakes: the transactions InTx has open, and which wake-ups their publishes
	// owe. Those are signalled after commit, when the work is visible, and dropped on rollback.
	txMu    sync.Mutex
	txWakes map[*sql.Tx]wakeFlags

	// claimStmts holds the claim statements prepared once, so that a claim is one round trip
	// instead of prepare, execute and close; nil until they could be prepared (the tables exist)
	// and after Close.
	claimStmts atomic.Pointer[claimStmts]
	closed     atomic.Bool
	// noInTransaction is set once the server refused @@in_transaction (MySQL 8): TxEnded then
	// probes with a savepoint.
	noInTransaction atomic.Bool
}

// claimStmts are the prepared statements of the claim path.
type claimStmts struct {
	insert, read *sql.Stmt
}

// New returns a Store on db with the default Config.
func New(db *sql.DB) *Store {
	s, err := NewWithConfig(db, Config{})
	if err != nil {
		// The default Config is valid; this cannot happen.
		panic(err)
	}
	return s
}

// NewWithConfig returns a Store on db with cfg (zero fields take their defaults), or an error
// naming the invalid field. db must be a go-sql-driver/mysql pool whose DSN names the database
// that holds (or will hold) idem's tables.
func NewWithConfig(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("idemmysql: NewWithConfig: db is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Store{
		db:      db,
		cfg:     cfg,
		q:       buildQueries(cfg.Prefix),
		txWakes: make(map[*sql.Tx]wakeFlags),
	}, nil
}

// DB returns the database the store works on.
func (s *Store) DB() *sql.DB { return s.db }

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

// Close releases the statements the store prepared; later calls still work, on plain SQL. It
// does not close the *sql.DB, which belongs to the caller.
func (s *Store) Close() error {
	s.closed.Store(true)
	return s.dropClaimStmts()
}

func (s *Store) dropClaimStmts() error {
	st := s.claimStmts.Swap(nil)
	if st == nil {
		return nil
	}
	return errors.Join(st.insert.Close(), st.read.Close())
}

// prepareClaims prepares the claim statements once the claims table exists.
func (s *Store) prepareClaims(ctx context.Context) {
	if s.claimStmts.Load() != nil || s.closed.Load() {
		return
	}
	ins, err := s.db.PrepareContext(ctx, s.q.claimInsert)
	if err != nil {
		return // not migrated yet: claims use plain SQL until then
	}
	read, err := s.db.PrepareContext(ctx, s.q.claimSelect)
	if err != nil {
		_ = ins.Close()
		return
	}
	if !s.claimStmts.CompareAndSwap(nil, &claimStmts{insert: ins, read: read}) {
		_ = ins.Close()
		_ = read.Close()
		return
	}
	if s.closed.Load() {
		_ = s.dropClaimStmts() // Close ran meanwhile
	}
}

// Dialect returns "mysql" (for MariaDB too).
func (s *Store) Dialect() string { return "mysql" }

// InTx runs fn in a new transaction at Config.Isolation and commits it when fn returns nil. An
// error from fn rolls back and is returned as is; a panic rolls back and keeps panicking.
//
// After a deadlock (1213) InnoDB has already rolled the whole transaction back, and further
// statements on tx would run outside any transaction: fn must return such an error, never
// swallow it and go on.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return s.runTx(ctx, s.cfg.Isolation, fn)
}

// ownTxAttempts bounds how often ownTx runs a store-internal transaction that deadlocked.
const ownTxAttempts = 3

// ownTx runs one of the store's own transactions (publish, fetch, dead letters, leases): at
// READ COMMITTED, whatever Config.Isolation says, so that their locking reads take no gap locks
// that would block concurrent publishers and fetchers; and again, up to three times in all,
// after a deadlock, which has rolled all of it back. fn must be safe to run again.
func (s *Store) ownTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	var err error
	for range ownTxAttempts {
		err = s.runTx(ctx, sql.LevelReadCommitted, fn)
		if !isMySQLError(err, errLockDeadlock) {
			return err
		}
	}
	return err
}

// runTx is InTx at the given isolation level.
func (s *Store) runTx(ctx context.Context, level sql.IsolationLevel, fn func(ctx context.Context, tx *sql.Tx) error) error {
	s.prepareClaims(ctx)
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
	if err != nil {
		return fmt.Errorf("idemmysql: begin transaction: %w", err)
	}
	s.txMu.Lock()
	s.txWakes[tx] = 0
	s.txMu.Unlock()
	done := false
	defer func() {
		s.txMu.Lock()
		flags := s.txWakes[tx]
		delete(s.txWakes, tx)
		s.txMu.Unlock()
		if !done {
			// fn failed or panicked (the panic goes on after this deferred call).
			_ = tx.Rollback()
			return
		}
		s.signal(flags)
	}()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("idemmysql: commit: %w", err)
	}
	done = true
	return nil
}

// checkKey refuses a key that is empty or does not fit the claims table's key columns.
func checkKey(k idem.Key) error {
	switch {
	case k.EventID == "":
		return fmt.Errorf("event id is empty: %w", idem.ErrInvalidPayload)
	case len(k.EventID) > MaxEventIDBytes:
		return fmt.Errorf("event id has %d bytes, more than %d: %w", len(k.EventID), MaxEventIDBytes, idem.ErrInvalidPayload)
	case len(k.Tenant) > MaxTenantBytes:
		return fmt.Errorf("tenant has %d bytes, more than %d: %w", len(k.Tenant), MaxTenantBytes, idem.ErrInvalidPayload)
	case len(k.Consumer) > MaxConsumerBytes:
		return fmt.Errorf("consumer has %d bytes, more than %d: %w", len(k.Consumer), MaxConsumerBytes, idem.ErrInvalidPayload)
	}
	return nil
}

// ClaimTx claims p.Key inside tx with a plain INSERT. When the key is taken, the INSERT fails
// with a duplicate-key error (1062) that rolls back that statement only, and a locking read
// (LOCK IN SHARE MODE) of the claim reports ClaimDuplicate (same fingerprint) or ClaimConflict
// (another fingerprint).
//
// Concurrent claims of one key serialise on the primary key: the INSERT waits for an
// uncommitted claim of the same key and then fails (it committed) or succeeds (it rolled back).
// The read is a locking read because a plain SELECT under REPEATABLE READ would read the
// transaction's snapshot, which may predate the claim it collided with; a locking read sees the
// latest committed row at every isolation level. If the claim vanished in between (garbage
// collection), the insert is tried again.
//
// INSERT IGNORE is not used: it turns every error of the row (truncation, bad values) into a
// warning, and a claim must fail loudly. Nor is INSERT … ON DUPLICATE KEY UPDATE: it takes an
// exclusive lock on the existing claim, so concurrent duplicates would queue behind each other.
func (s *Store) ClaimTx(ctx context.Context, tx *sql.Tx, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	if err := checkKey(p.Key); err != nil {
		return idemstore.ClaimResult{}, fmt.Errorf("idemmysql: claim %s: %w", p.Key, err)
	}
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	fp := p.Fingerprint
	var insert, read *sql.Stmt
	if st := s.claimStmts.Load(); st != nil {
		insert, read = st.insert, st.read
	}
	for range claimAttempts {
		var err error
		if insert != nil {
			_, err = tx.StmtContext(ctx, insert).ExecContext(ctx, p.Key.Tenant, p.Key.Consumer, p.Key.EventID, fp[:], now.UnixMicro())
		} else {
			_, err = tx.ExecContext(ctx, s.q.claimInsert, p.Key.Tenant, p.Key.Consumer, p.Key.EventID, fp[:], now.UnixMicro())
		}
		if err == nil {
			return idemstore.ClaimResult{Status: idemstore.ClaimNew}, nil
		}
		if !isMySQLError(err, errDupEntry) {
			return idemstore.ClaimResult{}, fmt.Errorf("idemmysql: claim: %w", err)
		}
		var row *sql.Row
		if read != nil {
			row = tx.StmtContext(ctx, read).QueryRowContext(ctx, p.Key.Tenant, p.Key.Consumer, p.Key.EventID)
		} else {
			row = tx.QueryRowContext(ctx, s.q.claimSelect, p.Key.Tenant, p.Key.Consumer, p.Key.EventID)
		}
		var (
			stored    []byte
			createdAt int64
		)
		err = row.Scan(&stored, &createdAt)
		if errors.Is(err, sql.ErrNoRows) {
			continue // garbage-collected since the INSERT collided with it: claim anew
		}
		if err != nil {
			return idemstore.ClaimResult{}, fmt.Errorf("idemmysql: read claim: %w", err)
		}
		return claimFound(p, stored, createdAt)
	}
	return idemstore.ClaimResult{}, fmt.Errorf("idemmysql: claim: the existing claim vanished %d times in a row",
		claimAttempts)
}

// claimFound reports an existing claim as a duplicate or, with another fingerprint, a conflict.
func claimFound(p idemstore.ClaimParams, stored []byte, createdAt int64) (idemstore.ClaimResult, error) {
	existing, err := idem.FingerprintFromBytes(stored)
	if err != nil {
		return idemstore.ClaimResult{}, fmt.Errorf("idemmysql: claim: %w", err)
	}
	res := idemstore.ClaimResult{Status: idemstore.ClaimDuplicate, Existing: existing, ClaimedAt: fromMicros(createdAt)}
	if existing != p.Fingerprint {
		res.Status = idemstore.ClaimConflict
	}
	return res, nil
}

// DeleteExpiredClaims deletes up to p.Limit claims created before p.Before (of p.Consumer, or of
// every consumer when it is empty), oldest first, in one autocommitted statement, and reports
// how many it deleted.
func (s *Store) DeleteExpiredClaims(ctx context.Context, p idemstore.DeleteExpiredClaimsParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("idemmysql: delete expired claims: Limit is %d, want more than 0", p.Limit)
	}
	var (
		res sql.Result
		err error
	)
	if p.Consumer == "" {
		res, err = s.db.ExecContext(ctx, s.q.claimDeleteAll, p.Before.UnixMicro(), p.Limit)
	} else {
		res, err = s.db.ExecContext(ctx, s.q.claimDeleteConsumer, p.Before.UnixMicro(), p.Consumer, p.Limit)
	}
	if err != nil {
		return 0, fmt.Errorf("idemmysql: delete claims of consumer %q before %s: %w",
			p.Consumer, p.Before.UTC().Format(time.RFC3339), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("idemmysql: delete expired claims: rows affected: %w", err)
	}
	return int(n), nil
}

// isMySQLError reports whether err is a server error with number n.
func isMySQLError(err error, n uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == n
}

// ClassifyError reports as transient: deadlocks (1213) and lock wait timeouts (1205), statement
// timeouts and interrupted queries, a server shutting down or out of connections or memory, a
// read-only server (a failover in progress), SQLSTATE classes 08 (connection) and 40
// (transaction rollback), and a lost or broken connection (the driver's ErrInvalidConn and
// driver.ErrBadConn). Other server errors (a constraint, a missing table, data too long) are
// permanent. Anything else is idem.ClassUnknown, left to idem.Classify.
func (s *Store) ClassifyError(err error) idem.Class {
	if err == nil {
		return idem.ClassUnknown
	}
	if errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrPktSync) ||
		errors.Is(err, mysql.ErrPktSyncMul) || errors.Is(err, mysql.ErrBusyBuffer) {
		return idem.ClassTransient
	}
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return idem.ClassUnknown
	}
	switch me.Number {
	case errLockDeadlock, errLockWaitTimeout, errConCount, errOutOfResources, errServerShutdown,
		errQueryInterrupted, errTooManyUserConns, errLockTableFull, errReadOnly, errNeedReprepare,
		errReadOnlyTx, errReadOnlyMode, errConnectionKilled, errStatementTimeout, errExecutionTimeout,
		errLockNowait, errClientInterruption:
		return idem.ClassTransient
	}
	switch string(me.SQLState[:2]) {
	case "08", "40":
		return idem.ClassTransient
	}
	return idem.ClassPermanent
}

// wakeFlags says which waiters a transaction's publishes must wake after commit.
type wakeFlags uint8

const (
	wakeQueue wakeFlags = 1 << iota
	wakeOutbox
)

// wake is a broadcast signal: waiters take the current channel, and signal closes it and puts a
// fresh one in its place.
type wake struct {
	mu sync.Mutex
	ch chan struct{}
}

// channel returns the channel the next signal closes.
func (w *wake) channel() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

// signal wakes every current waiter.
func (w *wake) signal() {
	w.mu.Lock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil // the next waiter makes a fresh channel
	}
	w.mu.Unlock()
}

// signal wakes the waiters flags names.
func (s *Store) signal(flags wakeFlags) {
	if flags&wakeQueue != 0 {
		s.queueWake.signal()
	}
	if flags&wakeOutbox != 0 {
		s.outboxWake.signal()
	}
}

// wakeAfter arranges the wake-up owed by a publish inside tx: after commit when InTx opened tx,
// at once otherwise (the caller's own transaction, whose commit the store cannot see; a waiter
// woken early polls, finds nothing yet and sleeps one PollInterval).
func (s *Store) wakeAfter(tx *sql.Tx, flags wakeFlags) {
	s.txMu.Lock()
	cur, ours := s.txWakes[tx]
	if ours {
		s.txWakes[tx] = cur | flags
	}
	s.txMu.Unlock()
	if !ours {
		s.signal(flags)
	}
}

// waitFor blocks until w signals, min(PollInterval, max) passes (PollInterval when max <= 0), or
// ctx ends (then it returns ctx.Err()).
func (s *Store) waitFor(ctx context.Context, w *wake, max time.Duration) error {
	ch := w.channel()
	if err := ctx.Err(); err != nil {
		return err
	}
	d := s.cfg.PollInterval
	if max > 0 && max < d {
		d = max
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
