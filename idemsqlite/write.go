package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// How the store shares SQLite's one write lock with other processes (docs/sqlite.md).
//
// SQLite's own busy handler sleeps ever longer between tries (up to 100 ms each), and a busy
// process releases the lock for microseconds between two transactions, so a waiting process
// almost never catches it and fails with SQLITE_BUSY after the busy timeout. The store
// therefore does the waiting itself: it takes the lock with SQLite's busy wait off and retries
// every few hundred microseconds with jitter, for as long as the connection's busy timeout; and
// after writing back to back for writeStreak, it pauses writeGap before its next write, long
// enough for a waiting process's retry to take the lock. A process alone on the file would pay
// that pause for nobody, so each pause that no other connection used (the file's data_version
// did not move) doubles the time to the next one, up to writeStreakMax; a write of another
// connection brings it back to writeStreak.
const (
	// writeStreak is how long one store writes back to back before it yields the lock, and how
	// long it keeps the connection from the readers of its own process.
	writeStreak = 20 * time.Millisecond
	// writeStreakMax bounds the time between two pauses when no other connection writes to the
	// file: a process that starts writing waits at most about this long for its first turn.
	writeStreakMax = 160 * time.Millisecond
	// writeGap is the pause that hands the lock to a waiting process; it is at least twice
	// busyBackoffMax, so a waiter's retry falls inside it.
	writeGap = 2 * time.Millisecond
	// busyBackoffMin and busyBackoffMax bound the sleep between two tries for the write lock; each
	// sleep is drawn from [d/2, d] and d doubles from min to max.
	busyBackoffMin = 100 * time.Microsecond
	busyBackoffMax = time.Millisecond
)

// writeGate serialises a store's writes in this process and spaces them out, so that other
// processes get the write lock between them. It is held from before BEGIN to after COMMIT.
//
// A holder that ends its write while other writes of the store wait for the gate keeps the
// connection for them (held), with SQLite's busy wait still off, instead of returning it to the
// pool: under load the store then sets busy_timeout once per run of writes, not twice per write.
// The connection goes back to the pool (busy timeout restored) when nobody waits and at the end
// of each writeStreak, so that readers of this process wait at most that long for it.
type writeGate struct {
	sem chan struct{} // capacity 1: a token in it means held
	// inTx is set while the holder is an InTx transaction (which holds SQLite's write lock
	// until it ends); QueueExtend reads it.
	inTx atomic.Bool
	// waiting counts the goroutines blocked in acquire.
	waiting atomic.Int32
	// Guarded by sem. streakStart is when the connection was last handed to the pool's readers,
	// runStart when the last pause (or idle gap) ended, and runLen how long the store may write
	// from runStart before it pauses: writeStreak, or more while no other connection writes.
	streakStart, runStart, lastEnd time.Time
	runLen                         time.Duration
	// version is the file's data_version read at the last pause (versionOK: it was read).
	version   int64
	versionOK bool
	// held is the connection a holder kept for the next one; nil when it is in the pool.
	held *writeConn
}

func newWriteGate() *writeGate { return &writeGate{sem: make(chan struct{}, 1), runLen: writeStreak} }

// acquire takes the gate, then pauses writeGap when this store has written back to back for
// runLen (a pause of its own since the last write counts), and hands the connection to the
// pool's readers every writeStreak.
func (g *writeGate) acquire(ctx context.Context) error {
	select {
	case g.sem <- struct{}{}:
	default:
		g.waiting.Add(1)
		select {
		case g.sem <- struct{}{}:
			g.waiting.Add(-1)
		case <-ctx.Done():
			g.waiting.Add(-1)
			g.reclaim() // the connection may have been kept for this waiter
			return ctx.Err()
		}
	}
	now := time.Now()
	if g.lastEnd.IsZero() || now.Sub(g.lastEnd) >= writeGap {
		g.streakStart, g.runStart = now, now
		return nil
	}
	if now.Sub(g.runStart) < g.runLen {
		if now.Sub(g.streakStart) >= writeStreak {
			g.dropHeld() // readers of this process get the connection
			g.streakStart = now
		}
		return nil
	}
	switch moved, known := g.othersWrote(ctx); {
	case !known: // keep runLen
	case moved:
		g.runLen = writeStreak
	default:
		g.runLen = min(2*g.runLen, writeStreakMax)
	}
	g.dropHeld() // readers of this process get the connection during the pause
	if err := sleep(ctx, writeGap-now.Sub(g.lastEnd)); err != nil {
		<-g.sem
		return err
	}
	g.streakStart = time.Now()
	g.runStart = g.streakStart
	return nil
}

// othersWrote reports whether another connection has committed to the file since the last
// pause that could tell, from SQLite's data_version on the kept connection (moved), and whether
// it could tell (known: a connection is kept and the pragma answered). The first read of a
// store counts as moved.
func (g *writeGate) othersWrote(ctx context.Context) (moved, known bool) {
	if g.held == nil {
		return false, false
	}
	var v int64
	if err := g.held.conn.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&v); err != nil {
		return false, false
	}
	moved = !g.versionOK || v != g.version
	g.version, g.versionOK = v, true
	return moved, true
}

// acquireUnlessTx takes the gate like acquire (without the pause), unless an InTx transaction
// holds it: then it returns false at once instead of waiting for that transaction to end.
func (g *writeGate) acquireUnlessTx(ctx context.Context) (bool, error) {
	for {
		select {
		case g.sem <- struct{}{}:
			return true, nil
		default:
		}
		if g.inTx.Load() {
			return false, nil
		}
		if err := sleep(ctx, 500*time.Microsecond); err != nil {
			return false, err
		}
	}
}

// release ends the holder's write. w is the connection it wrote on (nil when it got none) and
// reusable says whether the write ended cleanly: then w is kept for a waiting writer, within
// the streak, and else returned to the pool.
func (g *writeGate) release(w *writeConn, reusable bool) {
	g.lastEnd = time.Now()
	g.inTx.Store(false)
	// acquire hands the connection to the pool's readers every writeStreak.
	keep := w != nil && reusable && g.waiting.Load() > 0
	if keep {
		g.held = w
	} else if w != nil {
		w.close()
	}
	<-g.sem
	if keep {
		// The waiters may all have given up between the check and here; the last one to leave
		// reclaims too, so one of the two returns the connection.
		g.reclaim()
	}
}

// reclaim returns a kept connection to the pool when nobody waits for the gate and nobody
// holds it (a holder uses the connection or returns it itself).
func (g *writeGate) reclaim() {
	if g.waiting.Load() > 0 {
		return
	}
	select {
	case g.sem <- struct{}{}:
	default:
		return
	}
	g.dropHeld()
	<-g.sem
}

// dropHeld returns the kept connection, if any, to the pool; the caller holds the gate.
func (g *writeGate) dropHeld() {
	if w := g.held; w != nil {
		g.held = nil
		w.close()
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// isBusy reports whether err is SQLITE_BUSY (or one of its extended codes).
func isBusy(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}

// writeConn is the store's connection reserved for one write, with SQLite's busy wait off.
type writeConn struct {
	conn *sql.Conn
	// busy is the connection's busy timeout, restored by close.
	busy time.Duration
}

// busyTimeout returns the busy timeout of the connections of s.db (read once: every connection
// Open makes has the same).
func (s *Store) busyTimeout(ctx context.Context, c *sql.Conn) (time.Duration, error) {
	if ms := s.busyMillis.Load(); ms >= 0 {
		return time.Duration(ms) * time.Millisecond, nil
	}
	var ms int64
	if err := c.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&ms); err != nil {
		return 0, fmt.Errorf("idemsqlite: read busy_timeout: %w", err)
	}
	s.busyMillis.Store(ms)
	return time.Duration(ms) * time.Millisecond, nil
}

// startWrite takes the gate and the connection, and turns SQLite's busy wait off on it, so that
// retryBusy does the waiting. The caller must call finishWrite.
func (s *Store) startWrite(ctx context.Context) (*writeConn, error) {
	if err := s.gate.acquire(ctx); err != nil {
		return nil, err
	}
	return s.startHeldWrite(ctx)
}

// startHeldWrite is startWrite when the caller took the gate already. It takes the connection
// the previous holder kept, when there is one (its busy wait is off already), else one from
// the pool.
func (s *Store) startHeldWrite(ctx context.Context) (*writeConn, error) {
	if w := s.gate.held; w != nil {
		s.gate.held = nil
		return w, nil
	}
	c, err := s.db.Conn(ctx)
	if err != nil {
		s.gate.release(nil, false)
		return nil, err
	}
	busy, err := s.busyTimeout(ctx, c)
	if err == nil && busy > 0 {
		_, err = c.ExecContext(ctx, `PRAGMA busy_timeout = 0`)
	}
	if err != nil {
		_ = c.Close()
		s.gate.release(nil, false)
		return nil, err
	}
	return &writeConn{conn: c, busy: busy}, nil
}

// close sets the busy timeout back and returns the connection to the pool.
func (w *writeConn) close() {
	if w.busy > 0 {
		// An error leaves a broken connection, which the pool replaces.
		_, _ = w.conn.ExecContext(context.Background(), fmt.Sprintf(`PRAGMA busy_timeout = %d`, w.busy.Milliseconds()))
	}
	_ = w.conn.Close()
}

// finishWrite ends a write: it keeps the connection for a waiting writer when the write ended
// cleanly (reusable), else it restores the busy timeout and returns the connection to the pool;
// then it releases the gate.
func (s *Store) finishWrite(_ context.Context, w *writeConn, reusable bool) {
	s.gate.release(w, reusable)
}

// retryBusy runs try until it returns anything but SQLITE_BUSY, sleeping a jittered, growing
// backoff between tries, for at most w.busy (the connection's busy timeout); then the last
// SQLITE_BUSY is returned. try must have no effect when it fails with SQLITE_BUSY (a BEGIN, or
// a statement in autocommit mode, which fails before it writes).
func (w *writeConn) retryBusy(ctx context.Context, try func() error) error {
	deadline := time.Now().Add(w.busy)
	d := busyBackoffMin
	for {
		err := try()
		if err == nil || !isBusy(err) || !time.Now().Before(deadline) {
			return err
		}
		if err := sleep(ctx, d/2+rand.N(d/2+1)); err != nil {
			return err
		}
		d = min(2*d, busyBackoffMax)
	}
}

// begin starts a transaction on w (BEGIN retried on SQLITE_BUSY) and returns it with the
// function that stops its rollback on ctx's end. The driver gets ctx without its end: on this
// connection, whose busy wait is off, BEGIN and COMMIT wait for nothing, and modernc would start
// a goroutine and set a progress handler to watch each of them. As database/sql does for a
// context that ends, the transaction rolls back when ctx ends before it is over, so that it
// stops holding the file's write lock; the caller checks ctx before it commits.
func (w *writeConn) begin(ctx context.Context) (*sql.Tx, func() bool, error) {
	var tx *sql.Tx
	err := w.retryBusy(ctx, func() error {
		var err error
		tx, err = w.conn.BeginTx(context.WithoutCancel(ctx), nil)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return tx, context.AfterFunc(ctx, func() { _ = tx.Rollback() }), nil
}

// write runs fn, one statement in autocommit mode, as a write of this store: through the gate,
// retrying SQLITE_BUSY. fn runs again after SQLITE_BUSY, so it must reset what it collects.
func (s *Store) write(ctx context.Context, fn func(ctx context.Context, c *sql.Conn) error) error {
	if err := s.gate.acquire(ctx); err != nil {
		return err
	}
	return s.heldWrite(ctx, fn)
}

// heldWrite is write when the caller took the gate already; it releases it.
func (s *Store) heldWrite(ctx context.Context, fn func(ctx context.Context, c *sql.Conn) error) error {
	w, err := s.startHeldWrite(ctx)
	if err != nil {
		return err
	}
	ok := false
	defer func() { s.finishWrite(ctx, w, ok) }()
	err = w.retryBusy(ctx, func() error { return fn(ctx, w.conn) })
	ok = err == nil
	return err
}

// execWrite is ExecContext as a write of this store.
func (s *Store) execWrite(ctx context.Context, query string, args ...any) (sql.Result, error) {
	var res sql.Result
	err := s.write(ctx, func(ctx context.Context, c *sql.Conn) error {
		var err error
		res, err = c.ExecContext(ctx, query, args...)
		return err
	})
	return res, err
}

// queryWrite runs a statement that writes and returns rows (… RETURNING) as a write of this
// store, calling scan for each row; reset runs before each try.
func (s *Store) queryWrite(ctx context.Context, reset func(), scan func(*sql.Rows) error, query string, args ...any) error {
	return s.write(ctx, func(ctx context.Context, c *sql.Conn) error {
		reset()
		rows, err := c.QueryContext(ctx, query, args...)
		if err != nil {
			return err
		}
		for rows.Next() {
			if err := scan(rows); err != nil {
				return errors.Join(err, rows.Close())
			}
		}
		return errors.Join(rows.Err(), rows.Close())
	})
}

// writeTx runs fn in a write transaction of the store (through the gate, BEGIN retried on
// SQLITE_BUSY) and commits it when fn returns nil. It is InTx without what only a caller's
// transaction needs (wake-ups after commit, lease extensions, the pool-wait watchdog).
func (s *Store) writeTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	w, err := s.startWrite(ctx)
	if err != nil {
		return err
	}
	committed := false
	defer func() { s.finishWrite(ctx, w, committed) }()
	tx, stopRollback, err := w.begin(ctx)
	if err != nil {
		return err
	}
	defer stopRollback()
	if err := fn(ctx, tx); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	if err := ctx.Err(); err != nil {
		return errors.Join(fmt.Errorf("commit: %w", err), tx.Rollback())
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	committed = true
	return nil
}
