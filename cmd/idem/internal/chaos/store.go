package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemrelay"
)

// The generic layer under the roles: what the producer, the relays and the consumers need of
// the run's store, whatever its dialect. The scenario's SQL is written once (payments.DB, ?
// placeholders); a store is a handful of functions over its transaction type.

// txStore is what the roles call on an idem store whose transactions are TX: idempg.Store
// (pgx.Tx) and idemmysql.Store (*sql.Tx) both have these methods.
type txStore[TX any] interface {
	InTx(ctx context.Context, fn func(ctx context.Context, tx TX) error) error
	EnqueueTx(ctx context.Context, tx TX, msgs ...idem.Outgoing) error
	SavepointTx(ctx context.Context, tx TX, fn func(ctx context.Context, tx TX) error) error
}

// roleStore is the run's store as a role sees it (through the harness's proxy).
type roleStore interface {
	// db runs the scenario's own statements.
	db() *payments.DB
	// write runs fn in one transaction of the store.
	write(ctx context.Context, fn func(ctx context.Context, tx writeTx) error) error
	// newRelay returns the outbox relay over sink.
	newRelay(sink idem.Sink, cfg idemrelay.Config) (*idemrelay.Relay, error)
	// consume runs ledger@v1 on src until ctx ends or the consumer pauses itself.
	consume(ctx context.Context, a RoleArgs, st *stats, src idem.Source, window time.Duration) error
	close()
}

// writeTx is one transaction of the producer.
type writeTx interface {
	// exec runs one of the scenario's statements (payments.DB's form).
	exec(ctx context.Context, q string, args ...any) error
	// strings runs a query of one text column.
	strings(ctx context.Context, q string, args ...any) ([]string, error)
	// enqueue writes events to the outbox.
	enqueue(ctx context.Context, outs ...idem.Outgoing) error
	// offer offers out to the outbox in a savepoint that is always rolled back, and reports
	// whether the outbox took it.
	offer(ctx context.Context, out idem.Outgoing) (bool, error)
}

// sqlStore is a roleStore over store, whose transactions are TX.
type sqlStore[TX any] struct {
	d     *payments.DB
	store txStore[TX]
	// execTx runs a statement in a transaction and returns the rows it affected; queryTx a
	// query of one text column.
	execTx  func(ctx context.Context, tx TX, q string, args ...any) (int64, error)
	queryTx func(ctx context.Context, tx TX, q string, args ...any) ([]string, error)
	// newConsumer and relay are idem.NewConsumer and idemrelay.New on the concrete store.
	newConsumer func(cfg idem.ConsumerConfig[TX]) (*idem.Consumer[TX], error)
	relay       func(sink idem.Sink, cfg idemrelay.Config) (*idemrelay.Relay, error)
	closeFn     func()
}

func (s *sqlStore[TX]) db() *payments.DB { return s.d }
func (s *sqlStore[TX]) close()           { s.closeFn() }

func (s *sqlStore[TX]) newRelay(sink idem.Sink, cfg idemrelay.Config) (*idemrelay.Relay, error) {
	return s.relay(sink, cfg)
}

func (s *sqlStore[TX]) write(ctx context.Context, fn func(ctx context.Context, tx writeTx) error) error {
	return s.store.InTx(ctx, func(ctx context.Context, tx TX) error {
		return fn(ctx, sqlTx[TX]{s: s, tx: tx})
	})
}

// sqlTx is a writeTx of an sqlStore.
type sqlTx[TX any] struct {
	s  *sqlStore[TX]
	tx TX
}

func (t sqlTx[TX]) exec(ctx context.Context, q string, args ...any) error {
	_, err := t.s.execTx(ctx, t.tx, t.s.d.SQL(q), args...)
	return err
}

func (t sqlTx[TX]) strings(ctx context.Context, q string, args ...any) ([]string, error) {
	return t.s.queryTx(ctx, t.tx, t.s.d.SQL(q), args...)
}

func (t sqlTx[TX]) enqueue(ctx context.Context, outs ...idem.Outgoing) error {
	return t.s.store.EnqueueTx(ctx, t.tx, outs...)
}

// errOffered rolls the savepoint of an accepted offer back.
var errOffered = errors.New("chaos: offered to the outbox, rolled back")

func (t sqlTx[TX]) offer(ctx context.Context, out idem.Outgoing) (bool, error) {
	err := t.s.store.SavepointTx(ctx, t.tx, func(ctx context.Context, tx TX) error {
		if err := t.s.store.EnqueueTx(ctx, tx, out); err != nil {
			return err
		}
		return errOffered
	})
	switch {
	case errors.Is(err, errOffered):
		return true, nil
	case errors.Is(err, idem.ErrTxEnded):
		return false, fmt.Errorf("roll back the outbox edge check: %w", err)
	}
	return false, nil // refused, as it must be
}

func (s *sqlStore[TX]) consume(ctx context.Context, a RoleArgs, st *stats, src idem.Source, window time.Duration) error {
	h := &ledgerHandler[TX]{
		seed: a.Seed, transient: a.Transient, stats: st, runID: a.RunID, exec: s.execTx,
		insertLedger: s.d.SQL(`INSERT INTO {ledger} (run_id, event_id, wallet_id, amount_cents) VALUES (?, ?, ?, ?)`),
		creditWallet: s.d.SQL(`UPDATE {wallets} SET balance_cents = balance_cents + ? WHERE run_id = ? AND id = ?`),
	}
	consumer, err := s.newConsumer(idem.ConsumerConfig[TX]{
		Name:            payments.ConsumerName,
		Handler:         h.credit,
		Workers:         a.Workers,
		ShutdownTimeout: 5 * time.Second,
		Input:           idem.InputConfig{Validator: idem.ValidatorFunc(payments.Validate)},
		Failure:         idem.FailureConfig{Retry: consumerRetry(a.RetryBudget)},
		Claims:          idem.ClaimConfig{RedeliveryWindow: window},
		Observe:         idem.ObserveConfig{Logger: a.Logger, Observer: statsObserver{st}},
	})
	if err != nil {
		return err
	}
	return consumer.Run(ctx, src)
}

// openRoleStore opens the run's store for a role, with at most maxConns connections.
func openRoleStore(ctx context.Context, a RoleArgs, maxConns int) (roleStore, error) {
	if a.MySQLDSN != "" {
		return openMySQLRole(a, maxConns)
	}
	pool, err := openPool(ctx, a.PostgresURL, int32(maxConns))
	if err != nil {
		return nil, err
	}
	store, err := idempg.NewWithConfig(pool, storeConfig(a.Schema, a.InboxBucket))
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &sqlStore[pgx.Tx]{
		d:     payments.NewPostgresDB(pool, a.Schema, idempg.PrefixDefault),
		store: store,
		execTx: func(ctx context.Context, tx pgx.Tx, q string, args ...any) (int64, error) {
			tag, err := tx.Exec(ctx, q, args...)
			return tag.RowsAffected(), err
		},
		queryTx: func(ctx context.Context, tx pgx.Tx, q string, args ...any) ([]string, error) {
			rows, err := tx.Query(ctx, q, args...)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowTo[string])
		},
		newConsumer: func(cfg idem.ConsumerConfig[pgx.Tx]) (*idem.Consumer[pgx.Tx], error) {
			return idem.NewConsumer(store, cfg)
		},
		relay: func(sink idem.Sink, cfg idemrelay.Config) (*idemrelay.Relay, error) {
			return idemrelay.New(store, sink, cfg)
		},
		closeFn: func() { store.Close(); pool.Close() },
	}, nil
}

// openMySQL opens dsn with timeouts that notice a dead server quickly: a cut connection fails
// the statement that uses it and is replaced.
func openMySQL(dsn string, maxConns int) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse MySQL DSN: %w", err)
	}
	cfg.Timeout = 3 * time.Second
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("MySQL DSN: %w", err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxIdleTime(30 * time.Second)
	return db, nil
}

func openMySQLRole(a RoleArgs, maxConns int) (roleStore, error) {
	db, err := openMySQL(a.MySQLDSN, maxConns)
	if err != nil {
		return nil, err
	}
	store, err := idemmysql.NewWithConfig(db, idemmysql.Config{})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return &sqlStore[*sql.Tx]{
		d:     payments.NewSQLDB(db, payments.MySQL, idemmysql.PrefixDefault),
		store: store,
		execTx: func(ctx context.Context, tx *sql.Tx, q string, args ...any) (int64, error) {
			res, err := tx.ExecContext(ctx, q, args...)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		},
		queryTx: func(ctx context.Context, tx *sql.Tx, q string, args ...any) ([]string, error) {
			rows, err := tx.QueryContext(ctx, q, args...)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var out []string
			for rows.Next() {
				var s string
				if err := rows.Scan(&s); err != nil {
					return nil, err
				}
				out = append(out, s)
			}
			return out, rows.Err()
		},
		newConsumer: func(cfg idem.ConsumerConfig[*sql.Tx]) (*idem.Consumer[*sql.Tx], error) {
			return idem.NewConsumer(store, cfg)
		},
		relay: func(sink idem.Sink, cfg idemrelay.Config) (*idemrelay.Relay, error) {
			return idemrelay.New(store, sink, cfg)
		},
		closeFn: func() { _ = store.Close(); _ = db.Close() },
	}, nil
}
