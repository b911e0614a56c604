package idemmysql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// TestClassifyError provokes the server's errors for real and checks their class: lock trouble
// and read-only servers are transient (a retry succeeds once the other transaction or the
// failover is done), data errors are permanent.
func TestClassifyError(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{})
	ctx := b.ctx
	_, err := b.db.ExecContext(ctx, `CREATE TABLE r (id INT PRIMARY KEY, v VARCHAR(4) NOT NULL) ENGINE=InnoDB`)
	require.NoError(t, err)
	_, err = b.db.ExecContext(ctx, `INSERT INTO r VALUES (1, 'a'), (2, 'b')`)
	require.NoError(t, err)

	conn := func() *sql.Conn {
		c, err := b.db.Conn(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	// Deadlock: each of two transactions locks a row, then wants the other's.
	deadlock := func() error {
		c1, c2 := conn(), conn()
		for _, c := range []*sql.Conn{c1, c2} {
			_, err := c.ExecContext(ctx, `BEGIN`)
			require.NoError(t, err)
		}
		defer func() {
			_, _ = c1.ExecContext(ctx, `ROLLBACK`)
			_, _ = c2.ExecContext(ctx, `ROLLBACK`)
		}()
		_, err := c1.ExecContext(ctx, `UPDATE r SET v = 'x' WHERE id = 1`)
		require.NoError(t, err)
		_, err = c2.ExecContext(ctx, `UPDATE r SET v = 'y' WHERE id = 2`)
		require.NoError(t, err)
		first := make(chan error, 1)
		go func() {
			_, err := c1.ExecContext(ctx, `UPDATE r SET v = 'x' WHERE id = 2`)
			first <- err
		}()
		waitForStatement(t, b, "UPDATE r SET v = 'x' WHERE id = 2")
		_, err2 := c2.ExecContext(ctx, `UPDATE r SET v = 'y' WHERE id = 1`)
		err1 := <-first
		return errors.Join(err1, err2) // one of them is the deadlock victim
	}()

	// Lock wait timeout: a second transaction waits longer than its 1 s allows.
	lockWait := func() error {
		c1, c2 := conn(), conn()
		_, err := c1.ExecContext(ctx, `BEGIN`)
		require.NoError(t, err)
		defer func() { _, _ = c1.ExecContext(ctx, `ROLLBACK`) }()
		_, err = c1.ExecContext(ctx, `UPDATE r SET v = 'x' WHERE id = 1`)
		require.NoError(t, err)
		_, err = c2.ExecContext(ctx, `SET SESSION innodb_lock_wait_timeout = 1`)
		require.NoError(t, err)
		_, err = c2.ExecContext(ctx, `UPDATE r SET v = 'z' WHERE id = 1`)
		return err
	}()

	readOnly := func() error {
		c := conn()
		_, err := c.ExecContext(ctx, `START TRANSACTION READ ONLY`)
		require.NoError(t, err)
		defer func() { _, _ = c.ExecContext(ctx, `ROLLBACK`) }()
		_, err = c.ExecContext(ctx, `UPDATE r SET v = 'q' WHERE id = 1`)
		return err
	}()

	_, dupErr := b.db.ExecContext(ctx, `INSERT INTO r VALUES (1, 'c')`)
	_, tooLongErr := b.db.ExecContext(ctx, `INSERT INTO r VALUES (3, 'too long')`)
	_, noTableErr := b.db.ExecContext(ctx, `SELECT * FROM no_such_table`)

	// A connection the server killed.
	killed := func() error {
		c1 := conn()
		var id int64
		require.NoError(t, c1.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id))
		_, err := b.db.ExecContext(ctx, fmt.Sprintf(`KILL CONNECTION %d`, id))
		require.NoError(t, err)
		_, err = c1.ExecContext(ctx, `SELECT 1`)
		return err
	}()

	tests := []struct {
		name string
		err  error
		want idem.Class
	}{
		{"nil", nil, idem.ClassUnknown},
		{"plain", errors.New("boom"), idem.ClassUnknown},
		{"deadlock", deadlock, idem.ClassTransient},
		{"deadlock wrapped", fmt.Errorf("handler: %w", deadlock), idem.ClassTransient},
		{"lock wait timeout", lockWait, idem.ClassTransient},
		{"read-only transaction", readOnly, idem.ClassTransient},
		{"killed connection", killed, idem.ClassTransient},
		{"invalid connection", mysql.ErrInvalidConn, idem.ClassTransient},
		{"bad connection", fmt.Errorf("x: %w", driver.ErrBadConn), idem.ClassTransient},
		{"read-only server", &mysql.MySQLError{Number: 1290, SQLState: [5]byte{'H', 'Y', '0', '0', '0'}, Message: "--read-only"}, idem.ClassTransient},
		{"duplicate key", dupErr, idem.ClassPermanent},
		{"data too long", tooLongErr, idem.ClassPermanent},
		{"no such table", noTableErr, idem.ClassPermanent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.err != nil && tt.name != "plain" {
				require.Error(t, tt.err)
			}
			require.Equal(t, tt.want, b.store.ClassifyError(tt.err), "error: %v", tt.err)
		})
	}
	var me *mysql.MySQLError
	require.True(t, errors.As(deadlock, &me))
	require.EqualValues(t, 1213, me.Number, "%v", deadlock)
	require.True(t, errors.As(lockWait, &me))
	require.EqualValues(t, 1205, me.Number, "%v", lockWait)
}

// waitForStatement waits until a connection of the test's database runs query (it is blocked).
func waitForStatement(t *testing.T, b *testBundle, query string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.db.QueryRowContext(context.Background(), `SELECT count(*) FROM information_schema.PROCESSLIST
			WHERE DB = ? AND INFO = ?`, b.name, query).Scan(&n))
		return n > 0
	}, 10*time.Second, 10*time.Millisecond, "%s never ran", strings.TrimSpace(query))
}
