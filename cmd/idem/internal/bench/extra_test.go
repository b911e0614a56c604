package bench

import (
	"context"
	"strconv"
	"strings"
	"testing"
)

func TestExtraCasesValidate(t *testing.T) {
	t.Parallel()
	run := func(context.Context, Options, int) ([]Result, error) { return nil, nil }
	for _, tc := range []struct {
		name  string
		extra []Case
		cases []string
		want  string // "" for valid
	}{
		{"added case selected", []Case{{Name: "river_noop", Run: run}}, []string{"per_event", "river_noop"}, ""},
		{"drain cases", QueueDrainCases(), []string{CaseQueueNoop, CaseQueueEffect}, ""},
		{"unknown case", []Case{{Name: "river_noop", Run: run}}, []string{"river_effect"}, `unknown case "river_effect"`},
		{"no name", []Case{{Run: run}}, nil, "Extra[0]: the case has no name"},
		{"no Run", []Case{{Name: "x"}}, nil, "Extra[0] (x): Run is nil"},
		{"a built-in name", []Case{{Name: "per_event", Run: run}}, nil, `Extra[0]: case "per_event" is already defined`},
		{"twice", []Case{{Name: "x", Run: run}, {Name: "x", Run: run}}, nil, `Extra[1]: case "x" is already defined`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := Options{PostgresURL: "postgres://x", Extra: tc.extra, Cases: tc.cases}.WithDefaults().Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestExtraCasesRunInTheOrderNamed checks that added cases run in the order Cases names them,
// at each worker count, after the built-in ones.
func TestExtraCasesRunInTheOrderNamed(t *testing.T) {
	t.Parallel()
	var got []string
	mk := func(name string) Case {
		return Case{Name: name, Run: func(_ context.Context, _ Options, workers int) ([]Result, error) {
			return []Result{{Case: name, Concurrency: workers}}, nil
		}}
	}
	opts := Options{Extra: []Case{mk("a"), mk("b")}, Cases: []string{"b", "per_event", "a"}, Concurrency: []int{1, 8}}
	err := runExtra(context.Background(), opts, func(r Result, err error) error {
		got = append(got, r.Case+"@"+strconv.Itoa(r.Concurrency))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "b@1 b@8 a@1 a@8"; strings.Join(got, " ") != want {
		t.Fatalf("ran %v, want %s", got, want)
	}
}
