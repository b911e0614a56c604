package chaos

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The roles a chaos run starts as separate processes.
const (
	RoleProducer = "producer"
	RoleRelay    = "relay"
	RoleConsumer = "consumer"
)

// RoleCommand is the hidden command of the idem binary that runs one role; the harness starts
// `<Executable> chaos-role --role … --pg (or --mysql) … …` unless Options.Command says otherwise.
const RoleCommand = "chaos-role"

// statPrefix starts the lines a role writes to its stats writer: "@chaos <counter> <n>".
const statPrefix = "@chaos "

// Fixed settings of the scenario, shared by the harness (which creates the stream) and the
// roles (whose retention must cover it).
const (
	// streamMaxAge bounds how long the stream keeps messages; it is the consumers'
	// RedeliveryWindow.
	streamMaxAge = time.Hour
	// streamDuplicates is JetStream's deduplication window.
	streamDuplicates = 2 * time.Minute
	// ackWait is the consumers' lease: short, so that the messages of a killed consumer come
	// back during the run.
	ackWait = 2 * time.Second
)

// RoleArgs configures one role process. The harness fills it and passes it on the command line
// (Flags); RoleMain parses it back.
type RoleArgs struct {
	// Name tells processes of one role apart in logs ("consumer-2").
	Name string
	// PostgresURL reaches PostgreSQL, or MySQLDSN MySQL or MariaDB (a go-sql-driver/mysql DSN
	// naming the run's database), through the harness's proxy; one of the two is set.
	PostgresURL, MySQLDSN string
	// Schema holds idem's and the scenario's tables of the run (PostgreSQL; on MySQL the
	// run's database, which MySQLDSN names, does).
	Schema string
	// NATSURL reaches the harness's NATS server; BrokerURL a RabbitMQ or Redis server instead
	// (one of the two is set).
	NATSURL, BrokerURL string
	// Stream, Subject and Durable name the run's JetStream stream, the subject the relay
	// publishes to and the durable consumer the consumers share.
	Stream, Subject, Durable string
	// RunID starts every event id of the run.
	RunID string
	// Seed decides which orders misbehave how.
	Seed int64
	// Rate is the producer's offered load in events per second.
	Rate int
	// Duplicates, Transient and Poison are the misbehaviour rates.
	Duplicates, Transient, Poison float64
	// Workers is a consumer's number of concurrent deliveries.
	Workers int
	// RetryBudget is a consumer's retry policy's MaxElapsed (default RetryBudgetDefault).
	RetryBudget time.Duration
	// InboxBucket partitions the claims table by this bucket of OccurredAt (0: plain table).
	InboxBucket time.Duration
	// Stats receives the role's counters as "@chaos <counter> <n>" lines (nil: discarded).
	Stats io.Writer
	// Logger receives the role's logs (nil: discarded).
	Logger *slog.Logger
}

// Flags returns a's fields as command-line flags for role, as RoleMain parses them.
func (a RoleArgs) Flags(role string) []string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	return []string{
		"--role", role, "--name", a.Name,
		"--pg", a.PostgresURL, "--mysql", a.MySQLDSN, "--schema", a.Schema,
		"--nats", a.NATSURL, "--broker", a.BrokerURL, "--stream", a.Stream, "--subject", a.Subject, "--durable", a.Durable,
		"--run", a.RunID, "--seed", strconv.FormatInt(a.Seed, 10), "--rate", strconv.Itoa(a.Rate),
		"--duplicates", f(a.Duplicates), "--transient", f(a.Transient), "--poison", f(a.Poison),
		"--workers", strconv.Itoa(a.Workers), "--retry-budget", a.RetryBudget.String(),
		"--inbox-bucket", a.InboxBucket.String(),
	}
}

// RoleMain runs the role process the harness started with argv (the flags of
// RoleArgs.Flags, plus --verbose and --watch-stdin): it logs to stderr (warnings, or
// everything with --verbose), writes its counters to stdout, and returns when ctx ends or,
// with --watch-stdin, when stdin reaches its end — the harness holds the other end of that
// pipe, so a role never outlives a harness that died without killing it. The idem command
// exposes it as the hidden `idem chaos-role`.
func RoleMain(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(RoleCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		a              RoleArgs
		role           string
		verbose, watch bool
	)
	fs.StringVar(&role, "role", "", "producer, relay or consumer")
	fs.StringVar(&a.Name, "name", "", "process name for logs")
	fs.StringVar(&a.PostgresURL, "pg", "", "PostgreSQL URL")
	fs.StringVar(&a.MySQLDSN, "mysql", "", "MySQL or MariaDB DSN (instead of --pg)")
	fs.StringVar(&a.Schema, "schema", "", "schema of the run")
	fs.StringVar(&a.NATSURL, "nats", "", "NATS URL")
	fs.StringVar(&a.BrokerURL, "broker", "", "RabbitMQ or Redis URL (instead of --nats)")
	fs.StringVar(&a.Stream, "stream", "", "JetStream stream")
	fs.StringVar(&a.Subject, "subject", "", "subject of the events")
	fs.StringVar(&a.Durable, "durable", "", "durable consumer")
	fs.StringVar(&a.RunID, "run", "", "run id")
	fs.Int64Var(&a.Seed, "seed", 1, "seed of the misbehaviour plan")
	fs.IntVar(&a.Rate, "rate", RateDefault, "events per second (producer)")
	fs.Float64Var(&a.Duplicates, "duplicates", 0, "duplicate rate")
	fs.Float64Var(&a.Transient, "transient", 0, "transient failure rate")
	fs.Float64Var(&a.Poison, "poison", 0, "poison rate")
	fs.IntVar(&a.Workers, "workers", WorkersDefault, "concurrent deliveries (consumer)")
	fs.DurationVar(&a.RetryBudget, "retry-budget", RetryBudgetDefault, "retry policy's MaxElapsed (consumer)")
	fs.DurationVar(&a.InboxBucket, "inbox-bucket", 0, "claims partitioned by this bucket of OccurredAt (0: plain table)")
	fs.BoolVar(&verbose, "verbose", false, "log everything, not only warnings")
	fs.BoolVar(&watch, "watch-stdin", false, "stop when stdin reaches its end")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("chaos: role: unexpected arguments %q", fs.Args())
	}
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelInfo
	}
	a.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	a.Stats = stdout

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if watch && stdin != nil {
		go func() {
			_, _ = io.Copy(io.Discard, stdin)
			cancel()
		}()
	}
	return RunRole(ctx, role, a)
}

// RunRole runs role ("producer", "relay" or "consumer") until ctx ends, then returns nil after
// a graceful stop. Every role survives the database and the broker going away and coming back;
// it returns an error only for arguments it cannot work with.
func RunRole(ctx context.Context, role string, a RoleArgs) error {
	if a.Logger == nil {
		a.Logger = slog.New(slog.DiscardHandler)
	}
	if a.Name == "" {
		a.Name = role
	}
	a.Logger = a.Logger.With(slog.String("role", a.Name))
	var errs []error
	if (a.PostgresURL == "") == (a.MySQLDSN == "") {
		errs = append(errs, errors.New("want one of --pg and --mysql"))
	}
	if a.Schema == "" && a.PostgresURL != "" {
		errs = append(errs, errors.New("--schema is empty"))
	}
	if a.RunID == "" {
		errs = append(errs, errors.New("--run is empty"))
	}
	if role == RoleProducer && a.Subject == "" {
		errs = append(errs, errors.New("--subject is empty"))
	}
	if (a.NATSURL == "") == (a.BrokerURL == "") {
		errs = append(errs, errors.New("want one of --nats and --broker"))
	} else if _, err := brokerKind(a.BrokerURL); err != nil {
		errs = append(errs, fmt.Errorf("--broker: %w", err))
	}
	if role == RoleConsumer && (a.Stream == "" || a.Durable == "") {
		errs = append(errs, errors.New("--stream and --durable are required for a consumer"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("chaos: role %s: %w", role, errors.Join(errs...))
	}
	st := newStats(a.Stats)
	switch role {
	case RoleProducer:
		return runProducer(ctx, a, st)
	case RoleRelay:
		return runRelay(ctx, a, st)
	case RoleConsumer:
		return runConsumer(ctx, a, st)
	}
	return fmt.Errorf("chaos: unknown role %q (want %s, %s or %s)", role, RoleProducer, RoleRelay, RoleConsumer)
}

// stats writes counter lines. Each is written at once, so a SIGKILL loses at most the line
// being written.
type stats struct {
	mu sync.Mutex
	w  io.Writer
}

func newStats(w io.Writer) *stats {
	if w == nil {
		w = io.Discard
	}
	return &stats{w: w}
}

func (s *stats) add(counter string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = io.WriteString(s.w, statPrefix+counter+" "+strconv.Itoa(n)+"\n")
}

// parseStat reads one "@chaos <counter> <n>" line.
func parseStat(line string) (counter string, n int, ok bool) {
	rest, found := strings.CutPrefix(line, statPrefix)
	if !found {
		return "", 0, false
	}
	counter, num, found := strings.Cut(rest, " ")
	if !found {
		return "", 0, false
	}
	n, err := strconv.Atoi(num)
	if err != nil {
		return "", 0, false
	}
	return counter, n, true
}

// scanLines calls each for every line of r until its end.
func scanLines(r io.Reader, each func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		each(sc.Text())
	}
	_, _ = io.Copy(io.Discard, r) // a line too long: keep draining so the writer never blocks
}

// openPool opens a pgx pool that notices dead connections quickly: a cut connection fails the
// statement that uses it and is replaced.
func openPool(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse PostgreSQL URL: %w", err)
	}
	cfg.MaxConns = maxConns
	cfg.HealthCheckPeriod = time.Second
	cfg.ConnConfig.ConnectTimeout = 3 * time.Second
	// pgxpool connects lazily, so a database that is down at start is not an error here.
	return pgxpool.NewWithConfig(ctx, cfg)
}

// connectNATS connects to url and keeps reconnecting for ever: the harness restarts the
// server during the run.
func connectNATS(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url,
		nats.Name("idem chaos "+name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.Timeout(2*time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	return nc, nil
}

// connectJetStream connects to url as connectNATS does and returns its JetStream and what
// closes the connection.
func connectJetStream(url, name string) (jetstream.JetStream, func(), error) {
	nc, err := connectNATS(url, name)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("JetStream: %w", err)
	}
	return js, nc.Close, nil
}

// sleepCtx waits d or until ctx ends, and reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
