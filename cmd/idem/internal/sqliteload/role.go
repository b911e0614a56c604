package sqliteload

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemsqlite"
)

// The roles of a run, each a process of its own.
const (
	RoleProducer = "producer"
	RoleRelay    = "relay"
	RoleConsumer = "consumer"
)

// Roles are the roles of a run, in the order they start.
var Roles = []string{RoleProducer, RoleRelay, RoleConsumer}

// The scenario.
const (
	// ConsumerName is the consumer whose claims the check reads.
	ConsumerName = "orders@v1"
	// Topic is the outbox topic and queue the orders go through.
	Topic = "orders"
	// relayID is the relay's stable identity: a restarted relay resumes its partitions at once.
	relayID = "sqliteload-relay"
	// consumerLease is the consumer's queue lease: the jobs a killed consumer held (its workers'
	// and those its Source fetched ahead) come back within it.
	consumerLease = 5 * time.Second
	// readyLine is what a role process writes to stdout once it is ready to work.
	readyLine = "ready"
)

// roleFlags are the settings a role process is started with.
type roleFlags struct {
	db      string
	every   time.Duration // producer: one order per every
	hold    time.Duration // consumer: time each handler spends inside its transaction
	workers int           // consumer workers
}

// RoleArgs returns the arguments that start role on the SQLite file at path with o's settings;
// RoleMain reads them.
func RoleArgs(role, path string, o Options) []string {
	return []string{role, "--db", path, "--every", o.ProduceEvery.String(), "--hold", o.HandlerHold.String(),
		"--workers", strconv.Itoa(o.Workers)}
}

// RoleMain is the body of a role process (args from RoleArgs): it opens the database as a service
// would (Open, New, Migrate) and works until ctx ends or stdin closes (the harness holds the
// other end, so a role never outlives it). Once migrated it writes "ready" to stdout. Every
// error its caller sees (the producer's InTx) or
// that is logged at warning level or above (relay and consumer) is written to stderr, one line
// each, for the harness to count.
func RoleMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("sqliteload: role: want producer, relay or consumer")
	}
	role := args[0]
	var f roleFlags
	fs := flag.NewFlagSet(role, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.db, "db", "", "the SQLite file")
	fs.DurationVar(&f.every, "every", ProduceEveryDefault, "producer: one order per this")
	fs.DurationVar(&f.hold, "hold", HandlerHoldDefault, "consumer: time a handler spends in its transaction")
	fs.IntVar(&f.workers, "workers", WorkersDefault, "consumer workers")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if f.db == "" {
		return fmt.Errorf("sqliteload: role %s: --db is empty", role)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, bufio.NewReader(stdin))
		cancel()
	}()
	db, store, err := openMigrated(ctx, f.db)
	if err != nil {
		return err
	}
	defer db.Close()
	defer store.Close()
	if _, err := io.WriteString(stdout, readyLine+"\n"); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	switch role {
	case RoleProducer:
		produce(ctx, store, f.every, logger)
		return nil
	case RoleRelay:
		return relay(ctx, store, logger)
	case RoleConsumer:
		return consume(ctx, store, f, logger)
	default:
		return fmt.Errorf("sqliteload: unknown role %q (want producer, relay or consumer)", role)
	}
}

// produce offers one order every every: the order row and its outbox row in one transaction. A
// tick missed while a transaction waits is dropped, not caught up.
func produce(ctx context.Context, store *idemsqlite.Store, every time.Duration, logger *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			var id int64
			if err := tx.QueryRowContext(ctx, `INSERT INTO orders (at) VALUES (?) RETURNING id`,
				time.Now().UnixMicro()).Scan(&id); err != nil {
				return err
			}
			key := strconv.FormatInt(id, 10)
			return store.EnqueueTx(ctx, tx, idem.Outgoing{EventID: "order-" + key, Topic: Topic, Key: key,
				Type: "order.placed", Payload: []byte(`{}`)})
		})
		if err != nil && ctx.Err() == nil {
			logger.Error("produce", "err", err)
		}
	}
}

// relay runs an idemrelay over the queue-table sink, as `idem relay --broker sql` does, with a
// stable identity.
func relay(ctx context.Context, store *idemsqlite.Store, logger *slog.Logger) error {
	r, err := idemrelay.New(store, idemqueue.NewSink(store), idemrelay.Config{
		ID: relayID, PollInterval: 50 * time.Millisecond, Logger: logger,
	})
	if err != nil {
		return err
	}
	if err := r.Run(ctx); err != nil && ctx.Err() == nil {
		logger.Error("relay run", "err", err)
	}
	return nil
}

// consume runs a consumer over the queue table whose handler records the event in an
// append-only table (no unique key: only idem keeps it single) and then spends f.hold in its
// transaction.
func consume(ctx context.Context, store *idemsqlite.Store, f roleFlags, logger *slog.Logger) error {
	c, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{
		Name: ConsumerName,
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO applied (event_id, at) VALUES (?, ?)`,
				msg.EventID, time.Now().UnixMicro()); err != nil {
				return err
			}
			time.Sleep(f.hold)
			return nil
		},
		Workers:         f.workers,
		ShutdownTimeout: 2 * time.Second,
		Observe:         idem.ObserveConfig{Logger: logger, Observer: pauseLogger{logger}},
	})
	if err != nil {
		return err
	}
	src, err := idemqueue.NewSource[*sql.Tx](store, idemqueue.SourceConfig{Queue: Topic, Lease: consumerLease, MaxWait: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	if err := c.Run(ctx, src); err != nil && ctx.Err() == nil {
		logger.Error("consumer run", "err", err)
	}
	return nil
}

// pauseLogger reports a consumer pause as an error.
type pauseLogger struct{ logger *slog.Logger }

func (pauseLogger) Observe(idem.Observation) {}

func (p pauseLogger) Paused(consumer string) { p.logger.Error("consumer paused", "consumer", consumer) }

// openMigrated opens the file, with its store migrated; the caller closes both.
func openMigrated(ctx context.Context, path string) (*sql.DB, *idemsqlite.Store, error) {
	db, err := idemsqlite.Open(path)
	if err != nil {
		return nil, nil, err
	}
	store := idemsqlite.New(db)
	if err := store.Migrate(ctx); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("sqliteload: migrate: %w", err), store.Close(), db.Close())
	}
	return db, store, nil
}
