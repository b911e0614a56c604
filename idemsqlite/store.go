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
	"github.com/idemkit/idem/idemstore"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// The Store implements these interfaces; the compiler checks it here.
var (
	_ idemstore.Store[*sql.Tx]        = (*Store)(nil)
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
	// idemstore.OutboxPartitionsDefault). It is fixed per database: changing it re-hashes ordering
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

// Store is idem's SQLite store: it implements idemstore.Store, idemstore.QueueTxStore,
// idemstore.OutboxStore and idemstore.Migrator over *sql.Tx. It is safe for concurrent use.
type Store struct {
	db  *sql.DB
	cfg Config
	q   queries

	// queueWake and outboxWake let an idle QueueWait or OutboxWait in this process return as
	// soon as something is published through this Store, instead of at the next poll.
	queueWake  wake
	outboxWake wake

	// txMu guards txOpen: the transactions InTx has open, which wake-ups their publishes owe
	// and which queue jobs they acked. Wake-ups are signalled after commit, when the work is
	// visible, and acked jobs are then handed to acks for deletion; both are dropped on rollback.
	txMu   sync.Mutex
	txOpen map[*sql.Tx]txState

	// acks holds queue jobs acked by a committed transaction and not yet deleted (see
	// QueueAckTx).
	acks ackQueue

	// ownPoolUsers counts the store's own uses of the *sql.DB's pool (reads outside a write)
	// under way, so that watchPoolWait does not take their waits for a handler's (see
	// ownPoolUse).
	ownPoolUsers atomic.Int64

	// stmts holds the statements of the hot path (claim, queue publish, fetch and ack) prepared once, so
	// that they do not parse SQL each time; nil until they could be prepared (the tables exist)
	// and after Close.
	stmts  atomic.Pointer[hotStmts]
	closed atomic.Bool

	// gate serialises and spaces out the store's writes (see writeGate); busyMillis caches the
	// connection's busy timeout in milliseconds, -1 until read.
	gate       *writeGate
	busyMillis atomic.Int64

	// backlog holds the names of the queues whose last fetch found all it asked for: their
	// next fetch skips the read that spares an idle queue's polls the write lock (and waits
	// for the connection the store's writes may hold).
	backlog sync.Map

	// extMu guards pendingExt: lease extensions QueueExtend recorded while an InTx transaction
	// held the connection, applied by a transaction before it commits (applyExtensions); and
	// fetched: the newest lease this Store's fetches gave each job, so that an extension it
	// must record without reading the table is still refused when this process took the job
	// over since, and so that an ack inside the lease needs no read (QueueAckTx). Bounded by
	// fetchedMax; an entry left out only loses those early answers, never the token checks.
	extMu      sync.Mutex
	pendingExt map[int64]pendingExtension
	fetched    map[int64]fetchedLease
}

// fetchedLease is a lease a fetch of this Store gave: its token, and when it ends (Unix
// microseconds, as written to lease_until; 0 when the fetch was given its time, Now, so that
// the end is not on this process's clock).
type fetchedLease struct {
	token, until int64
}

// fetchedMax bounds Store.fetched: past it the map starts again empty.
const fetchedMax = 1 << 16

// hotStmts are the prepared statements of the claim and queue paths. A transaction runs them
// through tx.StmtContext, which reuses the statement already prepared on the pool's one
// connection without parsing it again.
type hotStmts struct {
	claimInsert, claimRead, queueRange, queueInsert, queuePeek, queueFetch, queueAck, queueAckMany, queueHeld, queueRelease, queueInsert8, queueInsert32 *sql.Stmt
}

// all returns the statements, for closing.
func (h *hotStmts) all() []*sql.Stmt {
	return []*sql.Stmt{h.claimInsert, h.claimRead, h.queueRange, h.queueInsert, h.queuePeek, h.queueFetch, h.queueAck, h.queueAckMany, h.queueHeld, h.queueRelease, h.queueInsert8, h.queueInsert32}
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
		db:     db,
		cfg:    cfg,
		q:      buildQueries(cfg.Prefix),
		txOpen: make(map[*sql.Tx]txState),
		gate:   newWriteGate(),

		pendingExt: make(map[int64]pendingExtension),
		fetched:    make(map[int64]fetchedLease),
	}
	s.busyMillis.Store(-1)
	return s, nil
}

// DB returns the database the store works on.
func (s *Store) DB() *sql.DB { return s.db }

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

// Close returns the connection the store kept between writes to the pool and releases the
// statements the store prepared; later calls still work, on plain SQL. It does not
// close the *sql.DB, which belongs to the caller.
func (s *Store) Close() error {
	s.acks.flush(context.Background(), s)
	s.closed.Store(true)
	s.gate.reclaim()
	return s.dropStmts()
}

func (s *Store) dropStmts() error {
	st := s.stmts.Swap(nil)
	if st == nil {
		return nil
	}
	var errs []error
	for _, p := range st.all() {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// prepareStmts prepares the hot statements once the tables exist, so that claims, fetches and
// acks do not parse SQL. It runs before the store takes the connection: with one connection,
// preparing on the *sql.DB while holding it would wait forever.
func (s *Store) prepareStmts(ctx context.Context) {
	if s.stmts.Load() != nil || s.closed.Load() {
		return
	}
	var (
		st   hotStmts
		errs []error
	)
	for _, p := range []struct {
		dst   **sql.Stmt
		query string
	}{
		{&st.claimInsert, s.q.claimInsert}, {&st.claimRead, s.q.claimSelect},
		{&st.queueRange, s.q.queueRange}, {&st.queueInsert, s.q.queueInsert}, {&st.queuePeek, s.q.queuePeek}, {&st.queueFetch, s.q.queueFetch}, {&st.queueAck, s.q.queueAck}, {&st.queueAckMany, s.q.queueAckMany}, {&st.queueHeld, s.q.queueHeld}, {&st.queueRelease, s.q.queueRelease}, {&st.queueInsert8, s.q.queueInsert8}, {&st.queueInsert32, s.q.queueInsert32},
	} {
		var err error
		s.ownPoolUse()
		*p.dst, err = s.db.PrepareContext(ctx, p.query)
		s.ownPoolDone()
		errs = append(errs, err)
	}
	if errors.Join(errs...) != nil {
		for _, p := range st.all() {
			if p != nil {
				_ = p.Close()
			}
		}
		return // not migrated yet: plain SQL until then
	}
	if !s.stmts.CompareAndSwap(nil, &st) {
		for _, p := range st.all() {
			_ = p.Close()
		}
		return
	}
	if s.closed.Load() {
		_ = s.dropStmts() // Close ran meanwhile
	}
}

// txStmt runs query in tx through its prepared statement when there is one (pick chooses it),
// else as plain SQL.
func (s *Store) txStmt(ctx context.Context, tx *sql.Tx, pick func(*hotStmts) *sql.Stmt, query string) stmtRunner {
	if st := s.stmts.Load(); st != nil {
		return tx.StmtContext(ctx, pick(st))
	}
	return plainStmt{tx: tx, query: query}
}

// stmtRunner is what a prepared statement and plain SQL in a transaction share.
type stmtRunner interface {
	ExecContext(ctx context.Context, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, args ...any) *sql.Row
}

// plainStmt runs query in tx without a prepared statement.
type plainStmt struct {
	tx    *sql.Tx
	query string
}

func (p plainStmt) ExecContext(ctx context.Context, args ...any) (sql.Result, error) {
	return p.tx.ExecContext(ctx, p.query, args...)
}

func (p plainStmt) QueryContext(ctx context.Context, args ...any) (*sql.Rows, error) {
	return p.tx.QueryContext(ctx, p.query, args...)
}

func (p plainStmt) QueryRowContext(ctx context.Context, args ...any) *sql.Row {
	return p.tx.QueryRowContext(ctx, p.query, args...)
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
	s.prepareStmts(ctx)
	w, err := s.startWrite(ctx)
	if err != nil {
		return fmt.Errorf("idemsqlite: begin transaction: %w", err)
	}
	committed := false
	defer func() { s.finishWrite(ctx, w, committed) }() // runs last, once the transaction has ended
	tx, stopRollback, err := w.begin(ctx)
	if err != nil {
		return fmt.Errorf("idemsqlite: begin transaction: %w", err)
	}
	defer stopRollback()
	s.gate.inTx.Store(true)
	s.txMu.Lock()
	s.txOpen[tx] = txState{}
	s.txMu.Unlock()
	done := false
	defer func() {
		s.txMu.Lock()
		st := s.txOpen[tx]
		delete(s.txOpen, tx)
		s.txMu.Unlock()
		if !done {
			// fn failed or panicked (the panic goes on after this deferred call).
			_ = tx.Rollback()
			return
		}
		s.signal(st.wakes)
		s.acks.add(s, st.acks)
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
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idemsqlite: commit: %w", err)
	}
	s.applyExtensions(ctx, tx)
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("idemsqlite: commit: %w", err)
	}
	done, committed = true, true
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
		// Waits of the store's own reads (another worker's fetch peek, QueueStats of a metrics
		// collector…) are not the handler's: they wait as long as the transaction, however
		// long a slow handler makes it. While no wait has ended since the start (checked next),
		// each own read that waits is still under way, so the reads under way now bound them.
		// Counting own reads begun since the start instead missed one that counted itself just
		// before the transaction began and waited just after: then a slow handler was taken
		// for a deadlock and cancelled.
		foreign := st.WaitCount - start.WaitCount - s.ownPoolUsers.Load()
		waiting := foreign > 0 && st.WaitDuration == start.WaitDuration
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
func (s *Store) ClaimTx(ctx context.Context, tx *sql.Tx, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	if p.Key.EventID == "" {
		return idemstore.ClaimResult{}, fmt.Errorf("idemsqlite: claim %s: event id is empty", p.Key)
	}
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	fp := p.Fingerprint
	var createdAt int64
	ctx, err := s.ownStmtCtx(ctx, tx)
	if err != nil {
		return idemstore.ClaimResult{}, fmt.Errorf("idemsqlite: claim: %w", err)
	}
	err = s.txStmt(ctx, tx, func(h *hotStmts) *sql.Stmt { return h.claimInsert }, s.q.claimInsert).
		QueryRowContext(ctx, p.Key.Tenant, p.Key.Consumer, p.Key.EventID, fp[:], now.UnixMicro()).Scan(&createdAt)
	if err == nil {
		return idemstore.ClaimResult{Status: idemstore.ClaimNew}, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return idemstore.ClaimResult{}, fmt.Errorf("idemsqlite: claim: %w", err)
	}
	var stored []byte
	err = s.txStmt(ctx, tx, func(h *hotStmts) *sql.Stmt { return h.claimRead }, s.q.claimSelect).
		QueryRowContext(ctx, p.Key.Tenant, p.Key.Consumer, p.Key.EventID).Scan(&stored, &createdAt)
	if err != nil {
		return idemstore.ClaimResult{}, fmt.Errorf("idemsqlite: read claim: %w", err)
	}
	existing, err := idem.FingerprintFromBytes(stored)
	if err != nil {
		return idemstore.ClaimResult{}, fmt.Errorf("idemsqlite: claim: %w", err)
	}
	res := idemstore.ClaimResult{Status: idemstore.ClaimDuplicate, Existing: existing, ClaimedAt: fromMicros(createdAt)}
	if existing != p.Fingerprint {
		res.Status = idemstore.ClaimConflict
	}
	return res, nil
}

// DeleteExpiredClaims deletes up to p.Limit claims created before p.Before (of p.Consumer, or of
// every consumer when it is empty) in one short transaction, and reports how many it deleted.
func (s *Store) DeleteExpiredClaims(ctx context.Context, p idemstore.DeleteExpiredClaimsParams) (int, error) {
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

// txState is what an open InTx transaction owes once it commits: the wake-ups of its
// publishes and the deletion of the queue jobs it acked.
type txState struct {
	wakes wakeFlags
	acks  []ackedJob
	// ackInTx: the transaction acked several jobs and deletes them itself (QueueAckTx).
	ackInTx bool
}

// txStateOf returns what the open InTx transaction tx owes so far; ours is false when tx is not
// one of InTx's (the caller began it).
// ownStmtCtx is the context for this Store's own short statements inside tx (a claim, a lease
// token check). In a transaction of InTx, on the write connection whose busy wait is off, such a
// statement waits for nothing, so it runs without the driver's watch of ctx: modernc starts a
// goroutine and sets a progress handler for each statement whose context can end, which costs
// more than the primary-key lookup itself. An ended ctx is returned as the error first; in any
// other transaction ctx is returned as it is.
func (s *Store) ownStmtCtx(ctx context.Context, tx *sql.Tx) (context.Context, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if _, ours := s.txStateOf(tx); !ours {
		return ctx, nil
	}
	return context.WithoutCancel(ctx), nil
}

func (s *Store) txStateOf(tx *sql.Tx) (st txState, ours bool) {
	s.txMu.Lock()
	defer s.txMu.Unlock()
	st, ours = s.txOpen[tx]
	return st, ours
}

// updateTxState applies update to what the open InTx transaction tx owes, and reports whether
// tx is one of InTx's (else nothing is recorded).
func (s *Store) updateTxState(tx *sql.Tx, update func(*txState)) bool {
	s.txMu.Lock()
	defer s.txMu.Unlock()
	st, ours := s.txOpen[tx]
	if ours {
		update(&st)
		s.txOpen[tx] = st
	}
	return ours
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
	if !s.updateTxState(tx, func(st *txState) { st.wakes |= flags }) {
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

// ownPoolUse records that the store is about to use the *sql.DB's pool itself, until
// ownPoolDone: while an InTx transaction holds the pool's one connection that use waits, and
// watchPoolWait must not take the wait for the handler's. Two calls rather than a returned
// func, so that the fetch path's peek allocates nothing for it.
func (s *Store) ownPoolUse() { s.ownPoolUsers.Add(1) }

// ownPoolDone ends a use that ownPoolUse recorded.
func (s *Store) ownPoolDone() { s.ownPoolUsers.Add(-1) }
