// Command riverbench runs River and idem side by side, in one process against one PostgreSQL
// database, on the same two workloads: a no-op job, and the ledger effect of `idem bench` (in
// River inside the job's completion transaction, river.JobCompleteTx). Each case gets a fresh
// schema, the same worker count and the same number of jobs inserted before the clock starts;
// the time to drain them is the result. It prints what `idem bench` prints, with the ratios
// idem_queue/river_noop and idem_queue/river_effect (idem's queue-table pipeline in its best
// mode against River).
//
//	go run . --store "$IDEM_POSTGRES_URL" --concurrency 8 --events 20000 --json
//
// It is a module of its own so that River is a dependency of nothing but this benchmark.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/idemkit/idem/cmd/idem/internal/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// defaultCases interleaves River's cases with idem's, so that a shared machine's load drifts
// over both sides alike.
var defaultCases = []string{caseRiverNoop, bench.CaseQueueNoop, caseRiverEffect, bench.CaseQueueEffect}

// run is the command: it parses args, runs the cases and writes the report to stdout; it
// returns the exit code (2 for bad usage).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("riverbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		store   = fs.String("store", os.Getenv("IDEM_POSTGRES_URL"), "PostgreSQL URL (postgres://…; default $IDEM_POSTGRES_URL)")
		events  = fs.Int("events", 20000, "jobs inserted before each case's drain")
		conc    = ints{8}
		batches = ints{100}
		cases   = fs.String("cases", strings.Join(defaultCases, ","), "comma-separated cases, run in this order")
		asJSON  = fs.Bool("json", false, "print JSON: the cases, the ratios by name and the targets")
		rc      riverConfig
	)
	fs.Var(&conc, "concurrency", "worker counts, comma-separated (both sides get the same)")
	fs.Var(&batches, "batch", "batch sizes of idem's batched and set-based modes, comma-separated")
	fs.IntVar(&rc.Workers, "river-workers", 0, "River's MaxWorkers, if not the run's worker count (to give River as many jobs in flight as idem's batches)")
	fs.DurationVar(&rc.FetchCooldown, "river-fetch-cooldown", 0, "River's FetchCooldown (default river.FetchCooldownMin, 1ms; River's own default is 100ms)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "riverbench: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	opts := options(*store, *events, conc, batches, strings.Split(*cases, ","), rc)
	if !*asJSON {
		opts.Logf = func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) }
	}
	if err := opts.WithDefaults().Validate(); err != nil {
		fmt.Fprintf(stderr, "riverbench: %v\n", err)
		return 2
	}
	rs, err := bench.Run(ctx, opts)
	if err != nil {
		fmt.Fprintf(stderr, "riverbench: %v\n", err)
		return 1
	}
	targets := append(bench.Ratios(rs), ratios(rs, opts.WithDefaults().Concurrency, rc.Workers)...)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(map[string]any{"cases": rs, "ratios": bench.RatioMap(targets), "targets": targets})
	} else {
		err = bench.WriteTable(stdout, rs, targets)
	}
	if err != nil {
		fmt.Fprintf(stderr, "riverbench: %v\n", err)
		return 1
	}
	return 0
}

// options is the bench run: idem's drain cases and River's, as cases selects them.
func options(store string, events int, conc, batches []int, cases []string, rc riverConfig) bench.Options {
	return bench.Options{
		PostgresURL: store,
		Events:      events,
		Concurrency: conc,
		BatchSizes:  batches,
		Cases:       cases,
		Extra:       append(bench.QueueDrainCases(), riverCases(rc)...),
	}
}

// ratios compares idem's queue-table drain with River's, at 8 workers when the run had them
// (else at its first worker count; River at riverWorkers when positive): idem_queue/river_noop and idem_queue/river_effect take
// idem's best mode (the targets, ≥ 1), and idem_queue_MODE/river_… each mode alone.
func ratios(rs []bench.Result, conc []int, riverWorkers int) []bench.Ratio {
	workers := conc[0]
	for _, c := range conc {
		if c == 8 {
			workers = 8
		}
	}
	if riverWorkers <= 0 {
		riverWorkers = workers
	}
	find := func(name string) (bench.Result, bool) {
		for _, r := range rs {
			if r.Case == name && r.Concurrency == riverWorkers {
				return r, true
			}
		}
		return bench.Result{}, false
	}
	var out []bench.Ratio
	for _, w := range []struct{ river, idem string }{{caseRiverNoop, bench.CaseQueueNoop}, {caseRiverEffect, bench.CaseQueueEffect}} {
		rv, ok := find(w.river)
		if !ok || rv.EventsPerS == 0 {
			continue
		}
		// The best result of each mode over the batch sizes.
		best := map[string]float64{}
		var modes []string
		for _, r := range rs {
			if r.Concurrency != workers {
				continue
			}
			mode := ""
			switch {
			case r.Case == w.idem && r.Batch == 0:
				mode = "per_event"
			case r.Case == w.idem:
				mode = "batched"
			case r.Case == w.idem+bench.SetSuffix:
				mode = "set"
			default:
				continue
			}
			if _, seen := best[mode]; !seen {
				modes = append(modes, mode)
			}
			best[mode] = max(best[mode], r.EventsPerS)
		}
		if len(modes) == 0 {
			continue
		}
		top := 0.0
		for _, m := range modes {
			top = max(top, best[m])
		}
		v := top / rv.EventsPerS
		out = append(out, bench.Ratio{Key: "idem_queue/" + w.river, Name: fmt.Sprintf("idem_queue (best mode, %d workers) / %s (%d workers)", workers, w.river, riverWorkers),
			Value: v, Target: 1, Min: true, OK: v >= 1})
		for _, m := range modes {
			v := best[m] / rv.EventsPerS
			out = append(out, bench.Ratio{Key: "idem_queue_" + m + "/" + w.river, Name: fmt.Sprintf("idem_queue (%s, %d workers) / %s (%d workers)", m, workers, w.river, riverWorkers), Value: v, Min: true, OK: true})
		}
	}
	return out
}

// ints is a comma-separated list of integers as a flag value.
type ints []int

func (l *ints) String() string {
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (l *ints) Set(v string) error {
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("%q is not an integer", f)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}
