package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem/cmd/idem/internal/bench"
	"github.com/idemkit/idem/cmd/idem/internal/chaos"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
)

// newBenchCmd measures idem against its ceilings on PostgreSQL, every case side by side in one
// process against one database (a fresh schema, dropped afterwards).
func newBenchCmd(e *env) *cobra.Command {
	var (
		store, natsURL, cases string
		sqsURL                string
		redisURL, amqpURL     string
		mysqlURL              string
		asJSON, soak          bool
		events, rate          int
		conc, batches         []int
		claims                int
		duration              time.Duration
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure idem against the database's ceilings (PostgreSQL)",
		Long: `bench runs its cases side by side against the same PostgreSQL database. By default:
baseline, ceiling, per_event, batched, set_batch, the pipelines but Redis and RabbitMQ's,
outbox_e2e and memory; --cases names others.

  baseline, ceiling        the business effect without idem; the claim and effect SQL alone
  per_event, batched       idem's consumer, one event or a batch (10, 100, 500) per transaction
  set_batch, set_ceiling   one multi-row effect per batch, and the same SQL without idem
  pipeline_queue, pipeline_jetstream, pipeline_sqs, pipeline_kafka, pipeline_pubsub
                           publish → consume → commit → ack (Kafka, Pub/Sub and SQS on the
                           in-process kfake and pstest servers and moto); on request
                           pipeline_redis (--redis) and pipeline_amqp (--amqp)
  outbox_e2e               producer commit to consumer commit at a fixed offered rate
  relay, relay_ceiling     the relay draining an outbox backlog to JetStream, and the same
                           fetch-publish-mark loop in plain SQL
  memory                   allocations and heap per event
  idem_queue_noop, idem_queue_effect
                           a pre-filled queue table drained per event, batched and set-based
                           (idem's side of riverbench's comparison with River)
  large_inbox              10 million existing claims
  sqlite_ceiling, sqlite_per_event, sqlite_batched, sqlite_set_batch, sqlite_pipeline
                           in a temporary database file
  mysql_baseline, mysql_ceiling, mysql_per_event, mysql_batched, mysql_set_batch
                           with --mysql, in a database of their own on that server

It prints a table and the ratios against idem's targets, or with --json one object per case
("cases"), the ratios by name ("ratios", such as "set_batch/per_event") and the targets they are
held to ("targets"). --soak runs the soak instead: the outbox → JetStream → consumer path at a
steady rate for --duration.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			su, err := connect.ParseStore(e.resolveStore(store))
			if err != nil {
				return usageError{err}
			}
			if su.Kind != connect.KindPostgres {
				return usagef("bench measures PostgreSQL: --store must be postgres://…, not %s", su)
			}
			ctx := cmd.Context()
			logf := func(format string, args ...any) {
				if !asJSON {
					fmt.Fprintf(e.stderr, format+"\n", args...)
				}
			}
			if soak {
				rep, err := bench.Soak(ctx, bench.SoakOptions{PostgresURL: su.URL, NATSURL: natsURL, Rate: rate, Duration: duration, Logf: logf})
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(e.stdout, rep)
				}
				fmt.Fprintf(e.stdout, "events %d in %.0f s (%.0f events/s), handling p99 %.1f ms, latency p50 %.1f ms p99 %.1f ms\n",
					rep.Events, rep.Seconds, rep.EventsPerS, rep.HandlingP99, rep.LatencyP50, rep.LatencyP99)
				first, last := rep.Samples[0], rep.Samples[len(rep.Samples)-1]
				fmt.Fprintf(e.stdout, "heap %.1f → %.1f MiB, goroutines %d → %d, double applied %d, lost %d, books balance: %v\n",
					first.HeapMiB, last.HeapMiB, first.Goroutines, last.Goroutines, rep.DoubleApply, rep.Lost, rep.BooksBalance)
				if !rep.BooksBalance {
					return exitError{code: ExitFailure, err: fmt.Errorf("soak: the books do not balance")}
				}
				return nil
			}
			var mysqlDSN string
			if mysqlURL != "" {
				mu, err := connect.ParseStore(mysqlURL)
				if err != nil {
					return usageError{fmt.Errorf("--mysql: %w", err)}
				}
				if mu.Kind != connect.KindMySQL {
					return usagef("--mysql must be mysql://USER@HOST:PORT/DB, not %s", mu)
				}
				mysqlDSN = mu.DSN
			}
			opts := bench.Options{PostgresURL: su.URL, MySQLDSN: mysqlDSN, NATSURL: natsURL, SQSURL: sqsURL, RedisURL: redisURL, AMQPURL: amqpURL, Events: events, Concurrency: conc, BatchSizes: batches,
				LargeInboxClaims: claims, OfferedRate: rate, Logf: logf,
				// The queue-table drain cases, idem's side of riverbench's comparison with River.
				Extra: bench.QueueDrainCases()}
			if cases != "" {
				opts.Cases = strings.Split(cases, ",")
			}
			if err := opts.WithDefaults().Validate(); err != nil {
				return usageError{err}
			}
			rs, err := bench.Run(ctx, opts)
			if err != nil {
				return err
			}
			if asJSON {
				targets := bench.Ratios(rs)
				return writeJSON(e.stdout, map[string]any{"cases": rs, "ratios": bench.RatioMap(targets), "targets": targets})
			}
			return bench.WriteTable(e.stdout, rs, bench.Ratios(rs))
		},
	}
	fl := cmd.Flags()
	storeFlag(cmd, &store)
	fl.StringVar(&natsURL, "nats", "", "NATS URL for the JetStream cases (nats://HOST:PORT); they are skipped without it")
	fl.StringVar(&sqsURL, "sqs", "", "SQS broker URL for the SQS pipeline case (sqs://HOST:PORT?region=REGION, as --broker takes); it is skipped without it")
	fl.StringVar(&amqpURL, "amqp", "", "RabbitMQ URL for the pipeline case pipeline_amqp (amqp://USER:PASSWORD@HOST:PORT/VHOST); it is skipped without it")
	fl.StringVar(&mysqlURL, "mysql", "", "MySQL or MariaDB URL for the mysql_* cases (mysql://USER@HOST:PORT/DB; the run creates and drops a database of its own); they are skipped without it")
	fl.StringVar(&redisURL, "redis", "", "Redis URL for the Redis Streams pipeline case pipeline_redis (redis://HOST:PORT); it is skipped without it")
	fl.StringVar(&cases, "cases", "", "comma-separated cases (default: see above)")
	fl.IntVar(&events, "events", 2000, "events per case and setting")
	fl.IntSliceVar(&conc, "concurrency", []int{1, 4, 8, 16}, "worker counts")
	fl.IntSliceVar(&batches, "batch", []int{10, 100, 500}, "batch sizes of the batched case")
	fl.IntVar(&claims, "claims", 10_000_000, "claims preloaded by large_inbox")
	fl.IntVar(&rate, "rate", 0, "offered rate in events/s for outbox_e2e and --soak (default 500 and 200)")
	fl.BoolVar(&soak, "soak", false, "run the soak instead of the cases")
	fl.Var(newDuration(&duration, 10*time.Minute), "duration", "how long --soak offers events")
	jsonFlag(cmd, &asJSON)
	return cmd
}

// newChaosCmd runs the chaos harness: producer, relay and consumers as separate processes
// (this binary, through the hidden chaos-role command) under SIGKILL, database cuts and stalls
// and NATS restarts, then checks the books from the database.
func newChaosCmd(e *env) *cobra.Command {
	var (
		store     string
		asJSON    bool
		verbose   bool
		keep      bool
		opts      chaos.Options
		rate      int
		consumers int
	)
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Break things on purpose and check exactly-once from the database (PostgreSQL or MySQL + embedded NATS, or SQLite)",
		Long: `chaos runs the payments scenario with the producer, the relay and the consumers as separate
processes, SIGKILLs a random one every 1–3 s and restarts it, cuts or stalls the database
connections through a proxy it controls, restarts the NATS server it owns, and keeps producing
duplicates, transient failures and poison meanwhile. It also injects database outages longer
than the consumers' retry budget, windows in which every dead-letter write fails, poison
identities (blank, control-character, NUL, invalid UTF-8, 3 KB and 12 KB ids, 10 KB tenants),
re-sends of events with a new OccurredAt, and a broker that refuses one message of a pipelined
batch; the JSON report has a section per fault class. Then it drains and checks from the database
alone: every valid event applied exactly once, none lost, balances exact, every poison message
dead-lettered once with the right reason, nothing left in the outbox, no claim without its effect
and no effect without its claim; and from the stream, that each wallet's payments reached it in
commit order. It exits 1 on any violation.

With --broker amqp://… or redis://… the events go through that server instead (a queue or stream
of the run's own, reached through a proxy of the harness), and every 5–10 s the run's connections
are cut with new ones refused for a moment (a restart, as the run sees it), closed from the
server's side (rabbitmqctl close_connection, CLIENT KILL ID) or stalled (as DEBUG SLEEP would);
never anyone else's, so a shared server is safe. The broker refusing a pipelined message is NATS
only, and per-key order is not read back from a RabbitMQ queue.

With --store mysql://… the run works in a database of its own on a MySQL 8 or MariaDB server
(the user needs CREATE, DROP and TRIGGER), with the same faults: its connections are cut and
stalled through the proxy, and a trigger refuses dead-letter writes with error 1041.

With --store sqlite://PATH (a file that must not exist yet; the run leaves it behind) it runs the
embedded default's crash scenario instead: a producer (an order and its outbox row per
transaction, 100/s offered), the relay and a consumer (4 workers, handlers that hold their
transaction 2 ms, 2,000 jobs queued before the start) as three processes of this binary on that
one file, SIGKILLs a random one every 1–3 s and restarts it, for --duration; then it stops the
producer, lets the outbox and the queue drain (--drain-timeout), and checks from the file: no
event applied twice, none lost, nothing pending, no claim without its effect, no dead letter,
PRAGMA integrity_check ok. It prints each process's progress per second (from the file's own
timestamps), its kills and the errors it saw (SQLITE_BUSY counted apart), and exits 1 on a broken
guarantee. --seed, --json apply; the other flags are for PostgreSQL and MySQL.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			su, err := connect.ParseStore(e.resolveStore(store))
			if err != nil {
				return usageError{err}
			}
			switch su.Kind {
			case connect.KindSQLite:
				return runSQLiteChaos(cmd.Context(), e, sqliteChaos{path: su.Path, duration: opts.Duration,
					drainTimeout: opts.DrainTimeout, seed: opts.Seed, asJSON: asJSON})
			case connect.KindPostgres:
				opts.PostgresURL = su.URL
			case connect.KindMySQL:
				opts.MySQLDSN = su.DSN
			default:
				return usagef("chaos runs on PostgreSQL, MySQL or SQLite: --store must be postgres://…, mysql://… or sqlite://…, not %s", su)
			}
			opts.Rate, opts.Consumers, opts.Keep, opts.Verbose = rate, consumers, keep, verbose
			if !asJSON {
				opts.Out = e.stderr
			}
			opts = opts.WithDefaults()
			if err := opts.Validate(); err != nil {
				return usageError{err}
			}
			rep, err := chaos.Run(cmd.Context(), opts)
			if err != nil {
				return err
			}
			return writeChaosReport(e, asJSON, rep, rep.OK, rep.Violations)
		},
	}
	fl := cmd.Flags()
	storeFlag(cmd, &store)
	fl.Var(newDuration(&opts.Duration, chaos.DurationDefault), "duration", "how long the chaos goes on before the drain")
	fl.IntVar(&rate, "rate", 0, "offered events per second (default 200)")
	fl.IntVar(&consumers, "consumers", 0, "consumer processes (default 2)")
	fl.Var(newDuration(&opts.DrainTimeout, chaos.DrainTimeoutDefault), "drain-timeout", "how long the system may take to drain after the chaos (a run that does not drain in time fails)")
	fl.IntVar(&opts.Outages, "outages", 0, "database outages longer than the retry budget (default 1, or one per 3 minutes of chaos)")
	fl.Var(newDuration(&opts.RetryBudget, chaos.RetryBudgetDefault), "retry-budget", "the consumers' retry budget (MaxElapsed); every outage outlasts it")
	fl.BoolVar(&opts.PlainInbox, "plain-inbox", false, "keep the plain claims table (default: partitioned by day of OccurredAt, where a re-send with a new OccurredAt lands in another partition)")
	fl.Int64Var(&opts.Seed, "seed", 0, "seed of the misbehaviour and the chaos schedule (0: random, reported)")
	fl.StringVar(&opts.BrokerURL, "broker", "", "a RabbitMQ (amqp://…) or Redis (redis://…) server instead of the embedded NATS one; every 5–10 s the run cuts, closes (server side) or stalls its own connections there")
	fl.BoolVar(&keep, "keep", false, "keep the run's schema for inspection")
	fl.BoolVarP(&verbose, "verbose", "v", false, "forward the processes' logs")
	jsonFlag(cmd, &asJSON)
	return cmd
}

// newChaosRoleCmd is the hidden command the chaos harness starts its processes with.
func newChaosRoleCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:                chaos.RoleCommand,
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return chaos.RoleMain(cmd.Context(), args, e.stdin, e.stdout, e.stderr)
		},
	}
}
