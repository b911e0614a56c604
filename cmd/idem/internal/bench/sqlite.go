package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemsqlite"
)

// lite is the SQLite side of a run: a database file of its own (Open's settings: WAL, one
// connection, BEGIN IMMEDIATE, synchronous NORMAL) with idem's tables and the same business
// tables as PostgreSQL's, measured in the same process as the PostgreSQL cases.
type lite struct {
	e     *env // the run's PostgreSQL env, for its options and event ids
	dir   string
	db    *sql.DB
	store *idemsqlite.Store
}

func newLite(ctx context.Context, e *env) (*lite, error) {
	dir, err := os.MkdirTemp("", "idembench-sqlite-")
	if err != nil {
		return nil, fmt.Errorf("bench: sqlite: %w", err)
	}
	l := &lite{e: e, dir: dir}
	if l.db, err = idemsqlite.Open(filepath.Join(dir, "bench.db")); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("bench: sqlite: %w", err)
	}
	l.store = idemsqlite.New(l.db)
	if err := l.store.Migrate(ctx); err != nil {
		l.close()
		return nil, fmt.Errorf("bench: sqlite: migrate: %w", err)
	}
	if _, err := l.db.ExecContext(ctx, `CREATE TABLE wallets (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
		CREATE TABLE ledger (id INTEGER PRIMARY KEY, event_id TEXT NOT NULL, wallet INTEGER NOT NULL, amount INTEGER NOT NULL);
		WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n + 1 < ?)
		INSERT INTO wallets SELECT n, 0 FROM g`, e.opts.Wallets); err != nil {
		l.close()
		return nil, fmt.Errorf("bench: sqlite: business tables: %w", err)
	}
	return l, nil
}

func (l *lite) close() {
	_ = l.store.Close()
	_ = l.db.Close()
	_ = os.RemoveAll(l.dir)
}

// creditSQL is env.credit on the database/sql stores (SQLite and MySQL share its SQL).
func creditSQL(ctx context.Context, tx *sql.Tx, eventID string, wallet int) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO ledger (event_id, wallet, amount) VALUES (?, ?, 1)`, eventID, wallet); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, `UPDATE wallets SET balance = balance + 1 WHERE id = ?`, wallet)
	if err != nil {
		return err
	}
	return idem.ExpectResult(res, 1)
}

// creditSet is env.creditSet on SQLite: the set goes in as one JSON array of [event_id, wallet]
// pairs, then one multi-row insert and one update per wallet touched.
func (l *lite) creditSet(ctx context.Context, tx *sql.Tx, msgs []idem.Message) error {
	pairs := make([][2]any, len(msgs))
	wallets := make(map[int]struct{}, len(msgs))
	for i, m := range msgs {
		w := walletOf(m, l.e.opts.Wallets)
		pairs[i] = [2]any{m.EventID, w}
		wallets[w] = struct{}{}
	}
	set, err := json.Marshal(pairs)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO ledger (event_id, wallet, amount)
		SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), 1 FROM json_each(?)`, set); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, `UPDATE wallets SET balance = balance + d.n
		FROM (SELECT json_extract(value, '$[1]') AS wallet, count(*) AS n FROM json_each(?) GROUP BY 1) AS d
		WHERE wallets.id = d.wallet`, set)
	if err != nil {
		return err
	}
	return idem.ExpectResult(res, int64(len(wallets)))
}

func (l *lite) consumer(name string, batch int, set bool) (*idem.Consumer[*sql.Tx], error) {
	return idem.NewConsumer(l.store, sqlConsumerConfig(name, batch, set, l.e.opts.Wallets, creditSQL, l.creditSet))
}

// sqlConsumerConfig is the consumer of the database/sql stores' cases: credit per event, and
// creditSet as its set handler when set.
func sqlConsumerConfig(name string, batch int, set bool, wallets int,
	credit func(ctx context.Context, tx *sql.Tx, eventID string, wallet int) error,
	creditSet func(ctx context.Context, tx *sql.Tx, msgs []idem.Message) error) idem.ConsumerConfig[*sql.Tx] {
	cfg := idem.ConsumerConfig[*sql.Tx]{
		Name: name,
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			return credit(ctx, tx, msg.EventID, walletOf(msg, wallets))
		},
		Observe: idem.ObserveConfig{
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		},
	}
	if batch > 1 {
		cfg.Batch = idem.BatchConfig{Enabled: true, Size: batch}
	}
	if set {
		cfg.SetHandler = creditSet
	}
	return cfg
}

// storeResult is result for a case on another store than PostgreSQL.
func storeResult(store, name string, conc, batch, n int, d time.Duration) Result {
	r := result(name, conc, batch, n, d)
	r.Store = store
	return r
}

// ceiling is env.ceiling on SQLite: the claim idemsqlite makes and the effect, with no Go work.
func (l *lite) ceiling(ctx context.Context, conc int) (Result, error) {
	msgs := l.e.messages(l.e.opts.Events)
	fp := make([]byte, 32)
	d, err := parallel(ctx, msgs, conc, 1, func(ctx context.Context, part []idem.Message) error {
		tx, err := l.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		var at int64
		if err := tx.QueryRowContext(ctx, `INSERT INTO idem_claims (tenant, consumer, event_id, fingerprint, created_at)
			VALUES (?, 'ceiling@v1', ?, ?, ?) ON CONFLICT DO NOTHING RETURNING created_at`,
			part[0].Tenant, part[0].EventID, fp, time.Now().UnixMicro()).Scan(&at); err != nil {
			return err
		}
		if err := creditSQL(ctx, tx, part[0].EventID, walletOf(part[0], l.e.opts.Wallets)); err != nil {
			return err
		}
		return tx.Commit()
	})
	return storeResult("sqlite", "sqlite_ceiling", conc, 0, len(msgs), d), err
}

// runSQLCase runs store's per-event case (batch 1), or its batched or set-based case, through
// a ledger@v1 consumer from newConsumer.
func runSQLCase(ctx context.Context, e *env, store string, newConsumer func(name string, batch int, set bool) (*idem.Consumer[*sql.Tx], error),
	conc, batch int, set bool) (Result, error) {
	c, err := newConsumer("ledger@v1", batch, set)
	if err != nil {
		return Result{}, err
	}
	name := store + "_per_event"
	switch {
	case batch > 1 && set:
		name = store + "_set_batch"
	case batch > 1:
		name = store + "_batched"
	}
	return processSQL(ctx, e, store, name, c, conc, batch, set)
}

// processSQL runs e's events through c in chunks of batch (1: Process, else ProcessBatch or
// ProcessSet) and reports them as case name on store.
func processSQL(ctx context.Context, e *env, store, name string, c *idem.Consumer[*sql.Tx], conc, batch int, set bool) (Result, error) {
	n := e.opts.Events
	if batch > 1 {
		n = max(n, conc*batch*2)
	}
	msgs := e.messages(n)
	d, err := parallel(ctx, msgs, conc, batch, func(ctx context.Context, part []idem.Message) error {
		var rs []idem.Result
		switch {
		case batch <= 1:
			r := c.Process(ctx, part[0])
			rs = []idem.Result{r}
		case set:
			rs = c.ProcessSet(ctx, part)
		default:
			rs = c.ProcessBatch(ctx, part)
		}
		for _, r := range rs {
			if r.Outcome != idem.OutcomeProcessed {
				return fmt.Errorf("%s: outcome %s: %v", name, r.Outcome, r.Err)
			}
		}
		return nil
	})
	if batch <= 1 {
		batch = 0
	}
	return storeResult(store, name, conc, batch, len(msgs), d), err
}

func (l *lite) perEvent(ctx context.Context, conc int) (Result, error) {
	return runSQLCase(ctx, l.e, "sqlite", l.consumer, conc, 1, false)
}

func (l *lite) batched(ctx context.Context, conc, batch int, set bool) (Result, error) {
	return runSQLCase(ctx, l.e, "sqlite", l.consumer, conc, batch, set)
}

// pipeline is pipeline_queue on SQLite: publish to the queue table, Consumer.Run with workers,
// commit (the delivery acked in the same transaction), measured like the PostgreSQL pipelines.
func (l *lite) pipeline(ctx context.Context, workers, batch int) (Result, error) {
	queue := "bench_" + randHex(4)
	src, err := idemqueue.NewSource(l.store, idemqueue.SourceConfig{Queue: queue})
	if err != nil {
		return Result{}, err
	}
	// Close waits for a fetch ahead still under way and gives back the jobs it holds, so none
	// runs into the next case or the schema's drop.
	defer func() { _ = src.Close() }()
	n := l.e.opts.Events
	lat := &latencies{published: make(map[string]time.Time, n), done: make(chan struct{}), want: int64(n)}
	c, err := l.consumer("pipeline@v1", batch, false)
	if err != nil {
		return Result{}, err
	}
	cfg := c.Config()
	cfg.Workers, cfg.Observe.Observer = workers, lat
	if c, err = idem.NewConsumer(l.store, cfg); err != nil {
		return Result{}, err
	}
	r, err := l.e.drive(ctx, "sqlite_pipeline", workers, batch, n, lat, c, src, func(ctx context.Context, msgs []idem.Message) error {
		return l.store.QueuePublish(ctx, queue, msgs...)
	})
	r.Store = "sqlite"
	return r, err
}
