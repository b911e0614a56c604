package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/idemkit/idem/idemredact"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemkit/idem/cmd/idem/internal/bench"
)

// Names of River's cases.
const (
	caseRiverNoop   = "river_noop"
	caseRiverEffect = "river_effect"
)

// riverConfig is how River is run: the settings River leaves to its user.
type riverConfig struct {
	// FetchCooldown is River's minimum time between two fetches of one queue. River's default
	// (100 ms) caps a queue of 8 workers at 80 jobs/s when every fetch finds the workers
	// busy, so the comparison gives River its minimum, river.FetchCooldownMin, unless told.
	FetchCooldown time.Duration
	// Workers, when positive, is River's MaxWorkers instead of the run's worker count: River
	// works one job per worker, where idem's batched modes work a batch per worker, so this
	// lets River have as many jobs in flight as idem (8 workers × batch 100 = 800). Results
	// report it as their concurrency.
	Workers int
}

// riverCases returns River's two cases, run as cfg says.
func riverCases(cfg riverConfig) []bench.Case {
	return []bench.Case{
		{Name: caseRiverNoop, Run: func(ctx context.Context, opts bench.Options, workers int) ([]bench.Result, error) {
			r, _, err := runRiver(ctx, opts, cfg, workers, false)
			return []bench.Result{r}, err
		}},
		{Name: caseRiverEffect, Run: func(ctx context.Context, opts bench.Options, workers int) ([]bench.Result, error) {
			r, _, err := runRiver(ctx, opts, cfg, workers, true)
			return []bench.Result{r}, err
		}},
	}
}

// noopArgs is the no-op job; its fields mirror what an idem event carries.
type noopArgs struct {
	EventID string `json:"event_id"`
	Wallet  int    `json:"wallet"`
	Amount  int    `json:"amount"`
	Order   string `json:"order"`
}

// Kind names the job for River.
func (noopArgs) Kind() string { return "bench_noop" }

// effectArgs is the ledger job: the same fields as noopArgs.
type effectArgs noopArgs

// Kind names the job for River.
func (effectArgs) Kind() string { return "bench_effect" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// effectWorker applies the ledger effect and completes its job in the same transaction
// (river.JobCompleteTx), River's way to make a job's effect and its completion atomic.
type effectWorker struct {
	river.WorkerDefaults[effectArgs]
	pool   *pgxpool.Pool
	ledger bench.Ledger
}

func (w *effectWorker) Work(ctx context.Context, job *river.Job[effectArgs]) error {
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if err := w.ledger.Credit(ctx, tx, job.Args.EventID, job.Args.Wallet); err != nil {
			return err
		}
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// riverCounts is what a River case finds in its schema after the drain.
type riverCounts struct {
	// Completed and Jobs count River's jobs in state completed and in all.
	Completed, Jobs int
	// LedgerRows, DistinctEvents and BalanceSum describe the effect (zero for the no-op job).
	LedgerRows, DistinctEvents int
	BalanceSum                 int64
}

// runRiver measures one River case in a fresh schema: River's migrations, the run's events
// inserted as jobs up front, then a client with workers workers started and timed until the
// last job completed. It checks that every job completed once and, with the effect, that the
// ledger holds each event once.
func runRiver(ctx context.Context, opts bench.Options, cfg riverConfig, workers int, effect bool) (bench.Result, riverCounts, error) {
	opts = opts.WithDefaults()
	if cfg.Workers > 0 {
		workers = cfg.Workers
	}
	name := caseRiverNoop
	if effect {
		name = caseRiverEffect
	}
	pcfg, err := pgxpool.ParseConfig(opts.PostgresURL)
	if err != nil {
		return bench.Result{}, riverCounts{}, fmt.Errorf("%s: %s: %w", name, idemredact.URL(opts.PostgresURL), err)
	}
	// The same pool size as idem's cases get.
	maxC := int32(4)
	for _, c := range opts.Concurrency {
		maxC = max(maxC, int32(c)+4)
	}
	pcfg.MaxConns = maxC
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return bench.Result{}, riverCounts{}, fmt.Errorf("%s: connect: %w", name, err)
	}
	defer pool.Close()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	// The effect is idem bench's own (bench.Ledger), so both sides do the same statements per event.
	l := bench.Ledger{Schema: "riverbench_" + hex.EncodeToString(b), Wallets: opts.Wallets}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+l.Schema); err != nil {
		return bench.Result{}, riverCounts{}, fmt.Errorf("%s: create schema: %w", name, err)
	}
	defer func() {
		dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(dropCtx, `DROP SCHEMA IF EXISTS `+l.Schema+` CASCADE`)
	}()
	if err := l.Create(ctx, pool); err != nil {
		return bench.Result{}, riverCounts{}, fmt.Errorf("%s: business tables: %w", name, err)
	}
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: l.Schema, Logger: discard()})
	if err != nil {
		return bench.Result{}, riverCounts{}, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return bench.Result{}, riverCounts{}, fmt.Errorf("%s: River's migrations: %w", name, err)
	}
	ws := river.NewWorkers()
	river.AddWorker(ws, noopWorker{})
	river.AddWorker(ws, &effectWorker{pool: pool, ledger: l})
	cooldown := cmp.Or(cfg.FetchCooldown, river.FetchCooldownMin)
	client, err := river.NewClient(driver, &river.Config{
		Schema:            l.Schema,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:           ws,
		FetchCooldown:     cooldown,
		FetchPollInterval: max(cooldown, 100*time.Millisecond),
		Logger:            discard(),
	})
	if err != nil {
		return bench.Result{}, riverCounts{}, err
	}
	n := opts.Events
	params := make([]river.InsertManyParams, 0, 1000)
	for i := range n {
		a := noopArgs{EventID: fmt.Sprintf("evt-%d", i+1), Wallet: (i + 1) % opts.Wallets, Amount: 1, Order: fmt.Sprintf("o-%d", i+1)}
		if effect {
			params = append(params, river.InsertManyParams{Args: effectArgs(a)})
		} else {
			params = append(params, river.InsertManyParams{Args: a})
		}
		if len(params) == cap(params) || i == n-1 {
			if _, err := client.InsertManyFast(ctx, params); err != nil {
				return bench.Result{}, riverCounts{}, fmt.Errorf("%s: insert: %w", name, err)
			}
			params = params[:0]
		}
	}
	events, cancelSub := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: n + 1000, Kinds: []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed}})
	defer cancelSub()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return bench.Result{}, riverCounts{}, fmt.Errorf("%s: start: %w", name, err)
	}
	timeout := time.After(10 * time.Minute)
	for done := 0; done < n; {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				_ = client.Stop(context.WithoutCancel(ctx))
				return bench.Result{}, riverCounts{}, fmt.Errorf("%s: job %d: %s: %v", name, ev.Job.ID, ev.Kind, ev.Job.Errors)
			}
			done++
		case <-timeout:
			_ = client.Stop(context.WithoutCancel(ctx))
			return bench.Result{}, riverCounts{}, fmt.Errorf("%s: %d of %d jobs completed after 10 minutes", name, done, n)
		case <-ctx.Done():
			_ = client.Stop(context.WithoutCancel(ctx))
			return bench.Result{}, riverCounts{}, ctx.Err()
		}
	}
	d := time.Since(start)
	if err := client.Stop(ctx); err != nil {
		return bench.Result{}, riverCounts{}, fmt.Errorf("%s: stop: %w", name, err)
	}
	var c riverCounts
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FROM `+l.Schema+`.river_job`).Scan(&c.Completed, &c.Jobs); err != nil {
		return bench.Result{}, c, fmt.Errorf("%s: count jobs: %w", name, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id), (SELECT coalesce(sum(balance), 0) FROM `+l.Schema+`.wallets)
		FROM `+l.Schema+`.ledger`).Scan(&c.LedgerRows, &c.DistinctEvents, &c.BalanceSum); err != nil {
		return bench.Result{}, c, fmt.Errorf("%s: count ledger rows: %w", name, err)
	}
	want := riverCounts{Completed: n, Jobs: n}
	if effect {
		want.LedgerRows, want.DistinctEvents, want.BalanceSum = n, n, int64(n)
	}
	if c != want {
		return bench.Result{}, c, fmt.Errorf("%s: found %+v, want %+v", name, c, want)
	}
	return bench.Result{Case: name, Store: "postgres", Concurrency: workers, Events: n, Seconds: d.Seconds(), EventsPerS: float64(n) / d.Seconds()}, c, nil
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
