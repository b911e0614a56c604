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
// enough for a waiting process's retry to take the lock.
const (
	// writeStreak is how long one store writes back to back before it yields the lock.
	writeStreak = 20 * time.Millisecond
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
type writeGate struct {
	sem chan struct{} // capacity 1: a token in it means held
	// inTx is set while the holder is an InTx transaction (which holds SQLite's write lock
	// until it ends); QueueExtend reads it.
	inTx atomic.Bool
	// Guarded by sem.
	streakStart, lastEnd time.Time
}

func newWriteGate() *writeGate { return &writeGate{sem: make(chan struct{}, 1)} }

// acquire takes the gate, then pauses writeGap when this store has written back to back for
// writeStreak (a pause of its own since the last write counts).
func (g *writeGate) acquire(ctx context.Context) error {
	select {
	case g.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	now := time.Now()
	if g.lastEnd.IsZero() || now.Sub(g.lastEnd) >= writeGap {
		g.streakStart = now
		return nil
	}
	if now.Sub(g.streakStart) < writeStreak {
		return nil
	}
	if err := sleep(ctx, writeGap-now.Sub(g.lastEnd)); err != nil {
		<-g.sem
		return err
	}
	g.streakStart = time.Now()
	return nil
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

// release ends the holder's write.
func (g *writeGate) release() {
	g.lastEnd = time.Now()
	g.inTx.Store(false)
	<-g.sem
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
	// busy is the connection's busy timeout, restored by done.
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
// retryBusy does the waiting. The caller must call w.done.
func (s *Store) startWrite(ctx context.Context) (*writeConn, error) {
	if err := s.gate.acquire(ctx); err != nil {
		return nil, err
	}
	return s.startHeldWrite(ctx)
}

// startHeldWrite is startWrite when the caller took the gate already.
func (s *Store) startHeldWrite(ctx context.Context) (*writeConn, error) {
	c, err := s.db.Conn(ctx)
	if err != nil {
		s.gate.release()
		return nil, err
	}
	busy, err := s.busyTimeout(ctx, c)
	if err == nil && busy > 0 {
		_, err = c.ExecContext(ctx, `PRAGMA busy_timeout = 0`)
	}
	if err != nil {
		_ = c.Close()
		s.gate.release()
		return nil, err
	}
	return &writeConn{conn: c, busy: busy}, nil
}

// restoreBusy sets the connection's busy timeout back, through tx when one is open on it.
func (w *writeConn) restoreBusy(ctx context.Context, tx *sql.Tx) error {
	if w.busy <= 0 {
		return nil
	}
	q := fmt.Sprintf(`PRAGMA busy_timeout = %d`, w.busy.Milliseconds())
	var err error
	if tx != nil {
		_, err = tx.ExecContext(ctx, q)
	} else {
		_, err = w.conn.ExecContext(context.WithoutCancel(ctx), q)
	}
	w.busy = 0 // restored, or the connection is broken and will be replaced
	return err
}

// done restores the busy timeout (unless restoreBusy did), returns the connection to the pool
// and releases the gate.
func (s *Store) finishWrite(ctx context.Context, w *writeConn) {
	_ = w.restoreBusy(ctx, nil)
	_ = w.conn.Close()
	s.gate.release()
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
	defer s.finishWrite(ctx, w)
	return w.retryBusy(ctx, func() error { return fn(ctx, w.conn) })
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
