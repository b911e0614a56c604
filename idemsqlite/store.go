// Package idemsqlite is idem's embedded store: claims, dead letters, the queue table, the outbox
// and leases in a SQLite database, through the pure-Go driver modernc.org/sqlite (no cgo, no
// server). A handler receives the *sql.Tx that holds its event's claim and writes its business
// change in it, so the claim and the effect commit or roll back together.
//
// SQLite has one writer at a time. Open configures a database for that (WAL, a busy timeout,
// BEGIN IMMEDIATE, one connection); a Store works on any *sql.DB of this driver but is only
// tested on one from Open.
package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// The Store implements these interfaces; the compiler checks it here.
var (
	_ idem.Store[*sql.Tx]        = (*Store)(nil)
	_ idem.QueueTxStore[*sql.Tx] = (*Store)(nil)
	_ idem.OutboxStore[*sql.Tx]  = (*Store)(nil)
	_ idem.Migrator              = (*Store)(nil)
)

// Defaults for Config.
const (
	// PrefixDefault prefixes every table the store creates, so idem's tables sit beside the
	// application's without clashing.
	PrefixDefault = "idem_"
	// PollIntervalDefault bounds how long QueueWait and OutboxWait sleep before the caller polls
	// again; SQLite has no LISTEN/NOTIFY, so a publish from another process is seen within it.
	PollIntervalDefault = 50 * time.Millisecond
	// BusyTimeoutDefault is how long Open lets a statement wait for another connection's write
	// lock before it fails with SQLITE_BUSY.
	BusyTimeoutDefault = 5 * time.Second
	// prefixMaxLen bounds the prefix so that index names stay short.
	prefixMaxLen = 41
)

// OpenConfig configures the database Open returns. Zero fields take the documented defaults.
type OpenConfig struct {
	// BusyTimeout is how long a statement on the connection waits for another connection's
	// write lock before it fails with SQLITE_BUSY (SQLite's busy_timeout; default
	// BusyTimeoutDefault). A Store's own writes wait as long, retrying with jitter instead of
	// in SQLite's busy handler (docs/sqlite.md). It must not be negative.
	BusyTimeout time.Duration
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c OpenConfig) WithDefaults() OpenConfig {
	if c.BusyTimeout == 0 {
		c.BusyTimeout = BusyTimeoutDefault
	}
	return c
}

// validate reports the first invalid field, naming it and its value.
func (c OpenConfig) validate() error {
	if c.BusyTimeout < 0 {
		return fmt.Errorf("idemsqlite: OpenConfig.BusyTimeout is %s, want at least 0", c.BusyTimeout)
	}
	return nil
}

// Open opens (creating it if needed) the SQLite database file at path, configured for idem:
// WAL journal (readers do not block the writer), busy_timeout of BusyTimeoutDefault, foreign
// keys on, synchronous=NORMAL (durable across application crashes; a power loss may lose the
// last commits but never corrupts), and BEGIN IMMEDIATE for every read-write transaction, so
// that a transaction takes the write lock when it starts and never fails with SQLITE_BUSY
// halfway, upgrading a read lock. OpenWithConfig sets another busy timeout.
//
// The pool holds ONE connection, because SQLite has one writer and a second connection would
// only wait for the lock. Consequently code running inside a transaction (a handler, a function
// given to InTx) must do all its database work through that transaction: using the *sql.DB
// directly there waits for the connection its own transaction holds. InTx notices such a wait
// (a wait for the connection that lasts two checks, 2–4 s) and ends it with ErrDBUsedInTx, so the
// mistake fails with an error that names it instead of hanging until a deadline. A reader of
// another goroutine that waits that long behind a transaction that long is taken for the same.
func Open(path string) (*sql.DB, error) {
	return OpenWithConfig(path, OpenConfig{})
}

// OpenWithConfig is Open with cfg (zero fields take their defaults), or an error naming the
// invalid field.
func OpenWithConfig(path string, cfg OpenConfig) (*sql.DB, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", dsn(path, cfg.BusyTimeout))
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	// Keep the one connection: an in-memory database lives as long as it does.
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	if err := db.PingContext(context.Background()); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("idemsqlite: open %s: %w", path, err)
	}
	return db, nil
}

// dsn builds the modernc.org/sqlite data source name for path. The driver runs each _pragma on
// every new connection (busy_timeout first), and _txlock makes BeginTx issue BEGIN IMMEDIATE.
// The path is a URI path, so the characters URIs give a meaning are escaped.
func dsn(path string, busy time.Duration) string {
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	return fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)"+
		"&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_txlock=immediate",
		esc, busy.Milliseconds())
}

// Config configures a Store. Zero fields take the documented defaults (see WithDefaults).
type Config struct {
	// Prefix starts the name of every table and index the store uses (default PrefixDefault,
	// "idem_"). It must be an SQL identifier: a letter or underscore, then up to 40 letters,
	// digits or underscores. Tests use it to keep stores apart in one database.
	Prefix string
	// OutboxPartitions is the number of partitions outbox rows are hashed into (default
	// idem.OutboxPartitionsDefault). It is fixed per database: changing it re-hashes ordering
	// keys and breaks per-key order for rows already enqueued.
	OutboxPartitions int
	// PollInterval bounds one QueueWait or OutboxWait (default PollIntervalDefault). Work
	// published through this Store wakes waiters in the same process at once; work published by
	// other processes is seen within one interval.
	PollInterval time.Duration
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if c.OutboxPartitions == 0 {
		c.OutboxPartitions = idem.OutboxPartitionsDefault
	}
	if c.PollInterval == 0 {
		c.PollInterval = PollIntervalDefault
	}
	return c
}

// validate reports the first invalid field, naming it and its value.
func (c Config) validate() error {
	if !validPrefix(c.Prefix) {
		return fmt.Errorf("idemsqlite: Config.Prefix %q is not an SQL identifier "+
			"(want a letter or underscore, then up to 40 letters, digits or underscores)", c.Prefix)
	}
	if c.OutboxPartitions < 1 {
		return fmt.Errorf("idemsqlite: Config.OutboxPartitions is %d, want at least 1", c.OutboxPartitions)
	}
	if c.PollInterval <= 0 {
		return fmt.Errorf("idemsqlite: Config.PollInterval is %s, want more than 0", c.PollInterval)
	}
	return nil
}

// validPrefix reports whether p matches ^[A-Za-z_][A-Za-z0-9_]{0,40}$ or is empty. The prefix is
// pasted into SQL, so nothing else may pass.
func validPrefix(p string) bool {
	if len(p) > prefixMaxLen {
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

// Store is idem's SQLite store: it implements idem.Store, idem.QueueTxStore,
// idem.OutboxStore and idem.Migrator over *sql.Tx. It is safe for concurrent use.
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

	// claimStmts holds the claim statements prepared once, so that a claim does not parse SQL;
	// nil until they could be prepared (the tables exist) and after Close.
	claimStmts atomic.Pointer[claimStmts]
	closed     atomic.Bool

	// gate serialises and spaces out the store's writes (see writeGate); busyMillis caches the
	// connection's busy timeout in milliseconds, -1 until read.
	gate       *writeGate
	busyMillis atomic.Int64

	// extMu guards pendingExt: lease extensions QueueExtend recorded while an InTx transaction
	// held the connection, applied by a transaction before it commits (applyExtensions).
	extMu      sync.Mutex
	pendingExt map[int64]pendingExtension
}

// claimStmts are the prepared statements of the claim path.
type claimStmts struct {
	insert, read *sql.Stmt
}

// New returns a Store on db with the default Config. db should come from Open.
func New(db *sql.DB) *Store {
	s, err := NewWithConfig(db, Config{})
	if err != nil {
		// The default Config is valid; this cannot happen.
		panic(err)
	}
	return s
}

// NewWithConfig returns a Store on db with cfg (zero fields take their defaults), or an error
// naming the invalid field. db should come from Open.
func NewWithConfig(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("idemsqlite: NewWithConfig: db is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Store{
		db:      db,
		cfg:     cfg,
		q:       buildQueries(cfg.Prefix),
		txWakes: make(map[*sql.Tx]wakeFlags),
		gate:    newWriteGate(),

		pendingExt: make(map[int64]pendingExtension),
	}
	s.busyMillis.Store(-1)
	return s, nil
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

// prepareClaims prepares the claim statements once the claims table exists, so that a claim
// does not parse SQL. It runs before BeginTx: with one connection, preparing on the *sql.DB
// inside a transaction would wait forever.
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

// Dialect returns "sqlite".
func (s *Store) Dialect() string { return "sqlite" }

// InTx runs fn in a new transaction (BEGIN IMMEDIATE with a *sql.DB from Open) and commits it
// when fn returns nil. The BEGIN waits for another process's write lock by retrying with jitter
// for the connection's busy timeout, after a short pause when this store has been writing back
// to back, so that processes sharing the file take turns (docs/sqlite.md). An error from fn
// rolls back and is returned as is; a panic rolls back and keeps panicking. fn must use tx,
// never the *sql.DB, for database work (see Open).
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	s.prepareClaims(ctx)
	w, err := s.startWrite(ctx)
	if err != nil {
		return fmt.Errorf("idemsqlite: begin transaction: %w", err)
	}
	defer s.finishWrite(ctx, w) // runs last, once the transaction has ended
	var tx *sql.Tx
	err = w.retryBusy(ctx, func() error {
		var err error
		tx, err = w.conn.BeginTx(ctx, nil)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsqlite: begin transaction: %w", err)
	}
	s.gate.inTx.Store(true)
	if err := w.restoreBusy(ctx, tx); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("idemsqlite: begin transaction: restore busy_timeout: %w", err)
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
	fctx, stopWatch := s.watchPoolWait(ctx)
	err = fn(fctx, tx)
	stopWatch()
	if err != nil {
		if cause := context.Cause(fctx); errors.Is(cause, ErrDBUsedInTx) && ctx.Err() == nil {
			return fmt.Errorf("%w (it returned: %w)", cause, err)
		}
		return err
	}
	s.applyExtensions(ctx, tx)
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("idemsqlite: commit: %w", err)
	}
	done = true
	return nil
}

// ErrDBUsedInTx is the cause InTx gives, and wraps in its error, when code running inside its
// transaction (a handler) waited for a connection of the *sql.DB while the transaction held the
// pool's only one (see Open): that wait can never end, so InTx cancels the function's context
// after poolWaitLimit instead of letting it hang until a deadline.
var ErrDBUsedInTx = errors.New("idemsqlite: something waited for a connection of the *sql.DB while a transaction held its only one: " +
	"a handler (or a function given to InTx) that uses the *sql.DB instead of the *sql.Tx it was given deadlocks; do all database work through the tx")

// poolWaitLimit is how long a wait for the pool's only connection may last while a transaction
// holds it before InTx takes it for the deadlock of ErrDBUsedInTx. Waits of other goroutines
// (a reader of another component) last as long as the transaction, which is far shorter.
const poolWaitLimit = 2 * time.Second

// watchPoolWait returns ctx with a watchdog for ErrDBUsedInTx, and the function that stops it.
// Every poolWaitLimit it reads the pool's statistics: when a wait for a connection began after
// the transaction started, none has ended since (so the waiter is still blocked behind the
// transaction) and it was already seen a tick earlier, it cancels ctx with ErrDBUsedInTx. It
// only runs on a pool of one connection (a *sql.DB from Open).
func (s *Store) watchPoolWait(ctx context.Context) (context.Context, func()) {
	start := s.db.Stats()
	if start.MaxOpenConnections != 1 {
		return ctx, func() {}
	}
	wctx, cancel := context.WithCancelCause(ctx)
	var (
		mu      sync.Mutex
		stopped bool
		seen    bool
		t       *time.Timer
	)
	mu.Lock()
	t = time.AfterFunc(poolWaitLimit, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		st := s.db.Stats()
		waiting := st.WaitCount > start.WaitCount && st.WaitDuration == start.WaitDuration
		if waiting && seen {
			cancel(ErrDBUsedInTx)
			return
		}
		seen = waiting
		t.Reset(poolWaitLimit)
	})
	mu.Unlock()
	return wctx, func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		cancel(nil)
	}
}

// ClaimTx claims p.Key inside tx: INSERT … ON CONFLICT DO NOTHING RETURNING. When the key is
// taken it reads the existing claim and reports ClaimDuplicate (same fingerprint) or
// ClaimConflict (another fingerprint). SQLite serialises writers, and the transaction holds the
// write lock from its INSERT on, so nothing can change between the two statements.
func (s *Store) ClaimTx(ctx context.Context, tx *sql.Tx, p idem.ClaimParams) (idem.ClaimResult, error) {
	if p.Key.EventID == "" {
		return idem.ClaimResult{}, fmt.Errorf("idemsqlite: claim %s: event id is empty", p.Key)
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
	var createdAt int64
	err := claimRow(ctx, tx, insert, s.q.claimInsert,
		p.Key.Tenant, p.Key.Consumer, p.Key.EventID, fp[:], now.UnixMicro()).Scan(&createdAt)
	if err == nil {
		return idem.ClaimResult{Status: idem.ClaimNew}, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return idem.ClaimResult{}, fmt.Errorf("idemsqlite: claim: %w", err)
	}
	var stored []byte
	err = claimRow(ctx, tx, read, s.q.claimSelect,
		p.Key.Tenant, p.Key.Consumer, p.Key.EventID).Scan(&stored, &createdAt)
	if err != nil {
		return idem.ClaimResult{}, fmt.Errorf("idemsqlite: read claim: %w", err)
	}
	existing, err := idem.FingerprintFromBytes(stored)
	if err != nil {
		return idem.ClaimResult{}, fmt.Errorf("idemsqlite: claim: %w", err)
	}
	res := idem.ClaimResult{Status: idem.ClaimDuplicate, Existing: existing, ClaimedAt: fromMicros(createdAt)}
	if existing != p.Fingerprint {
		res.Status = idem.ClaimConflict
	}
	return res, nil
}

// claimRow runs a claim statement in tx: the prepared one when there is one (tx.StmtContext
// reuses it on tx's connection without parsing), else query.
func claimRow(ctx context.Context, tx *sql.Tx, prepared *sql.Stmt, query string, args ...any) *sql.Row {
	if prepared != nil {
		return tx.StmtContext(ctx, prepared).QueryRowContext(ctx, args...)
	}
	return tx.QueryRowContext(ctx, query, args...)
}

// DeleteExpiredClaims deletes up to p.Limit claims created before p.Before (of p.Consumer, or of
// every consumer when it is empty) in one short transaction, and reports how many it deleted.
func (s *Store) DeleteExpiredClaims(ctx context.Context, p idem.DeleteExpiredClaimsParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("idemsqlite: delete expired claims: Limit is %d, want more than 0", p.Limit)
	}
	var (
		res sql.Result
		err error
	)
	if p.Consumer == "" {
		res, err = s.execWrite(ctx, s.q.claimDeleteAll, p.Before.UnixMicro(), p.Limit)
	} else {
		res, err = s.execWrite(ctx, s.q.claimDeleteConsumer, p.Before.UnixMicro(), p.Consumer, p.Limit)
	}
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: delete claims of consumer %q before %s: %w",
			p.Consumer, p.Before.UTC().Format(time.RFC3339), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: delete expired claims: rows affected: %w", err)
	}
	return int(n), nil
}

// ClassifyError reports SQLITE_BUSY and SQLITE_LOCKED (including their extended codes) as
// transient: another connection held the lock longer than the busy timeout, and a retry
// usually succeeds. Anything else is idem.ClassUnknown, left to idem.Classify.
func (s *Store) ClassifyError(err error) idem.Class {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return idem.ClassTransient
		}
	}
	return idem.ClassUnknown
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
