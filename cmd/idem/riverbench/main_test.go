package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/cmd/idem/internal/bench"
	"github.com/idemkit/idem/internal/testenv"
)

// TestMain runs the tests and names, in one line, the service variables whose absence made
// tests skip; it fails on leaked goroutines (a River client or pool left running).
func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// TestRiverRunsEachJobOnce drains a few jobs through River, with and without the ledger
// effect, and counts what the schema holds afterwards: every job completed once, and with the
// effect one ledger row per event and balances summing to the number of events.
func TestRiverRunsEachJobOnce(t *testing.T) {
	t.Parallel()
	url := testenv.Postgres(t)
	const n = 200
	for _, tc := range []struct {
		name   string
		effect bool
		want   riverCounts
	}{
		{"noop", false, riverCounts{Completed: n, Jobs: n}},
		{"effect", true, riverCounts{Completed: n, Jobs: n, LedgerRows: n, DistinctEvents: n, BalanceSum: n}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := bench.Options{PostgresURL: url, Events: n, Concurrency: []int{8}}
			r, counts, err := runRiver(context.Background(), opts, riverConfig{}, 8, tc.effect)
			require.NoError(t, err)
			require.Equal(t, tc.want, counts)
			require.Equal(t, n, r.Events)
			require.Equal(t, 8, r.Concurrency)
			require.Positive(t, r.EventsPerS)
		})
	}
}

// TestSideBySide runs the command as documented, at 200 jobs: River's cases and idem's drain
// cases in every mode, each of which checks its books after the drain (idem's: one claim per
// event, an empty queue, one ledger row per event; River's: as above) and fails the run when
// an event was applied twice or not at all. The JSON carries both ratios.
func TestSideBySide(t *testing.T) {
	t.Parallel()
	url := testenv.Postgres(t)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--store", url, "--concurrency", "8", "--events", "200", "--batch", "50", "--json"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	var out struct {
		Cases  []bench.Result     `json:"cases"`
		Ratios map[string]float64 `json:"ratios"`
	}
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &out))
	type key struct {
		name  string
		batch int
	}
	got := map[key]int{}
	for _, r := range out.Cases {
		require.Equal(t, 8, r.Concurrency, r.Case)
		got[key{r.Case, r.Batch}] = r.Events
	}
	require.Equal(t, map[key]int{
		{"river_noop", 0}: 200, {"idem_queue_noop", 0}: 200, {"idem_queue_noop", 50}: 200, {"idem_queue_noop_set", 50}: 200,
		{"river_effect", 0}: 200, {"idem_queue_effect", 0}: 200, {"idem_queue_effect", 50}: 200, {"idem_queue_effect_set", 50}: 200,
	}, got)
	for _, k := range []string{"idem_queue/river_noop", "idem_queue/river_effect", "idem_queue_per_event/river_effect", "idem_queue_set/river_noop"} {
		require.Positive(t, out.Ratios[k], k)
	}
}

func TestRatios(t *testing.T) {
	t.Parallel()
	res := func(name string, conc, batch int, perS float64) bench.Result {
		return bench.Result{Case: name, Concurrency: conc, Batch: batch, EventsPerS: perS}
	}
	for _, tc := range []struct {
		name string
		rs   []bench.Result
		conc []int
		rw   int
		want map[string]float64
	}{
		{
			name: "best mode against River, per workload",
			rs: []bench.Result{
				res("river_noop", 8, 0, 1000), res("idem_queue_noop", 8, 0, 500), res("idem_queue_noop", 8, 10, 1500), res("idem_queue_noop", 8, 100, 2000), res("idem_queue_noop_set", 8, 100, 1800),
				res("river_effect", 8, 0, 400), res("idem_queue_effect", 8, 0, 200), res("idem_queue_effect_set", 8, 100, 1200),
			},
			conc: []int{8},
			want: map[string]float64{
				"idem_queue/river_noop": 2, "idem_queue_per_event/river_noop": 0.5, "idem_queue_batched/river_noop": 2, "idem_queue_set/river_noop": 1.8,
				"idem_queue/river_effect": 3, "idem_queue_per_event/river_effect": 0.5, "idem_queue_set/river_effect": 3,
			},
		},
		{
			name: "8 workers preferred over the others run",
			rs:   []bench.Result{res("river_noop", 4, 0, 100), res("idem_queue_noop", 4, 0, 1000), res("river_noop", 8, 0, 1000), res("idem_queue_noop", 8, 0, 500)},
			conc: []int{4, 8},
			want: map[string]float64{"idem_queue/river_noop": 0.5, "idem_queue_per_event/river_noop": 0.5},
		},
		{
			name: "River with more workers than idem",
			rs:   []bench.Result{res("river_effect", 800, 0, 1000), res("river_effect", 8, 0, 100), res("idem_queue_effect", 8, 100, 500)},
			conc: []int{8},
			rw:   800,
			want: map[string]float64{"idem_queue/river_effect": 0.5, "idem_queue_batched/river_effect": 0.5},
		},
		{
			name: "no River result, no ratio",
			rs:   []bench.Result{res("idem_queue_noop", 8, 0, 500)},
			conc: []int{8},
			want: map[string]float64{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := ratios(tc.rs, tc.conc, tc.rw)
			require.Equal(t, tc.want, bench.RatioMap(got))
			for _, r := range got {
				if strings.HasPrefix(r.Key, "idem_queue/") {
					require.Equal(t, 1.0, r.Target, r.Key)
					require.Equal(t, r.Value >= 1, r.OK, r.Key)
				}
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no store", []string{"--store", ""}, "PostgreSQL URL is empty"},
		{"unknown case", []string{"--store", "postgres://x", "--cases", "river_noop,sidekiq"}, `unknown case "sidekiq"`},
		{"bad worker count", []string{"--store", "postgres://x", "--concurrency", "8,x"}, `"x" is not an integer`},
		{"argument", []string{"--store", "postgres://x", "extra"}, `unexpected argument "extra"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			require.Equal(t, 2, run(context.Background(), tc.args, &stdout, &stderr))
			require.Contains(t, stderr.String(), tc.want)
		})
	}
}
