package chaos

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/idemnats"
)

// Defaults of Options.
const (
	DurationDefault     = 30 * time.Second
	DrainTimeoutDefault = 2 * time.Minute
	RateDefault         = 200
	ConsumersDefault    = 2
	RelaysDefault       = 1
	WorkersDefault      = 8
	DuplicatesDefault   = 0.05
	TransientDefault    = 0.05
	PoisonDefault       = 0.01
	// RetryBudgetDefault is the consumers' retry budget (their policy's MaxElapsed): short, so
	// that the database outages (OutageFor) outlast it.
	RetryBudgetDefault = 10 * time.Second
	// InboxBucketDefault partitions the claims table by day, so that a re-send with another
	// OccurredAt lands in another bucket: the claim key alone must still decide.
	InboxBucketDefault = 24 * time.Hour
	// RateMax bounds Options.Rate; ConsumersMax and RelaysMax the process counts.
	RateMax      = 10000
	ConsumersMax = 16
	RelaysMax    = 8
)

// Defaults of the chaos intervals, each a range [min, max] a duration is drawn from uniformly.
var (
	KillEveryDefault    = [2]time.Duration{time.Second, 3 * time.Second}
	RestartDelayDefault = [2]time.Duration{100 * time.Millisecond, time.Second}
	FaultEveryDefault   = [2]time.Duration{3 * time.Second, 7 * time.Second}
	StallForDefault     = [2]time.Duration{2 * time.Second, 4 * time.Second}
	CutForDefault       = [2]time.Duration{200 * time.Millisecond, 1500 * time.Millisecond}
	NATSDownDefault     = [2]time.Duration{500 * time.Millisecond, 2 * time.Second}
	// BrokerFaultEveryDefault is the pause between two broker faults on RabbitMQ or Redis: the
	// run's connections closed by the server, stalled, or cut (the broker gone for BrokerDown).
	BrokerFaultEveryDefault = [2]time.Duration{5 * time.Second, 10 * time.Second}
	BrokerDownDefault       = [2]time.Duration{500 * time.Millisecond, 2 * time.Second}
	// DeadLetterFailEveryDefault and DeadLetterFailForDefault: the pause between two windows in
	// which every dead-letter write fails, and the length of one.
	DeadLetterFailEveryDefault = [2]time.Duration{5 * time.Second, 10 * time.Second}
	DeadLetterFailForDefault   = [2]time.Duration{2 * time.Second, 4 * time.Second}
)

// outageGrace is how long after a database outage a valid event may still end as a
// retries_exhausted dead letter, on top of the retry budget: the consumers work off the
// backlog the outage left.
const outageGrace = 30 * time.Second

// Options configures a chaos run. Zero fields take the defaults above (see WithDefaults).
type Options struct {
	// PostgresURL is the database, or MySQLDSN a MySQL 8 or MariaDB 10.6+ one (a
	// go-sql-driver/mysql DSN); one of the two is required. The run works in a fresh schema
	// (PostgreSQL) or database (MySQL: CREATE DATABASE and TRIGGER needed) of its own, dropped
	// at the end unless Keep.
	PostgresURL, MySQLDSN string
	// Duration is how long chaos goes on (default DurationDefault); the system then drains.
	Duration time.Duration
	// DrainTimeout bounds the drain after the chaos (default DrainTimeoutDefault).
	DrainTimeout time.Duration
	// KillEvery is the range of the pause between two SIGKILLs of a random role process
	// (default 1–3 s); RestartDelay the range of the pause before the killed one restarts.
	KillEvery, RestartDelay [2]time.Duration
	// FaultEvery is the range of the pause between two database faults: a cut (every
	// connection dropped, new ones refused for CutFor) or a stall (no byte moves for StallFor).
	FaultEvery, CutFor, StallFor [2]time.Duration
	// NATSRestarts is how many times the NATS server restarts, spread over the run (default 2,
	// or one a minute for runs longer than two minutes); NATSDown the range of each downtime.
	NATSRestarts int
	NATSDown     [2]time.Duration
	// BrokerURL runs the events through a RabbitMQ (amqp://) or Redis (redis://) server instead
	// of the embedded NATS server. The run uses a queue or stream of its own, reached through
	// a proxy of the harness, and every BrokerFaultEvery it either closes its roles'
	// connections from the server's side (rabbitmqctl close_connection; CLIENT KILL ID), or
	// stalls them for StallFor (what DEBUG SLEEP would do to the run), or cuts them and refuses
	// new ones for BrokerDown (what a restart looks like to the run); never anyone else's.
	BrokerURL                    string
	BrokerFaultEvery, BrokerDown [2]time.Duration
	// Outages is how many database outages longer than the consumers' retry budget the run
	// has, spread over it (default 1, or one per three minutes for longer runs): every
	// connection dropped and new ones refused for OutageFor (default RetryBudget + 2–5 s).
	Outages   int
	OutageFor [2]time.Duration
	// RetryBudget is the consumers' retry policy's MaxElapsed (default RetryBudgetDefault).
	RetryBudget time.Duration
	// InboxBucket partitions the claims table by day (24h, the default) or hour buckets of
	// OccurredAt; PlainInbox keeps the plain claims table instead.
	InboxBucket time.Duration
	PlainInbox  bool
	// DeadLetterFailEvery is the range of the pause between two windows in which every
	// dead-letter write fails (a trigger refuses it as a full disk would); DeadLetterFailFor
	// the range of a window's length.
	DeadLetterFailEvery, DeadLetterFailFor [2]time.Duration
	// Rate is the producer's offered load in events per second (default RateDefault).
	Rate int
	// Consumers and Relays are the numbers of consumer and relay processes (defaults 2 and 1);
	// Workers the concurrent deliveries of each consumer (default WorkersDefault).
	Consumers, Relays, Workers int
	// Seed decides the misbehaviour of each event and the chaos schedule; zero picks one at
	// random, reported in Report.Seed.
	Seed int64
	// Duplicates, Transient and Poison are the misbehaviour rates in [0, 1]. WithDefaults sets
	// the default rates only when all three are zero.
	Duplicates, Transient, Poison float64
	// Executable runs the roles (default os.Executable()): it is started as
	// `Executable Command… --role … …` and must call RoleMain with the arguments after Command.
	Executable string
	// Command is what comes before the role's flags (default [RoleCommand], the hidden
	// `idem chaos-role`).
	Command []string
	// Keep keeps the run's schema for inspection instead of dropping it.
	Keep bool
	// Verbose forwards the roles' logs (stderr) to Logf, each line prefixed with the process name.
	Verbose bool
	// Out receives progress lines and the final table (nil: nothing).
	Out io.Writer
	// Logf receives what the chaos does, as it does it (nil: nothing). It must be safe for
	// concurrent use.
	Logf func(format string, args ...any)
}

// WithDefaults returns o with zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	o.Duration, o.DrainTimeout = cmp.Or(o.Duration, DurationDefault), cmp.Or(o.DrainTimeout, DrainTimeoutDefault)
	o.RetryBudget = cmp.Or(o.RetryBudget, RetryBudgetDefault)
	if o.PlainInbox || o.MySQLDSN != "" {
		o.InboxBucket = 0 // idemmysql has no partitioned claims table
	} else if o.InboxBucket == 0 {
		o.InboxBucket = InboxBucketDefault
	}
	if o.OutageFor == ([2]time.Duration{}) {
		o.OutageFor = [2]time.Duration{o.RetryBudget + 2*time.Second, o.RetryBudget + 5*time.Second}
	}
	if o.Outages == 0 {
		o.Outages = max(1, int(o.Duration/(3*time.Minute)))
	}
	for _, r := range []struct {
		v   *[2]time.Duration
		def [2]time.Duration
	}{
		{&o.DeadLetterFailEvery, DeadLetterFailEveryDefault}, {&o.DeadLetterFailFor, DeadLetterFailForDefault},
		{&o.KillEvery, KillEveryDefault}, {&o.RestartDelay, RestartDelayDefault},
		{&o.FaultEvery, FaultEveryDefault}, {&o.CutFor, CutForDefault},
		{&o.StallFor, StallForDefault}, {&o.NATSDown, NATSDownDefault},
		{&o.BrokerFaultEvery, BrokerFaultEveryDefault}, {&o.BrokerDown, BrokerDownDefault},
	} {
		if *r.v == ([2]time.Duration{}) {
			*r.v = r.def
		}
	}
	if o.BrokerURL != "" {
		o.NATSRestarts = 0
	} else if o.NATSRestarts == 0 {
		o.NATSRestarts = max(2, int(o.Duration/time.Minute))
	}
	o.Rate, o.Consumers = cmp.Or(o.Rate, RateDefault), cmp.Or(o.Consumers, ConsumersDefault)
	o.Relays, o.Workers = cmp.Or(o.Relays, RelaysDefault), cmp.Or(o.Workers, WorkersDefault)
	if o.Duplicates == 0 && o.Transient == 0 && o.Poison == 0 {
		o.Duplicates, o.Transient, o.Poison = DuplicatesDefault, TransientDefault, PoisonDefault
	}
	if o.Command == nil {
		o.Command = []string{RoleCommand}
	}
	return o
}

// Validate reports every invalid field of o (after WithDefaults), each by name.
func (o Options) Validate() error {
	var errs []error
	switch {
	case (o.PostgresURL == "") == (o.MySQLDSN == ""):
		errs = append(errs, errors.New("want one of PostgresURL and MySQLDSN"))
	case o.PostgresURL != "":
		if _, _, err := pgTarget(o.PostgresURL); err != nil {
			errs = append(errs, fmt.Errorf("PostgresURL: %w", err))
		}
	default:
		if _, _, err := mysqlTarget(o.MySQLDSN); err != nil {
			errs = append(errs, fmt.Errorf("MySQLDSN: %w", err))
		}
	}
	if o.Duration <= 0 {
		errs = append(errs, fmt.Errorf("Duration is %v, want > 0", o.Duration))
	}
	if o.DrainTimeout <= 0 {
		errs = append(errs, fmt.Errorf("DrainTimeout is %v, want > 0", o.DrainTimeout))
	}
	for _, r := range []struct {
		name string
		v    [2]time.Duration
	}{
		{"KillEvery", o.KillEvery}, {"RestartDelay", o.RestartDelay}, {"FaultEvery", o.FaultEvery},
		{"CutFor", o.CutFor}, {"StallFor", o.StallFor}, {"NATSDown", o.NATSDown},
		{"OutageFor", o.OutageFor}, {"DeadLetterFailEvery", o.DeadLetterFailEvery}, {"DeadLetterFailFor", o.DeadLetterFailFor},
		{"BrokerFaultEvery", o.BrokerFaultEvery}, {"BrokerDown", o.BrokerDown},
	} {
		if r.v[0] <= 0 || r.v[1] < r.v[0] {
			errs = append(errs, fmt.Errorf("%s is %v–%v, want 0 < min <= max", r.name, r.v[0], r.v[1]))
		}
	}
	if _, err := brokerKind(o.BrokerURL); err != nil {
		errs = append(errs, fmt.Errorf("BrokerURL: %w", err))
	}
	if o.RetryBudget <= 0 {
		errs = append(errs, fmt.Errorf("RetryBudget is %v, want > 0", o.RetryBudget))
	}
	if o.InboxBucket != 0 && o.InboxBucket != time.Hour && o.InboxBucket != 24*time.Hour {
		errs = append(errs, fmt.Errorf("InboxBucket is %v, want 1h or 24h", o.InboxBucket))
	}
	if o.Outages < 0 {
		errs = append(errs, fmt.Errorf("Outages is %d, want >= 0", o.Outages))
	}
	if o.Outages > 0 && o.OutageFor[0] <= o.RetryBudget {
		errs = append(errs, fmt.Errorf("OutageFor is %v–%v, want longer than RetryBudget %v", o.OutageFor[0], o.OutageFor[1], o.RetryBudget))
	}
	if o.NATSRestarts < 0 {
		errs = append(errs, fmt.Errorf("NATSRestarts is %d, want >= 0", o.NATSRestarts))
	}
	if o.Rate < 1 || o.Rate > RateMax {
		errs = append(errs, fmt.Errorf("Rate is %d, want 1 to %d", o.Rate, RateMax))
	}
	if o.Consumers < 1 || o.Consumers > ConsumersMax {
		errs = append(errs, fmt.Errorf("Consumers is %d, want 1 to %d", o.Consumers, ConsumersMax))
	}
	if o.Relays < 1 || o.Relays > RelaysMax {
		errs = append(errs, fmt.Errorf("Relays is %d, want 1 to %d", o.Relays, RelaysMax))
	}
	if o.Workers < 1 || o.Workers > 256 {
		errs = append(errs, fmt.Errorf("Workers is %d, want 1 to 256", o.Workers))
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"Duplicates", o.Duplicates}, {"Transient", o.Transient}, {"Poison", o.Poison}} {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			errs = append(errs, fmt.Errorf("%s is %g, want a rate between 0 and 1", r.name, r.v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("chaos: options: %w", err)
	}
	return nil
}

// Run runs the payments scenario with the producer, the relays and the consumers as separate
// processes while it kills them, cuts and stalls their database connections and restarts the
// NATS server; then it lets the system drain and checks the guarantee from the database alone.
//
// It returns an error only when the run cannot start or ctx ends early; a run that finds a
// violation returns a Report with OK false and the Violations.
func Run(ctx context.Context, opts Options) (Report, error) {
	o := opts.WithDefaults()
	if err := o.Validate(); err != nil {
		return Report{}, err
	}
	if o.Seed == 0 {
		o.Seed = int64(mrand.Uint64() >> 1)
	}
	exe := o.Executable
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return Report{}, fmt.Errorf("chaos: find the executable that runs the roles: %w", err)
		}
	}
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	h := &harness{o: o, logf: logf, counters: map[string]int{}}
	id := newRunID()
	h.runID = id
	h.r = Report{RunID: id, Schema: "idem_chaos_" + id[len(id)-8:], Seed: o.Seed, KillsByRole: map[string]int{}, Store: string(payments.Postgres)}
	if o.MySQLDSN != "" {
		h.r.Store = string(payments.MySQL)
	}
	h.r.Broker, _ = brokerKind(o.BrokerURL)
	return h.run(ctx, exe)
}

// newRunID is time-based, so runs sort, plus 8 random hex digits, so concurrent runs differ.
func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return time.Now().UTC().Format("20060102t150405") + "-" + hex.EncodeToString(b[:])
}

// harness is one run.
type harness struct {
	o     Options
	logf  func(string, ...any)
	runID string
	// db is the harness's own connection to the run's database, never through the proxy.
	db    *runDB
	proxy *Proxy
	nats  *natsServer
	js    jetstream.JetStream
	// broker is the run's RabbitMQ or Redis broker (nil on NATS); brokerProxy stands between
	// it and the roles.
	broker      brokerTarget
	brokerProxy *Proxy
	sup         *supervisor

	stream, subject, durable string

	mu       sync.Mutex
	r        Report
	counters map[string]int
}

func (h *harness) count(f func(r *Report)) {
	h.mu.Lock()
	f(&h.r)
	h.mu.Unlock()
}

func (h *harness) addStat(_, counter string, n int) {
	h.mu.Lock()
	h.counters[counter] += n
	h.mu.Unlock()
}

func (h *harness) run(ctx context.Context, exe string) (Report, error) {
	o := h.o
	var err error
	if o.MySQLDSN != "" {
		h.db, err = openMySQLRun(ctx, o.MySQLDSN, h.r.Schema, h.runID)
	} else {
		h.db, err = openPostgresRun(ctx, o.PostgresURL, h.r.Schema, h.runID, o.InboxBucket)
	}
	if err != nil {
		return h.r, fmt.Errorf("chaos: %w", err)
	}
	defer h.db.close()
	if !o.Keep {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := h.db.drop(dctx); err != nil {
				h.logf("drop %s: %v", h.r.Schema, err)
			}
		}()
	}

	suffix := h.runID[len(h.runID)-8:]
	h.stream, h.subject, h.durable = "IDEM_CHAOS_"+strings.ToUpper(suffix), "idem.chaos."+suffix+".payments", "ledger"
	natsURL, roleBrokerURL := "", ""
	if o.BrokerURL == "" {
		stop, err := h.startNATS(ctx)
		if err != nil {
			return h.r, err
		}
		defer stop()
		natsURL = h.nats.URL()
	} else {
		h.stream = h.subject // the queue, or the stream under idemredis's key prefix
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		h.broker, err = openBrokerTarget(sctx, o.BrokerURL, h.runID, h.subject, h.durable)
		cancel()
		if err != nil {
			return h.r, fmt.Errorf("chaos: %s: %w", h.r.Broker, err)
		}
		defer h.broker.close()
		_, target, err := proxiedBrokerURL(o.BrokerURL, "")
		if err == nil {
			h.brokerProxy, err = NewProxy("tcp", target)
		}
		if err != nil {
			return h.r, fmt.Errorf("chaos: %s: %w", h.r.Broker, err)
		}
		defer h.brokerProxy.Close()
		roleBrokerURL, _, _ = proxiedBrokerURL(o.BrokerURL, h.brokerProxy.Addr())
	}

	network, target, err := o.dbTarget()
	if err != nil {
		return h.r, fmt.Errorf("chaos: %w", err)
	}
	if h.proxy, err = NewProxy(network, target); err != nil {
		return h.r, err
	}
	defer h.proxy.Close()
	roleURL, roleDSN, err := o.roleDatabase(h.proxy.Addr(), h.r.Schema)
	if err != nil {
		return h.r, fmt.Errorf("chaos: %w", err)
	}

	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	h.sup = newSupervisor(runCtx, exe, o.Command, o.Verbose, h.logf, h.addStat)
	defer h.sup.killAll()
	base := RoleArgs{
		PostgresURL: roleURL, MySQLDSN: roleDSN, Schema: h.r.Schema, NATSURL: natsURL, BrokerURL: roleBrokerURL,
		Stream: h.stream, Subject: h.subject, Durable: h.durable, RunID: h.runID, Seed: o.Seed,
		Rate: o.Rate, Duplicates: o.Duplicates, Transient: o.Transient, Poison: o.Poison, Workers: o.Workers,
		RetryBudget: o.RetryBudget, InboxBucket: o.InboxBucket,
	}
	start := func(name, role string) error {
		a := base
		a.Name = name
		return h.sup.start(name, role, a.Flags(role))
	}
	var workers []string
	for i := 1; i <= o.Relays; i++ {
		workers = append(workers, RoleRelay+"-"+strconv.Itoa(i))
	}
	for i := 1; i <= o.Consumers; i++ {
		workers = append(workers, RoleConsumer+"-"+strconv.Itoa(i))
	}
	for _, name := range append([]string{RoleProducer}, workers...) {
		role, _, _ := strings.Cut(name, "-")
		if err := start(name, role); err != nil {
			return h.r, err
		}
	}
	h.sup.setRestartOnExit(true)

	// Chaos.
	chaosStart := time.Now()
	h.chaos(runCtx)
	h.r.ChaosMS = time.Since(chaosStart).Milliseconds()
	if err := ctx.Err(); err != nil {
		return h.r, fmt.Errorf("chaos: run interrupted: %w", err)
	}

	// Drain: everything up, the producer stopped, the rest working until nothing is left.
	h.proxy.Resume()
	h.proxy.Restore()
	if h.brokerProxy != nil {
		h.brokerProxy.Resume()
		h.brokerProxy.Restore()
	}
	stopStart := time.Now()
	h.sup.stop(RoleProducer, 10*time.Second)
	h.logf("chaos: over; producer stopped in %v, draining", time.Since(stopStart).Round(time.Millisecond))
	drainStart := time.Now()
	h.drain(ctx)
	h.r.DrainMS = time.Since(drainStart).Milliseconds()
	if err := ctx.Err(); err != nil {
		return h.r, fmt.Errorf("chaos: run interrupted: %w", err)
	}
	h.sup.setRestartOnExit(false)
	var wg sync.WaitGroup
	for _, name := range workers {
		wg.Go(func() { h.sup.stop(name, 10*time.Second) })
	}
	wg.Wait()
	h.logf("chaos: drained in %v, roles stopped in %v", time.Duration(h.r.DrainMS)*time.Millisecond, time.Since(stopStart).Round(time.Millisecond))

	// Verdict, from the database alone.
	cctx, cancelCheck := context.WithTimeout(ctx, 10*time.Minute)
	defer cancelCheck()
	h.mu.Lock()
	defer h.mu.Unlock()
	r := &h.r
	if err := check(cctx, h.db, h.runID, r); err != nil {
		return *r, fmt.Errorf("chaos: %w", err)
	}
	firstSeqs := func(ctx context.Context) (map[int]uint64, error) { return streamFirstSeqs(ctx, h.js, h.stream) }
	if h.broker != nil {
		firstSeqs = h.broker.firstSeqs
	}
	if err := checkOrder(cctx, h.db.DB, firstSeqs, h.runID, r); err != nil {
		return *r, fmt.Errorf("chaos: %w", err)
	}
	r.UnexpectedExits = h.sup.unexpectedExits()
	if r.UnexpectedExits > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("%d role processes exited on their own (see the logs with Verbose)", r.UnexpectedExits))
	}
	r.Processed = h.counters["processed"]
	r.DuplicatesIgnored = h.counters["duplicate"]
	r.Retries = h.counters["retried"]
	r.Abandoned = h.counters["abandoned"]
	r.TransientInjected = h.counters["transient"]
	r.buildFaults(h.counters, o.RetryBudget, o.InboxBucket)
	if r.DuplicatesIgnored == 0 && r.DuplicatesInjected > 0 {
		r.Notes = append(r.Notes, "the consumers reported no duplicate although duplicates were injected")
	}
	r.OK = len(r.Violations) == 0
	if o.Out != nil {
		_ = r.WriteTable(o.Out)
	}
	return *r, nil
}

// startNATS starts the run's embedded NATS server and its stream; stop shuts it down.
func (h *harness) startNATS(ctx context.Context) (stop func(), err error) {
	dir, err := os.MkdirTemp("", "idem-chaos-nats-")
	if err != nil {
		return nil, fmt.Errorf("chaos: NATS store directory: %w", err)
	}
	if h.nats, err = startNATS(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	nc, err := connectNATS(h.nats.URL(), "harness")
	if err == nil {
		h.js, err = jetstream.New(nc)
	}
	stop = func() {
		if nc != nil {
			nc.Close()
		}
		h.nats.stop()
		os.RemoveAll(dir)
	}
	if err != nil {
		stop()
		return nil, fmt.Errorf("chaos: JetStream: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = idemnats.EnsureStream(sctx, h.js, jetstream.StreamConfig{
		Name:        h.stream,
		Description: "idem chaos: payment.captured events of one run",
		Subjects:    []string{h.subject},
		MaxAge:      streamMaxAge,
		Duplicates:  streamDuplicates,
		Storage:     jetstream.FileStorage,
	})
	cancel()
	if err != nil {
		stop()
		return nil, fmt.Errorf("chaos: %w", err)
	}
	return stop, nil
}

// chaos kills, cuts, stalls and restarts until the chaos phase ends, and returns once every
// process it killed is started again and the NATS server is up.
func (h *harness) chaos(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, h.o.Duration)
	defer cancel()
	var wg, restarts sync.WaitGroup
	wg.Go(func() { h.killLoop(cctx, &restarts) })
	wg.Go(func() { h.faultLoop(cctx) })
	wg.Go(func() { h.deadLetterLoop(cctx) })
	if h.broker == nil {
		wg.Go(func() { h.natsLoop(cctx) })
	} else {
		wg.Go(func() { h.brokerLoop(cctx) })
	}
	wg.Go(func() { h.progressLoop(cctx) })
	wg.Wait()
	restarts.Wait()
}

// rng returns a random source for one chaos loop, derived from the seed.
func (h *harness) rng(stream uint64) *mrand.Rand {
	return mrand.New(mrand.NewPCG(uint64(h.o.Seed), stream))
}

func randIn(rng *mrand.Rand, r [2]time.Duration) time.Duration {
	if r[1] <= r[0] {
		return r[0]
	}
	return r[0] + time.Duration(rng.Int64N(int64(r[1]-r[0])+1))
}

// killLoop sends SIGKILL to a random role process every KillEvery and restarts it after
// RestartDelay.
func (h *harness) killLoop(ctx context.Context, restarts *sync.WaitGroup) {
	rng := h.rng(1)
	for sleepCtx(ctx, randIn(rng, h.o.KillEvery)) {
		names := h.sup.running()
		if len(names) == 0 {
			continue
		}
		slices.Sort(names)
		name := names[rng.IntN(len(names))]
		if !h.sup.kill(name) {
			continue
		}
		role, _, _ := strings.Cut(name, "-")
		h.count(func(r *Report) { r.Kills++; r.KillsByRole[role]++ })
		delay := randIn(rng, h.o.RestartDelay)
		h.logf("chaos: SIGKILL %s, restart in %v", name, delay.Round(time.Millisecond))
		restarts.Go(func() {
			time.Sleep(delay)
			if err := h.sup.restart(name); err != nil {
				h.logf("chaos: restart %s: %v", name, err)
				return
			}
			h.count(func(r *Report) { r.Restarts++ })
		})
	}
}

// faultLoop cuts or stalls the database connections every FaultEvery, and has the Outages
// database outages, spread evenly over the chaos phase, instead of the faults due then.
func (h *harness) faultLoop(ctx context.Context) {
	rng := h.rng(2)
	start, next := time.Now(), 0
	for sleepCtx(ctx, randIn(rng, h.o.FaultEvery)) {
		if next < h.o.Outages && time.Since(start) >= h.o.Duration*time.Duration(next+1)/time.Duration(h.o.Outages+1) {
			next++
			h.outage(ctx, randIn(rng, h.o.OutageFor))
			continue
		}
		if rng.IntN(2) == 0 {
			d := randIn(rng, h.o.CutFor)
			n := h.proxy.Cut()
			h.count(func(r *Report) { r.Cuts++ })
			h.logf("chaos: cut %d database connections, refusing new ones for %v", n, d.Round(time.Millisecond))
			sleepCtx(ctx, d)
			h.proxy.Restore()
		} else {
			d := randIn(rng, h.o.StallFor)
			h.proxy.Stall()
			h.count(func(r *Report) { r.Stalls++ })
			h.logf("chaos: stall %d database connections for %v", h.proxy.Conns(), d.Round(time.Millisecond))
			sleepCtx(ctx, d)
			h.proxy.Resume()
		}
	}
}

// outage cuts every database connection and refuses new ones for d, longer than the
// consumers' retry budget, and records it in the outages table for the verdict.
func (h *harness) outage(ctx context.Context, d time.Duration) {
	started := time.Now()
	n := h.proxy.Cut()
	h.logf("chaos: database outage: cut %d connections, refusing new ones for %v (retry budget %v)", n, d.Round(time.Millisecond), h.o.RetryBudget)
	sleepCtx(ctx, d)
	h.proxy.Restore()
	ended := time.Now()
	h.count(func(r *Report) { r.outages++; r.outageTime += ended.Sub(started) })
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := h.db.RecordOutage(rctx, started, ended, h.o.RetryBudget+outageGrace); err != nil {
		h.count(func(r *Report) { r.Violations = append(r.Violations, err.Error()) })
	}
}

// deadLetterLoop makes every dead-letter write fail for DeadLetterFailFor, every
// DeadLetterFailEvery: a trigger on the dead-letter table refuses the insert (SQLSTATE 53100;
// error 1041 on MySQL)
// while the switch in the faults table is on. The harness flips it over its own connection.
func (h *harness) deadLetterLoop(ctx context.Context) {
	rng := h.rng(4)
	set := func(on bool) error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return h.db.setRefuseDeadLetters(sctx, on)
	}
	for sleepCtx(ctx, randIn(rng, h.o.DeadLetterFailEvery)) {
		d := randIn(rng, h.o.DeadLetterFailFor)
		if err := set(true); err != nil {
			h.logf("chaos: refuse dead-letter writes: %v", err)
			continue
		}
		h.logf("chaos: refusing every dead-letter write for %v", d.Round(time.Millisecond))
		h.count(func(r *Report) { r.dlWindows++ })
		sleepCtx(ctx, d)
		for err := set(false); err != nil; err = set(false) {
			h.logf("chaos: accept dead-letter writes again: %v", err)
			time.Sleep(time.Second)
		}
	}
}

// natsLoop restarts the NATS server NATSRestarts times, spread evenly over the chaos phase
// with some jitter.
func (h *harness) natsLoop(ctx context.Context) {
	rng := h.rng(3)
	n := h.o.NATSRestarts
	if n == 0 {
		return
	}
	start := time.Now()
	slot := h.o.Duration / time.Duration(n+1)
	for k := 1; k <= n; k++ {
		at := slot*time.Duration(k) + time.Duration(rng.Int64N(int64(slot/2)+1)) - slot/4
		if !sleepCtx(ctx, time.Until(start.Add(at))) {
			return
		}
		down := randIn(rng, h.o.NATSDown)
		h.logf("chaos: restart NATS (down for %v)", down.Round(time.Millisecond))
		if err := h.nats.restart(down); err != nil {
			h.count(func(r *Report) {
				r.Violations = append(r.Violations, fmt.Sprintf("the NATS server did not come back: %v", err))
			})
			return
		}
		h.count(func(r *Report) { r.NATSRestarts++ })
	}
}

// brokerLoop has a broker fault every BrokerFaultEvery, in turn: the run's connections closed
// from the server's side, cut with new ones refused for BrokerDown, or stalled (no byte moves
// for StallFor). The roles must reconnect, and what was in flight comes back.
func (h *harness) brokerLoop(ctx context.Context) {
	rng := h.rng(5)
	var kills sync.WaitGroup
	defer kills.Wait()
	for k := 0; sleepCtx(ctx, randIn(rng, h.o.BrokerFaultEvery)); k++ {
		switch k % 3 {
		case 1:
			d := randIn(rng, h.o.BrokerDown)
			n := h.brokerProxy.Cut()
			h.count(func(r *Report) { r.BrokerCuts++ })
			h.logf("chaos: cut %d %s connections, refusing new ones for %v", n, h.r.Broker, d.Round(time.Millisecond))
			sleepCtx(ctx, d)
			h.brokerProxy.Restore()
		case 0:
			// First, beside the faults that follow, and not cut short by the end of the chaos:
			// rabbitmqctl can take longer than a short run's remaining seconds on a loaded
			// machine (CI once killed it at the end of the run, which had no kill at all).
			kills.Go(func() {
				kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
				defer cancel()
				n, err := h.broker.killConns(kctx)
				if err != nil {
					h.logf("chaos: kill %s connections: %v", h.r.Broker, err)
					return
				}
				h.count(func(r *Report) { r.BrokerKills++; r.BrokerConnsKilled += n })
				h.logf("chaos: closed %d %s connections of the run", n, h.r.Broker)
			})
		default:
			d := randIn(rng, h.o.StallFor)
			h.brokerProxy.Stall()
			h.count(func(r *Report) { r.BrokerStalls++ })
			h.logf("chaos: stall %d %s connections for %v", h.brokerProxy.Conns(), h.r.Broker, d.Round(time.Millisecond))
			sleepCtx(ctx, d)
			h.brokerProxy.Resume()
		}
	}
}

// progressLoop writes a line to Out every five seconds.
func (h *harness) progressLoop(ctx context.Context) {
	if h.o.Out == nil {
		return
	}
	start := time.Now()
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		line := fmt.Sprintf("chaos %3.0fs: %d events, %d processed, %d duplicates ignored, %d retries; %d kills, %d cuts, %d stalls, %d NATS restarts\n",
			time.Since(start).Seconds(), h.counters["produced"], h.counters["processed"], h.counters["duplicate"], h.counters["retried"],
			h.r.Kills, h.r.Cuts, h.r.Stalls, h.r.NATSRestarts)
		h.mu.Unlock()
		_, _ = io.WriteString(h.o.Out, line)
	}
}

// drain waits until every order is settled, the outbox is published and the broker holds
// nothing for the consumers, or DrainTimeout passes (a violation).
func (h *harness) drain(ctx context.Context) {
	deadline := time.Now().Add(h.o.DrainTimeout)
	var last string
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := readDrainState(qctx, h.db, h.runID)
		var backlog int
		if err == nil {
			backlog, err = h.brokerBacklog(qctx)
		}
		cancel()
		if err == nil && st.unsettled == 0 && st.outbox == 0 && backlog == 0 {
			return
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d orders unsettled, %d outbox rows unpublished, %d messages in the broker", st.unsettled, st.outbox, backlog)
		}
		if time.Now().After(deadline) {
			last += h.undrained(ctx)
			h.count(func(r *Report) {
				r.Violations = append(r.Violations, fmt.Sprintf("the run did not drain within %v: %s", h.o.DrainTimeout, last))
			})
			return
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return
		}
	}
}

// undrained names what a run that did not drain left: the first unsettled orders (their kind,
// and whether a poison identity ever reached the broker) and, on NATS, the durable's pending,
// unacknowledged and redelivered counts, so that the failure says where the events stopped.
func (h *harness) undrained(ctx context.Context) string {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var parts []string
	orders, err := payments.UnsettledOrders(qctx, h.db.DB, runScope(h.runID), 10)
	if err != nil {
		parts = append(parts, err.Error())
	}
	if len(orders) > 0 {
		names := make([]string, len(orders))
		for i, o := range orders {
			names[i] = o.String()
		}
		parts = append(parts, "unsettled: "+strings.Join(names, ", "))
	}
	if h.broker == nil {
		if info, err := h.durableInfo(qctx); err == nil {
			parts = append(parts, fmt.Sprintf("durable %s: %d pending, %d unacknowledged, %d redelivered", h.durable,
				info.NumPending, info.NumAckPending, info.NumRedelivered))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; " + strings.Join(parts, "; ")
}

// durableInfo reads the run's JetStream durable: what it still has to deliver, what awaits an
// acknowledgement, what it redelivered.
func (h *harness) durableInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	cons, err := h.js.Consumer(ctx, h.stream, h.durable)
	if err != nil {
		return nil, fmt.Errorf("look up consumer %s: %w", h.durable, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("consumer %s info: %w", h.durable, err)
	}
	return info, nil
}

// brokerBacklog is what the durable still has to deliver or see acknowledged.
func (h *harness) brokerBacklog(ctx context.Context) (int, error) {
	if h.broker != nil {
		return h.broker.backlog(ctx)
	}
	info, err := h.durableInfo(ctx)
	if err != nil {
		return 0, err
	}
	return int(info.NumPending) + info.NumAckPending, nil
}

// dbTarget returns where the run's database server listens: the proxy's target.
func (o Options) dbTarget() (network, address string, err error) {
	if o.MySQLDSN != "" {
		network, address, err = mysqlTarget(o.MySQLDSN)
		if err != nil {
			return "", "", fmt.Errorf("MySQLDSN: %w", err)
		}
		return network, address, nil
	}
	network, address, err = pgTarget(o.PostgresURL)
	if err != nil {
		return "", "", fmt.Errorf("PostgresURL: %w", err)
	}
	return network, address, nil
}

// roleDatabase returns how the roles reach the run's database through the proxy at addr: a
// PostgreSQL URL, or a MySQL DSN naming the run's database db.
func (o Options) roleDatabase(addr, db string) (pgURL, mysqlDSN string, err error) {
	if o.MySQLDSN != "" {
		cfg, err := mysql.ParseDSN(o.MySQLDSN)
		if err != nil {
			return "", "", fmt.Errorf("MySQLDSN: %w", err)
		}
		return "", runDSN(cfg, addr, db), nil
	}
	pgURL, err = proxiedURL(o.PostgresURL, addr)
	if err != nil {
		return "", "", fmt.Errorf("PostgresURL: %w", err)
	}
	return pgURL, "", nil
}

// pgTarget returns where PostgreSQL listens: ("tcp", host:port) or ("unix", socket path).
func pgTarget(pgURL string) (network, address string, err error) {
	cfg, err := pgconn.ParseConfig(pgURL)
	if err != nil {
		return "", "", err
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port), nil
	}
	return "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), nil
}

// proxiedURL points pgURL (a URL or a keyword/value string) at the proxy's address.
func proxiedURL(pgURL, addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(pgURL, "postgres://") || strings.HasPrefix(pgURL, "postgresql://") {
		u, err := url.Parse(pgURL)
		if err != nil {
			return "", err
		}
		u.Host = addr
		q := u.Query()
		q.Del("host")
		q.Del("port")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	// Keyword/value: a later keyword overrides an earlier one.
	return pgURL + " host=" + host + " port=" + port, nil
}
