// Package demo is the payments scenario behind `idem demo`: the first thing a newcomer runs,
// and a check that idem's guarantee holds end to end on a real store and broker.
//
// Run migrates the store, then a producer writes orders and their payment.captured events in
// one transaction (the outbox), a relay (idemrelay) publishes them to the queue table or to
// JetStream, and a ledger@v1 consumer (idem.Consumer.Run) credits wallets. Along the way it
// misbehaves at the rates given, deterministically from the seed:
//
//   - duplicates: the relay's sink publishes chosen events twice, with the same event id;
//   - transient: the handler fails the first attempt(s) with idem.Transient;
//   - poison: invalid JSON, a missing field (both invalid_payload), and key reuse — once an
//     event is applied, another message with its event id and another amount (key_reuse);
//   - crash: the commit succeeds but the ack is lost, so the broker redelivers after the lease.
//
// When every order is settled and the outbox and broker are drained, the verdict is computed
// from the database (demo_orders, demo_ledger, demo_wallets and idem's dead letters), so that
// anyone can check it with plain SQL; see the queries in verdict.go. Every run has its own run
// id, and every check filters by it, so runs can share a database.
package demo

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemwebhook"
	"github.com/idemkit/idem/retry"
)

// Defaults of Options, also meant as the defaults of the command's flags.
const (
	StoreDefault       = "sqlite://idem-demo.db"
	BrokerDefault      = "sql"
	EventsDefault      = 10000
	ConcurrencyDefault = 8
	SeedDefault        = 1
	DuplicatesDefault  = 0.05
	TransientDefault   = 0.05
	PoisonDefault      = 0.01
	LostAcksDefault    = 0.02
	TimeoutDefault     = 2 * time.Minute

	// EventsMax bounds --events: the plan and the observer keep a little state per event.
	EventsMax = 1_000_000
	// ConcurrencyMax bounds --concurrency.
	ConcurrencyMax = 1024
)

// With --fanout a second consumer, emailConsumerName, receives every event of the topic too,
// through a queue-table subscription of its own; the ledger reads through ledgerSubscription.
const (
	emailConsumerName  = "email@v1"
	ledgerSubscription = "ledger"
	emailSubscription  = "email"
)

// Tuning of the scenario.
const (
	// produceBatch is how many orders the producer writes per transaction.
	produceBatch = 50
	// inFlightMax bounds orders written but not yet settled: the producer waits beyond it, so
	// the latency measures the pipeline rather than a backlog the demo built on purpose.
	inFlightMax = 200
	// relayBatch is the relay's batch size.
	relayBatch = 250
	// tick is how often Run looks at progress (and reports it).
	tick = 100 * time.Millisecond
	// recheck is how often Run checks the database for the end of the run even when the
	// observer has not seen every order settle (a relay dead letter, say).
	recheck = 2 * time.Second
	// relayLeaseTTL is shorter than the relay's default, so that a run after a killed one
	// takes over the dead relay's partitions within seconds.
	relayLeaseTTL = 5 * time.Second
	// shutdownTimeout bounds the consumer's graceful shutdown.
	shutdownTimeout = 5 * time.Second
	// checkTimeout bounds the final verdict queries.
	checkTimeout = time.Minute
)

// retryPolicy keeps transient failures quick: they succeed within a few hundred milliseconds.
var retryPolicy = retry.Policy{Base: 10 * time.Millisecond, Cap: 200 * time.Millisecond, MaxAttempts: 8}

// Options configures a demo run. WithDefaults fills zero fields.
type Options struct {
	// Store is the store URL (default StoreDefault): sqlite://PATH or postgres://… (with
	// idem_schema=NAME to use a schema of its own; the demo's tables go there too).
	Store string
	// Broker is "sql" (the queue table in the store, the default), nats://HOST:PORT,
	// amqp://USER:PASSWORD@HOST:PORT/VHOST, redis://USER:PASSWORD@HOST:PORT/DB or
	// sqs://HOST:PORT?region=REGION (SQS, or an emulator such as moto_server), or
	// pubsub://embedded or kafka://embedded (an in-process Pub/Sub server or Kafka cluster the
	// run starts).
	Broker string
	// Events is the number of orders (default EventsDefault).
	Events int
	// Concurrency is the number of consumer workers (default ConcurrencyDefault).
	Concurrency int
	// Batch, when above 1, runs the consumer in batched mode: each worker processes up to Batch
	// deliveries in one transaction (idem.BatchConfig). Every check of the verdict must hold the
	// same.
	Batch int
	// FanOut runs a second consumer of the same topic, an e-mail consumer (email@v1) that
	// records one demo_emails row per event, each consumer on a queue-table subscription of its
	// own: both must apply every event once. It needs the queue-table broker ("sql").
	FanOut bool
	// Seed chooses which events misbehave how (default SeedDefault); the same seed injects the
	// same misbehaviour.
	Seed int64
	// Duplicates, Transient, Poison and LostAcks are the misbehaviour rates, each in [0, 1].
	// A lost ack is a crash between the commit and the ack: the broker redelivers, and the
	// consumer sees a duplicate. Zero turns a misbehaviour off; WithDefaults sets the default
	// rates only when all four are zero.
	Duplicates, Transient, Poison, LostAcks float64
	// Timeout bounds the run: past it the verdict fails with "did not drain within …"
	// (default TimeoutDefault).
	Timeout time.Duration
	// HTTP replaces the broker with HTTP: the relay signs each event and POSTs it to a webhook
	// ingress (idemwebhook) on a loopback port, which runs it through the consumer's path and
	// answers after the commit; the relay retries as a webhook provider does. Crashes cut the
	// connection after the commit, before the answer. Broker must stay "sql"; Batch is unused.
	HTTP bool
	// Progress, when set, is called with the number of orders settled so far, from one
	// goroutine, at most ten times a second.
	Progress func(done, total int)
	// Logger receives the consumer's and the relay's logs (default: discarded).
	Logger *slog.Logger

	// natsStream and natsRoot name the JetStream stream and subject root; tests set them.
	natsStream, natsRoot string
}

// WithDefaults returns o with zero fields set to their defaults. The four rates are set only
// when all of them are zero: zero is a meaningful rate, so a caller that sets any of them (a
// command's flags) is taken at its word. Run applies the defaults of every other field itself.
func (o Options) WithDefaults() Options {
	o = o.fill()
	if o.Duplicates == 0 && o.Transient == 0 && o.Poison == 0 && o.LostAcks == 0 {
		o.Duplicates, o.Transient, o.Poison, o.LostAcks = DuplicatesDefault, TransientDefault, PoisonDefault, LostAcksDefault
	}
	return o
}

// fill sets the defaults of every field but the rates.
func (o Options) fill() Options {
	o.Store, o.Broker = cmp.Or(o.Store, StoreDefault), cmp.Or(o.Broker, BrokerDefault)
	o.Events, o.Concurrency = cmp.Or(o.Events, EventsDefault), cmp.Or(o.Concurrency, ConcurrencyDefault)
	o.Seed, o.Timeout = cmp.Or(o.Seed, SeedDefault), cmp.Or(o.Timeout, TimeoutDefault)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.natsStream == "" {
		o.natsStream, o.natsRoot = natsStreamDefault, natsRootDefault
	}
	return o
}

// Validate reports every invalid option of o (after WithDefaults), each naming its flag.
func (o Options) Validate() error {
	var errs []error
	if _, err := connect.ParseStore(o.Store); err != nil {
		errs = append(errs, fmt.Errorf("--store: %w", err))
	}
	if _, err := connect.ParseBroker(o.Broker); err != nil {
		errs = append(errs, fmt.Errorf("--broker: %w", err))
	}
	if o.Events < 1 || o.Events > EventsMax {
		errs = append(errs, fmt.Errorf("--events %d: want between 1 and %d", o.Events, EventsMax))
	}
	if bu, err := connect.ParseBroker(o.Broker); o.FanOut && err == nil && bu.Kind != connect.BrokerSQL {
		errs = append(errs, fmt.Errorf("--fanout: needs --broker %s (queue-table subscriptions), not %s", connect.BrokerSQL, bu.Kind))
	}
	if o.Batch < 0 || o.Batch > 10000 {
		errs = append(errs, fmt.Errorf("--batch %d: want between 0 (per event) and 10000", o.Batch))
	}
	if o.Concurrency < 1 || o.Concurrency > ConcurrencyMax {
		errs = append(errs, fmt.Errorf("--concurrency %d: want between 1 and %d", o.Concurrency, ConcurrencyMax))
	}
	for _, r := range []struct {
		flag string
		v    float64
	}{{"--duplicates", o.Duplicates}, {"--transient", o.Transient}, {"--poison", o.Poison}, {"--lost-acks", o.LostAcks}} {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			errs = append(errs, fmt.Errorf("%s %g: want a rate between 0 and 1", r.flag, r.v))
		}
	}
	if o.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %v: want a positive duration", o.Timeout))
	}
	if o.HTTP && o.Broker != BrokerDefault {
		errs = append(errs, errHTTPWithBroker)
	}
	if o.HTTP && o.FanOut {
		errs = append(errs, errors.New("--fanout needs the queue table's subscriptions: --http delivers through the webhook ingress instead"))
	}
	if o.HTTP && o.Batch > 1 {
		errs = append(errs, errors.New("--http delivers one event per request: --batch does not apply"))
	}
	return errors.Join(errs...)
}

// Run runs the scenario and returns its verdict. It returns an error only when the run cannot
// start (invalid options, a store or broker that cannot be opened); a run that finds a problem
// returns a Verdict with OK false and the Problems, and so does a run cut short by ctx.
//
// Run fills zero options with their defaults except the rates, which it takes as given (zero
// turns a misbehaviour off): call WithDefaults first for the default rates.
func Run(ctx context.Context, opts Options) (Verdict, error) {
	o := opts.fill()
	if err := o.Validate(); err != nil {
		return Verdict{}, err
	}
	su, _ := connect.ParseStore(o.Store)
	bu, _ := connect.ParseBroker(o.Broker)
	v := Verdict{Store: su.String(), Broker: bu.Kind, Seed: o.Seed, DeadLettered: map[string]int{}}
	if bu.Kind == connect.BrokerNATS || bu.Kind == connect.BrokerAMQP || bu.Kind == connect.BrokerRedis || bu.Kind == connect.BrokerSQS || bu.Embedded() {
		v.Broker = idemredact.URL(bu.URL)
	}
	if o.HTTP {
		v.Broker = "http (webhook ingress)"
	}

	// On PostgreSQL every worker holds a connection for its transaction; the producer, the
	// relay, lease extensions and the checks need a few more.
	st, err := connect.OpenStore(ctx, o.Store, connect.Options{MaxConns: int32(min(o.Concurrency+8, 64))})
	if err != nil {
		return v, err
	}
	defer st.Close()
	if err := st.Migrator.Migrate(ctx); err != nil {
		return v, fmt.Errorf("store %s: migrate: %w", su, err)
	}
	db := newDatabase(st)
	if err := createTables(ctx, db); err != nil {
		return v, fmt.Errorf("store %s: %w", su, err)
	}
	v.RunID = newRunID()
	if st.SQLite != nil {
		return run[*sql.Tx](ctx, o, v, st.SQLite, db, bu, sqliteExec)
	}
	if st.MySQL != nil {
		return run[*sql.Tx](ctx, o, v, st.MySQL, db, bu, sqliteExec)
	}
	return run[pgx.Tx](ctx, o, v, st.Postgres, db, bu, pgExec)
}

// newRunID is time-based, so runs sort, plus random, so concurrent runs differ. It is safe in
// event ids, queue names, NATS subjects and durable names.
func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return time.Now().UTC().Format("20060102t150405") + "-" + hex.EncodeToString(b[:])
}

// demoStore is what the scenario needs of a store: claims, the queue table and the outbox.
type demoStore[TTx any] interface {
	idemstore.Store[TTx]
	idemstore.QueueTxStore[TTx]
	idemstore.OutboxStore[TTx]
	idemstore.QueueSubscriptionStore
}

// txExec runs a statement of the demo's inside a store transaction and reports the rows it
// affected.
type txExec[TTx any] func(ctx context.Context, tx TTx, query string, args ...any) (int64, error)

// sqliteExec runs q on any database/sql transaction: SQLite's and MySQL's.
func sqliteExec(ctx context.Context, tx *sql.Tx, q string, args ...any) (int64, error) {
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func pgExec(ctx context.Context, tx pgx.Tx, q string, args ...any) (int64, error) {
	tag, err := tx.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

// scenario is one run over a store whose transactions are TTx.
type scenario[TTx any] struct {
	o     Options
	runID string
	plan  []payments.Order
	store demoStore[TTx]
	db    *payments.DB
	exec  txExec[TTx]
	br    *broker
	tally *tally
	// emailTally observes the e-mail consumer (--fanout; nil without).
	emailTally *tally
	// failed marks orders whose handler failed transiently at least once.
	failed []atomic.Bool
	// produced counts orders committed by the producer.
	produced atomic.Int64

	insertLedger, creditWallet, insertEmail string
}

func run[TTx any](ctx context.Context, o Options, v Verdict, store demoStore[TTx], db *payments.DB, bu connect.BrokerURL, exec txExec[TTx]) (Verdict, error) {
	s := &scenario[TTx]{
		o:            o,
		runID:        v.RunID,
		plan:         payments.Plan(o.Seed, o.Events, payments.Rates{Duplicates: o.Duplicates, Transient: o.Transient, Poison: o.Poison, Crash: o.LostAcks}),
		store:        store,
		db:           db,
		exec:         exec,
		tally:        newTally(v.RunID, o.Events),
		failed:       make([]atomic.Bool, o.Events),
		insertLedger: db.SQL(`INSERT INTO {ledger} (run_id, event_id, wallet_id, amount_cents) VALUES (?, ?, ?, ?)`),
		creditWallet: db.SQL(`UPDATE {wallets} SET balance_cents = balance_cents + ? WHERE run_id = ? AND id = ?`),
		insertEmail:  db.SQL(`INSERT INTO {emails} (run_id, event_id, wallet_id, amount_cents) VALUES (?, ?, ?, ?)`),
	}
	var (
		err  error
		hook *httpBroker
	)
	if o.HTTP {
		if s.br, hook, err = newHTTPBroker(s.runID, s.plan, o.Logger); err != nil {
			return v, fmt.Errorf("webhook ingress: %w", err)
		}
	} else if bu.Kind == "nats" {
		s.br, err = natsBroker(ctx, bu.URL, o.natsStream, o.natsRoot, s.runID)
		if err != nil {
			return v, fmt.Errorf("broker %s: %w", v.Broker, err)
		}
	} else if bu.Kind == connect.BrokerAMQP {
		if s.br, err = amqpBroker(ctx, bu.URL, s.runID); err != nil {
			return v, fmt.Errorf("broker %s: %w", v.Broker, err)
		}
	} else if bu.Kind == connect.BrokerRedis {
		if s.br, err = redisBroker(ctx, bu, s.runID); err != nil {
			return v, fmt.Errorf("broker %s: %w", v.Broker, err)
		}
	} else if bu.Kind == connect.BrokerSQS {
		if s.br, err = sqsBroker(ctx, bu, s.runID); err != nil {
			return v, fmt.Errorf("broker %s: %w", v.Broker, err)
		}
	} else if bu.Kind == connect.BrokerPubSub {
		if s.br, err = pubsubBroker(ctx, s.runID); err != nil {
			return v, fmt.Errorf("broker %s: %w", v.Broker, err)
		}
	} else if bu.Kind == connect.BrokerKafka {
		if s.br, err = kafkaBroker(ctx, s.runID, o.Logger); err != nil {
			return v, fmt.Errorf("broker %s: %w", v.Broker, err)
		}
	} else if s.br, err = queueBroker[TTx](ctx, store, s.runID, o.FanOut); err != nil {
		return v, fmt.Errorf("broker %s: %w", v.Broker, err)
	}
	defer s.br.close()

	if err := s.createWallets(ctx); err != nil {
		return v, fmt.Errorf("store %s: %w", v.Store, err)
	}
	var batch idem.BatchConfig
	if o.Batch > 1 {
		batch = idem.BatchConfig{Enabled: true, Size: o.Batch}
	}
	handler := flaky(s.plan, s.failed, s.credit)
	if o.HTTP {
		handler = countAttempts(s.plan, handler)
	}
	// The ledger and (with --fanout) the e-mail consumer differ only in name, effect and tally.
	consumerConfig := func(name string, handler idem.Handler[TTx], obs *tally) idem.ConsumerConfig[TTx] {
		return idem.ConsumerConfig[TTx]{
			Batch:           batch,
			Name:            name,
			Handler:         handler,
			Workers:         o.Concurrency,
			ShutdownTimeout: shutdownTimeout,
			Input:           idem.InputConfig{Validator: idem.ValidatorFunc(payments.Validate)},
			Failure:         idem.FailureConfig{Retry: retryPolicy},
			Claims:          idem.ClaimConfig{RedeliveryWindow: s.br.redelivery},
			Observe:         idem.ObserveConfig{Logger: o.Logger, Observer: obs},
		}
	}
	consumer, err := idem.NewConsumer(store, consumerConfig(payments.ConsumerName, handler, s.tally))
	if err != nil {
		return v, err
	}
	if hook != nil {
		ingress, err := idemwebhook.New(consumer, idemwebhook.Config{Verifier: hook.verifier, DeadLetters: store})
		if err != nil {
			return v, err
		}
		hook.attach(ingress)
	}
	sink := &chaosSink{Sink: s.br.sink, plan: s.plan, runPrefix: s.runID + "-", again: s.br.again, reuse: s.br.reuse, log: o.Logger, done: map[int]bool{}}
	relay, err := idemrelay.New(store, sink, idemrelay.Config{
		ID:           "demo-" + s.runID,
		BatchSize:    relayBatch,
		PollInterval: pollWait,
		LeaseTTL:     relayLeaseTTL,
		Retention:    time.Hour,
		Logger:       o.Logger,
	})
	if err != nil {
		return v, err
	}
	source := newLosingAckSource(s.br.source, s.plan)
	// With --fanout the e-mail consumer gets the same injected lost acks on its own source, and
	// the same duplicates and poison through its subscription.
	var (
		emailConsumer *idem.Consumer[TTx]
		emailSource   *losingAckSource
	)
	if s.br.fanout != nil {
		s.emailTally = newTally(s.runID, o.Events)
		emailConsumer, err = idem.NewConsumer(store, consumerConfig(emailConsumerName, s.sendEmail, s.emailTally))
		if err != nil {
			return v, err
		}
		emailSource = newLosingAckSource(s.br.fanout, s.plan)
	}

	start := time.Now()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	consumerDone, relayDone, producerDone := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go func() { consumerDone <- runConsumers(runCtx, consumer, source, emailConsumer, emailSource) }()
	go func() { relayDone <- relay.Run(runCtx) }()
	go func() { producerDone <- s.produce(runCtx) }()

	problems := s.await(ctx, &producerDone, &consumerDone)
	elapsed := time.Since(start)
	stop()
	for _, ch := range []chan error{consumerDone, relayDone, producerDone} {
		if ch != nil {
			<-ch
		}
	}

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkTimeout)
	defer cancel()
	tenant := ""
	if o.HTTP {
		tenant = httpTenant // the ingress takes it from the signing key
	}
	cv, err := check(cctx, db, s.runID, tenant)
	if err != nil {
		problems = append(problems, fmt.Sprintf("could not compute the verdict: %v", err))
	}
	cv.Store, cv.Broker, cv.Seed, cv.RunID = v.Store, v.Broker, v.Seed, v.RunID
	s.tally.counts(&cv)
	if emailConsumer != nil {
		fv, err := checkFanOut(cctx, db, s.runID)
		if err != nil {
			problems = append(problems, fmt.Sprintf("could not compute the e-mail consumer's verdict: %v", err))
		}
		var counts Verdict
		s.emailTally.counts(&counts)
		fv.Deliveries, fv.Processed, fv.DuplicatesIgnored = counts.Deliveries, counts.Processed, counts.DuplicatesIgnored
		fv.CrashesInjected = int(emailSource.n.Load())
		cv.FanOut = &fv
		if len(fv.Problems) > 0 {
			cv.Problems = append(cv.Problems, fv.Problems...)
			cv.OK = false
		}
	}
	cv.DuplicatesInjected = int(sink.injected.Load())
	cv.DuplicatesDroppedByBroker = int(sink.dropped.Load())
	cv.LostAcksInjected = int(source.n.Load())
	if hook != nil {
		cv.LostAcksInjected = int(hook.crashes.Load())
	}
	for i := range s.failed {
		if s.failed[i].Load() {
			cv.TransientInjected++
		}
	}
	cv.DurationMS = elapsed.Milliseconds()
	if sec := elapsed.Seconds(); sec > 0 {
		cv.EventsPerS = math.Round(float64(cv.Events)/sec*10) / 10
	}
	if d := cv.DuplicatesDroppedByBroker; d > 0 {
		cv.Notes = append(cv.Notes, fmt.Sprintf("JetStream dropped %d of %d injected duplicates by their Nats-Msg-Id "+
			"(broker-level deduplication), so they never reached the consumer", d, cv.DuplicatesInjected))
	}
	cv.Notes = append(cv.Notes, duplicatesNote(cv))
	if len(problems) > 0 {
		cv.Problems = append(problems, cv.Problems...)
		cv.OK = false
	}
	if o.Progress != nil {
		o.Progress(min(s.tally.settled(), o.Events), o.Events)
	}
	return cv, nil
}

// await watches the run until every order is settled and the outbox and broker are drained,
// the timeout passes, ctx ends or a part of the run fails; it returns the problems. It reports
// progress. *producerDone and *consumerDone are set to nil once received from.
func (s *scenario[TTx]) await(ctx context.Context, producerDone, consumerDone *chan error) (problems []string) {
	t := time.NewTicker(tick)
	defer t.Stop()
	deadline := time.NewTimer(s.o.Timeout)
	defer deadline.Stop()
	total, reported := s.o.Events, -1
	var lastCheck time.Time
	for {
		select {
		case <-ctx.Done():
			return append(problems, fmt.Sprintf("interrupted before the run drained: %v", context.Cause(ctx)))
		case <-deadline.C:
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			d, err := s.drainState(wctx)
			if err != nil {
				return append(problems, fmt.Sprintf("did not drain within %v", s.o.Timeout))
			}
			return append(problems, fmt.Sprintf("did not drain within %v: %d of %d orders unsettled, %d events in the outbox, %d in the broker",
				s.o.Timeout, d.unsettled, total, d.outbox, d.broker))
		case err := <-*producerDone:
			*producerDone = nil
			if err != nil && ctx.Err() == nil {
				return append(problems, fmt.Sprintf("the producer failed: %v", err))
			}
			continue
		case err := <-*consumerDone:
			*consumerDone = nil
			if err == nil {
				err = errors.New("Run returned early")
			}
			return append(problems, fmt.Sprintf("the consumer stopped: %v", err))
		case <-t.C:
		}
		done := min(s.tally.settled(), total)
		if s.o.Progress != nil && done != reported {
			s.o.Progress(done, total)
			reported = done
		}
		if *producerDone != nil || (done < total && time.Since(lastCheck) < recheck) {
			continue
		}
		lastCheck = time.Now()
		d, err := s.drainState(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.o.Logger.LogAttrs(ctx, slog.LevelWarn, "demo: drain check failed", slog.String("error", err.Error()))
			}
			continue
		}
		if d.unsettled == 0 && d.outbox == 0 && d.broker == 0 {
			return problems
		}
	}
}

// drain is what is left of a run.
type drain struct {
	unsettled, outbox, broker int
}

// drainState counts, in the database and the broker, the orders not yet settled and the
// run's events still in the outbox or the broker.
func (s *scenario[TTx]) drainState(ctx context.Context) (drain, error) {
	var d drain
	scope := payments.Scope{RunID: s.runID}
	var err error
	if d.outbox, err = payments.OutboxBacklog(ctx, s.db, scope); err != nil {
		return d, err
	}
	if d.broker, err = s.br.backlog(ctx); err != nil {
		return d, fmt.Errorf("broker backlog: %w", err)
	}
	valid, poison, err := payments.Unsettled(ctx, s.db, scope)
	if err != nil {
		return d, err
	}
	n, err := s.db.Count(ctx, `SELECT count(*) FROM {orders} WHERE run_id = ?`, s.runID)
	if err != nil {
		return d, fmt.Errorf("count orders: %w", err)
	}
	// Orders the producer has not written yet are unsettled too.
	d.unsettled = valid + poison + s.o.Events - n
	return d, nil
}

// createWallets creates the run's wallets with a zero balance.
func (s *scenario[TTx]) createWallets(ctx context.Context) error {
	args := make([]any, 0, 2*payments.WalletCount)
	for w := range payments.WalletCount {
		args = append(args, s.runID, payments.WalletID(w))
	}
	q := s.db.SQL(payments.InsertValues("{wallets}", []string{"run_id", "id"}, payments.WalletCount))
	return s.store.InTx(ctx, func(ctx context.Context, tx TTx) error {
		_, err := s.exec(ctx, tx, q, args...)
		return err
	})
}

// produce writes the orders and their events, produceBatch per transaction, keeping at most
// inFlightMax unsettled. A key-reuse order waits until the order whose event id it reuses is
// applied (sent earlier, the two messages would race and either could be applied).
func (s *scenario[TTx]) produce(ctx context.Context) error {
	batch := make([]int, 0, produceBatch)
	var reuse []int
	flushReuse := func() error {
		var ready []int
		rest := reuse[:0]
		for _, i := range reuse {
			if s.appliedByAll(payments.EventID(s.runID, s.plan[i].Target)) {
				ready = append(ready, i)
			} else {
				rest = append(rest, i)
			}
		}
		reuse = rest
		return s.write(ctx, ready)
	}
	for i, o := range s.plan {
		if o.Poison == payments.PoisonKeyReuse {
			reuse = append(reuse, i)
		} else {
			batch = append(batch, i)
		}
		if len(batch) < produceBatch && i < len(s.plan)-1 {
			continue
		}
		for int(s.produced.Load())-s.tally.settled() >= inFlightMax {
			if err := s.wait(ctx); err != nil {
				return err
			}
		}
		if err := s.write(ctx, batch); err != nil {
			return err
		}
		batch = batch[:0]
		if err := flushReuse(); err != nil {
			return err
		}
	}
	for len(reuse) > 0 {
		if err := s.wait(ctx); err != nil {
			return err
		}
		if err := flushReuse(); err != nil {
			return err
		}
	}
	return nil
}

// appliedByAll reports whether every consumer of the run (the ledger, and the e-mail consumer
// with --fanout) has applied eventID.
func (s *scenario[TTx]) appliedByAll(eventID string) bool {
	if _, ok := s.tally.applied(eventID); !ok {
		return false
	}
	if s.emailTally != nil {
		_, ok := s.emailTally.applied(eventID)
		return ok
	}
	return true
}

// runConsumers runs the ledger consumer on src and, when set, the e-mail consumer on
// emailSrc, until ctx ends or one of them returns; then it stops the other and returns the
// first one's error (nil when ctx ended).
func runConsumers[TTx any](ctx context.Context, c *idem.Consumer[TTx], src idem.Source, email *idem.Consumer[TTx], emailSrc idem.Source) error {
	if email == nil {
		return c.Run(ctx, src)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 2)
	go func() { done <- c.Run(ctx, src) }()
	go func() {
		err := email.Run(ctx, emailSrc)
		if err != nil {
			err = fmt.Errorf("%s: %w", emailConsumerName, err)
		} else if ctx.Err() == nil {
			err = fmt.Errorf("%s: Run returned early", emailConsumerName)
		}
		done <- err
	}()
	first := <-done
	cancel()
	<-done
	return first
}

// wait returns when an order may have settled, after a short while anyway, or when ctx ends.
func (s *scenario[TTx]) wait(ctx context.Context) error {
	t := time.NewTimer(50 * time.Millisecond)
	defer t.Stop()
	select {
	case <-s.tally.changed:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// write inserts the orders idxs and enqueues their events in one transaction.
func (s *scenario[TTx]) write(ctx context.Context, idxs []int) error {
	if len(idxs) == 0 {
		return nil
	}
	now := time.Now()
	args := make([]any, 0, 7*len(idxs))
	outs := make([]idem.Outgoing, 0, len(idxs))
	for _, i := range idxs {
		o := s.plan[i]
		id := o.EventID(s.runID)
		args = append(args, i, s.runID, id, payments.WalletID(o.Wallet), o.Amount, o.Valid(), o.Poison)
		outs = append(outs, idem.Outgoing{
			EventID:    id,
			Topic:      s.br.topic,
			Type:       payments.EventType,
			Payload:    o.Payload(),
			Headers:    map[string]string{headerOrder: strconv.Itoa(i)},
			OccurredAt: now,
		})
	}
	q := s.db.SQL(payments.InsertValues("{orders}", []string{"id", "run_id", "event_id", "wallet_id", "amount_cents", "valid", "poison"}, len(idxs)))
	err := s.store.InTx(ctx, func(ctx context.Context, tx TTx) error {
		if _, err := s.exec(ctx, tx, q, args...); err != nil {
			return err
		}
		if err := s.store.EnqueueTx(ctx, tx, outs...); err != nil {
			return err
		}
		// In case the consumer is faster than the line after the commit.
		s.committed(idxs, time.Now())
		return nil
	})
	if err != nil {
		return fmt.Errorf("write orders %d to %d: %w", idxs[0], idxs[len(idxs)-1], err)
	}
	s.committed(idxs, time.Now())
	s.produced.Add(int64(len(idxs)))
	return nil
}

// committed records the producer's commit time of orders idxs, for the latency.
func (s *scenario[TTx]) committed(idxs []int, at time.Time) {
	for _, i := range idxs {
		o := s.plan[i]
		if o.Poison == payments.PoisonKeyReuse {
			continue // its event id belongs to the original order
		}
		s.tally.committed[i].Store(at.UnixNano())
	}
}

// sendEmail is the email@v1 handler of --fanout: it records the payment receipt it would send,
// one demo_emails row, in the transaction that holds the event's claim (a real one would write
// an outbox intent for the mail relay here).
func (s *scenario[TTx]) sendEmail(ctx context.Context, tx TTx, msg idem.Message) error {
	var p payments.Payment
	if err := json.Unmarshal(msg.Payload, &p); err != nil || p.WalletID == nil || p.AmountCents == nil {
		return idem.Permanent(fmt.Errorf("%w: event %s: not a payment", idem.ErrInvalidPayload, msg.EventID))
	}
	n, err := s.exec(ctx, tx, s.insertEmail, s.runID, msg.EventID, *p.WalletID, *p.AmountCents)
	if err != nil {
		return fmt.Errorf("insert e-mail row: %w", err)
	}
	return idem.ExpectRows(n, 1)
}

// credit is the ledger@v1 handler: one ledger row and the wallet's balance, in the
// transaction that holds the event's claim.
func (s *scenario[TTx]) credit(ctx context.Context, tx TTx, msg idem.Message) error {
	var p payments.Payment
	if err := json.Unmarshal(msg.Payload, &p); err != nil || p.WalletID == nil || p.AmountCents == nil {
		return idem.Permanent(fmt.Errorf("%w: event %s: not a payment", idem.ErrInvalidPayload, msg.EventID))
	}
	if _, err := s.exec(ctx, tx, s.insertLedger, s.runID, msg.EventID, *p.WalletID, *p.AmountCents); err != nil {
		return fmt.Errorf("insert ledger row: %w", err)
	}
	n, err := s.exec(ctx, tx, s.creditWallet, *p.AmountCents, s.runID, *p.WalletID)
	if err != nil {
		return fmt.Errorf("credit wallet %s: %w", *p.WalletID, err)
	}
	return idem.ExpectRows(n, 1)
}

// duplicatesNote says where the duplicates the consumer ignored came from, so that the count
// reconciles with what was injected.
func duplicatesNote(v Verdict) string {
	reached := v.DuplicatesInjected - v.DuplicatesDroppedByBroker
	expected := reached + v.LostAcksInjected
	text := fmt.Sprintf("duplicates ignored %d: from %d injected duplicates that reached the consumer and %d lost acks (%d)",
		v.DuplicatesIgnored, reached, v.LostAcksInjected, expected)
	switch d := v.DuplicatesIgnored - expected; {
	case d < 0:
		text += fmt.Sprintf("; %d fewer, because copies of poison messages are dead-lettered again rather than ignored", -d)
	case d > 0:
		text += fmt.Sprintf("; %d more, redelivered by the broker after a lease ran out or republished by the relay", d)
	}
	return text
}
