package bench

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// The MySQL cases, each against the same SQL run without idem: mysql_baseline is the business
// effect alone, mysql_ceiling the claim idemmysql makes (a plain INSERT into the claims table)
// and the effect in one transaction with no Go work, then idem's per-event, batched and
// set-based paths over idemmysql.
var mysqlCases = []string{"mysql_baseline", "mysql_ceiling", "mysql_per_event", "mysql_batched", "mysql_set_batch"}

// my is the MySQL (or MariaDB) side of a run: a database of its own on Options.MySQLDSN's
// server, with idem's tables and the same business tables as PostgreSQL's, measured in the
// same process as the PostgreSQL cases.
type my struct {
	e     *env // the run's PostgreSQL env, for its options and event ids
	name  string
	cfg   *mysql.Config
	db    *sql.DB
	store *idemmysql.Store
}

func newMy(ctx context.Context, e *env) (*my, error) {
	cfg, err := mysql.ParseDSN(e.opts.MySQLDSN)
	if err != nil {
		return nil, fmt.Errorf("bench: mysql: %w", err)
	}
	m := &my{e: e, name: "idembench_" + randHex(4), cfg: cfg}
	if err := m.admin(ctx, "CREATE DATABASE `"+m.name+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		return nil, err
	}
	c := cfg.Clone()
	c.DBName = m.name
	conn, err := mysql.NewConnector(c)
	if err != nil {
		return nil, fmt.Errorf("bench: mysql: %w", err)
	}
	m.db = sql.OpenDB(conn)
	maxC := 4
	for _, n := range e.opts.Concurrency {
		maxC = max(maxC, n+4)
	}
	m.db.SetMaxOpenConns(maxC)
	m.db.SetMaxIdleConns(maxC)
	if m.store, err = idemmysql.NewWithConfig(m.db, idemmysql.Config{}); err != nil {
		m.close()
		return nil, fmt.Errorf("bench: mysql: %w", err)
	}
	if err := m.store.Migrate(ctx); err != nil {
		m.close()
		return nil, fmt.Errorf("bench: mysql: migrate: %w", err)
	}
	values := make([]string, e.opts.Wallets)
	for i := range values {
		values[i] = fmt.Sprintf("(%d, 0)", i)
	}
	for _, q := range []string{
		`CREATE TABLE wallets (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB`,
		`CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(255) NOT NULL, wallet INT NOT NULL, amount BIGINT NOT NULL) ENGINE=InnoDB`,
		`INSERT INTO wallets (id, balance) VALUES ` + strings.Join(values, ", "),
	} {
		if _, err := m.db.ExecContext(ctx, q); err != nil {
			m.close()
			return nil, fmt.Errorf("bench: mysql: business tables: %w", err)
		}
	}
	return m, nil
}

// admin runs a statement with no database selected (to create or drop the run's).
func (m *my) admin(ctx context.Context, q string) error {
	c := m.cfg.Clone()
	c.DBName = ""
	conn, err := mysql.NewConnector(c)
	if err != nil {
		return fmt.Errorf("bench: mysql: %w", err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	if _, err := db.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("bench: mysql: %w", err)
	}
	return nil
}

func (m *my) close() {
	if m.store != nil {
		_ = m.store.Close()
	}
	if m.db != nil {
		_ = m.db.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = m.admin(ctx, "DROP DATABASE IF EXISTS `"+m.name+"`")
}

// creditSet is env.creditSet on MySQL: one multi-row ledger insert, then one update per wallet
// the set touches, in wallet order (so that concurrent sets lock wallets in one order).
func (m *my) creditSet(ctx context.Context, tx *sql.Tx, msgs []idem.Message) error {
	args := make([]any, 0, 2*len(msgs))
	counts := map[int]int{}
	for _, msg := range msgs {
		w := walletOf(msg, m.e.opts.Wallets)
		args = append(args, msg.EventID, w)
		counts[w]++
	}
	q := `INSERT INTO ledger (event_id, wallet, amount) VALUES ` + strings.TrimSuffix(strings.Repeat("(?, ?, 1), ", len(msgs)), ", ")
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return err
	}
	wallets := make([]int, 0, len(counts))
	for w := range counts {
		wallets = append(wallets, w)
	}
	slices.Sort(wallets)
	for _, w := range wallets {
		res, err := tx.ExecContext(ctx, `UPDATE wallets SET balance = balance + ? WHERE id = ?`, counts[w], w)
		if err != nil {
			return err
		}
		if err := idem.ExpectResult(res, 1); err != nil {
			return err
		}
	}
	return nil
}

func (m *my) consumer(name string, batch int, set bool) (*idem.Consumer[*sql.Tx], error) {
	return idem.NewConsumer(m.store, sqlConsumerConfig(name, batch, set, m.e.opts.Wallets, creditSQL, m.creditSet))
}

// inTx runs fn in a transaction, retrying a deadlock (InnoDB's gap and row locks on the wallets)
// as idem's consumer would.
func (m *my) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	for {
		err := func() error {
			tx, err := m.db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if err := fn(tx); err != nil {
				return err
			}
			return tx.Commit()
		}()
		if m.store.ClassifyError(err) != idem.ClassTransient || ctx.Err() != nil {
			return err
		}
	}
}

// baseline is env.baseline on MySQL: the business effect alone, one transaction per event.
func (m *my) baseline(ctx context.Context, conc int) (Result, error) {
	msgs := m.e.messages(m.e.opts.Events)
	d, err := parallel(ctx, msgs, conc, 1, func(ctx context.Context, part []idem.Message) error {
		return m.inTx(ctx, func(tx *sql.Tx) error {
			return creditSQL(ctx, tx, part[0].EventID, walletOf(part[0], m.e.opts.Wallets))
		})
	})
	return storeResult("mysql", "mysql_baseline", conc, 0, len(msgs), d), err
}

// ceiling is env.ceiling on MySQL: the claim idemmysql makes and the effect, with no Go work.
func (m *my) ceiling(ctx context.Context, conc int) (Result, error) {
	msgs := m.e.messages(m.e.opts.Events)
	fp := make([]byte, 32)
	d, err := parallel(ctx, msgs, conc, 1, func(ctx context.Context, part []idem.Message) error {
		return m.inTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO idem_claims (tenant, consumer, event_id, fingerprint, created_at)
				VALUES (?, 'ceiling@v1', ?, ?, ?)`, part[0].Tenant, part[0].EventID, fp, time.Now().UnixMicro()); err != nil {
				return err
			}
			return creditSQL(ctx, tx, part[0].EventID, walletOf(part[0], m.e.opts.Wallets))
		})
	})
	return storeResult("mysql", "mysql_ceiling", conc, 0, len(msgs), d), err
}

func (m *my) perEvent(ctx context.Context, conc int) (Result, error) {
	return runSQLCase(ctx, m.e, "mysql", m.consumer, conc, 1, false)
}

func (m *my) batched(ctx context.Context, conc, batch int, set bool) (Result, error) {
	return runSQLCase(ctx, m.e, "mysql", m.consumer, conc, batch, set)
}

// run runs the wanted MySQL cases at concurrency conc.
func (m *my) run(ctx context.Context, conc int, want func(string) bool, add func(Result, error) error) error {
	for _, c := range []struct {
		name string
		run  func(ctx context.Context, conc int) (Result, error)
	}{{"mysql_baseline", m.baseline}, {"mysql_ceiling", m.ceiling}, {"mysql_per_event", m.perEvent}} {
		if want(c.name) {
			if err := add(c.run(ctx, conc)); err != nil {
				return err
			}
		}
	}
	for _, set := range []bool{false, true} {
		if (!set && !want("mysql_batched")) || (set && !want("mysql_set_batch")) {
			continue
		}
		for _, b := range m.e.opts.BatchSizes {
			if err := add(m.batched(ctx, conc, b, set)); err != nil {
				return err
			}
		}
	}
	return nil
}
