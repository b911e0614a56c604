package retry

import (
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// newTestRand returns the deterministic source every test uses.
func newTestRand() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// fixedRand always returns ret(n); it checks how Backoff calls Int64N.
type fixedRand struct {
	ret   func(n int64) int64
	lastN int64
}

func (f *fixedRand) Int64N(n int64) int64 {
	f.lastN = n
	return f.ret(n)
}

func TestWithDefaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   Policy
		want Policy
	}{
		{"zero", Policy{}, Policy{MaxAttemptsDefault, MaxElapsedDefault, BaseDefault, CapDefault}},
		{"defaults values", Policy{}, Policy{8, 15 * time.Minute, 500 * time.Millisecond, 30 * time.Second}},
		{"all set", Policy{3, time.Minute, time.Second, 5 * time.Second}, Policy{3, time.Minute, time.Second, 5 * time.Second}},
		{"partial", Policy{MaxAttempts: 2, Cap: time.Second}, Policy{2, MaxElapsedDefault, BaseDefault, time.Second}},
		{"negatives kept", Policy{-1, -time.Second, -time.Second, -time.Second}, Policy{-1, -time.Second, -time.Second, -time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.in.WithDefaults(); got != tt.want {
				t.Errorf("WithDefaults() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		p    Policy
		want []string // substrings of the error; nil means valid
	}{
		{"zero is valid", Policy{}, nil},
		{"defaults are valid", Policy{}.WithDefaults(), nil},
		{"cap equals base", Policy{Base: time.Second, Cap: time.Second}, nil},
		{"one attempt", Policy{MaxAttempts: 1}, nil},
		{"negative MaxAttempts", Policy{MaxAttempts: -1}, []string{"MaxAttempts", "(-1)", "negative"}},
		{"negative MaxElapsed", Policy{MaxElapsed: -time.Minute}, []string{"MaxElapsed", "(-1m0s)", "negative"}},
		{"negative Base", Policy{Base: -5 * time.Millisecond}, []string{"Base", "(-5ms)", "negative"}},
		{"negative Cap", Policy{Cap: -time.Second}, []string{"Cap", "(-1s)", "negative"}},
		{"cap below default base", Policy{Cap: 10 * time.Millisecond}, []string{"retry: Cap (10ms) is below Base (500ms)"}},
		{"cap below base", Policy{Base: 2 * time.Second, Cap: time.Second}, []string{"retry: Cap (1s) is below Base (2s)"}},
		{"several", Policy{MaxAttempts: -2, Cap: -time.Second}, []string{"MaxAttempts (-2)", "Cap (-1s)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.p.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want error containing %q", tt.want)
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Validate() = %q, want it to contain %q", err, s)
				}
			}
			if !strings.HasPrefix(err.Error(), "retry: ") {
				t.Errorf("Validate() = %q, want prefix %q", err, "retry: ")
			}
		})
	}
}

func TestCeiling(t *testing.T) {
	t.Parallel()
	def := Policy{}
	huge := Policy{Base: time.Nanosecond, Cap: math.MaxInt64}
	tests := []struct {
		name    string
		p       Policy
		attempt int
		want    time.Duration
	}{
		{"attempt 1 is base", def, 1, 500 * time.Millisecond},
		{"attempt 2", def, 2, time.Second},
		{"attempt 3", def, 3, 2 * time.Second},
		{"attempt 7", def, 7, 30 * time.Second},
		{"attempt 5", def, 5, 8 * time.Second},
		{"attempt 6", def, 6, 16 * time.Second},
		{"attempt 0 counts as 1", def, 0, 500 * time.Millisecond},
		{"negative attempt counts as 1", def, -7, 500 * time.Millisecond},
		{"attempt 62", def, 62, 30 * time.Second},
		{"attempt 64 overflow", def, 64, 30 * time.Second},
		{"attempt 65 overflow", def, 65, 30 * time.Second},
		{"attempt 1000", def, 1000, 30 * time.Second},
		{"attempt MaxInt", def, math.MaxInt, 30 * time.Second},
		{"huge cap 2^62", huge, 63, 1 << 62},
		{"huge cap at 2^63 clamps", huge, 64, math.MaxInt64},
		{"huge cap MaxInt", huge, math.MaxInt, math.MaxInt64},
		{"base above cap", Policy{Base: time.Minute, Cap: time.Second}, 1, time.Second},
		{"invalid negative base", Policy{Base: -time.Second}, 3, 0},
		{"invalid negative cap", Policy{Cap: -time.Second}, 3, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.p.Ceiling(tt.attempt); got != tt.want {
				t.Errorf("Ceiling(%d) = %v, want %v", tt.attempt, got, tt.want)
			}
		})
	}
}

func TestBackoffInclusiveBounds(t *testing.T) {
	t.Parallel()
	p := Policy{}
	tests := []struct {
		name    string
		attempt int
		ret     func(n int64) int64
		want    time.Duration
	}{
		{"lowest draw is zero", 3, func(int64) int64 { return 0 }, 0},
		{"highest draw is ceiling", 3, func(n int64) int64 { return n - 1 }, 2 * time.Second},
		{"highest draw at cap", 40, func(n int64) int64 { return n - 1 }, 30 * time.Second},
		{"misbehaving rand above range", 3, func(n int64) int64 { return n + 100 }, 2 * time.Second},
		{"misbehaving rand negative", 3, func(int64) int64 { return -5 }, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := &fixedRand{ret: tt.ret}
			if got := p.Backoff(tt.attempt, r); got != tt.want {
				t.Errorf("Backoff(%d) = %v, want %v", tt.attempt, got, tt.want)
			}
			if want := int64(p.Ceiling(tt.attempt)) + 1; r.lastN != want {
				t.Errorf("Int64N called with %d, want Ceiling+1 = %d", r.lastN, want)
			}
		})
	}

	t.Run("max ceiling does not overflow", func(t *testing.T) {
		t.Parallel()
		r := &fixedRand{ret: func(n int64) int64 { return n - 1 }}
		q := Policy{Base: time.Nanosecond, Cap: math.MaxInt64}
		got := q.Backoff(1000, r)
		if r.lastN <= 0 {
			t.Fatalf("Int64N called with non-positive n %d", r.lastN)
		}
		if got < 0 || got > math.MaxInt64-1 {
			t.Errorf("Backoff = %v, out of range", got)
		}
	})

	t.Run("one nanosecond ceiling yields both endpoints", func(t *testing.T) {
		t.Parallel()
		q := Policy{Base: time.Nanosecond, Cap: time.Nanosecond}
		r := newTestRand()
		seen := map[time.Duration]int{}
		for range 1000 {
			seen[q.Backoff(1, r)]++
		}
		if len(seen) != 2 || seen[0] == 0 || seen[1] == 0 {
			t.Errorf("draws over [0,1ns] = %v, want both 0 and 1ns", seen)
		}
	})
}

func TestBackoffDeterministic(t *testing.T) {
	t.Parallel()
	p := Policy{}
	r1, r2 := newTestRand(), newTestRand()
	for a := 1; a <= 100; a++ {
		if d1, d2 := p.Backoff(a, r1), p.Backoff(a, r2); d1 != d2 {
			t.Fatalf("attempt %d: same seed gave %v and %v", a, d1, d2)
		}
	}
}

func TestJitterCoversWholeRange(t *testing.T) {
	t.Parallel()
	const (
		draws   = 20000
		buckets = 10
	)
	tests := []struct {
		name    string
		p       Policy
		attempt int
	}{
		{"first attempt", Policy{}, 1},
		{"middle attempt", Policy{}, 4},
		{"capped attempt", Policy{}, 9},
		{"huge attempt", Policy{}, 1 << 40},
		{"tiny ceiling", Policy{Base: 100 * time.Nanosecond, Cap: time.Microsecond}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newTestRand()
			ceil := tt.p.Ceiling(tt.attempt)
			var counts [buckets]int
			lo, hi := ceil, time.Duration(0)
			for range draws {
				d := tt.p.Backoff(tt.attempt, r)
				if d < 0 || d > ceil {
					t.Fatalf("Backoff = %v outside [0, %v]", d, ceil)
				}
				b := int(int64(d) * buckets / (int64(ceil) + 1))
				counts[b]++
				lo, hi = min(lo, d), max(hi, d)
			}
			// Expect draws/buckets = 2000 per bucket; 1500 is far below any
			// plausible fluctuation of a uniform draw.
			for i, c := range counts {
				if c < 1500 {
					t.Errorf("bucket %d/%d got %d draws, want >= 1500 (counts %v)", i, buckets, c, counts)
				}
			}
			if lo > ceil/100 {
				t.Errorf("smallest draw %v, want near 0 (<= %v)", lo, ceil/100)
			}
			if hi < ceil-ceil/100 {
				t.Errorf("largest draw %v, want near ceiling %v", hi, ceil)
			}
		})
	}
}

func TestDecideBoundsOverManyDraws(t *testing.T) {
	t.Parallel()
	policies := []Policy{
		{},
		{MaxAttempts: 100, MaxElapsed: time.Minute, Base: 10 * time.Millisecond, Cap: 5 * time.Second},
		{MaxAttempts: math.MaxInt, MaxElapsed: math.MaxInt64, Base: time.Nanosecond, Cap: time.Hour},
	}
	elapsed := []time.Duration{0, time.Millisecond, time.Second, 10 * time.Second, 55 * time.Second, 14*time.Minute + 59*time.Second, 15*time.Minute - time.Nanosecond}
	for i, p := range policies {
		r := newTestRand()
		d := p.WithDefaults()
		for attempt := 1; attempt <= 80; attempt++ {
			for _, el := range elapsed {
				remaining := d.MaxElapsed - el
				spent := attempt >= d.MaxAttempts || el >= d.MaxElapsed
				for range 100 {
					v := p.Decide(Input{Attempt: attempt, FirstAt: t0, Now: t0.Add(el)}, r)
					if v.Retry == spent {
						t.Fatalf("policy %d attempt %d elapsed %v: Decide = %+v, budget spent = %v", i, attempt, el, v, spent)
					}
					if !v.Retry {
						continue
					}
					if v.Delay < 0 || v.Delay > d.Cap || v.Delay > remaining || v.Delay > p.Ceiling(attempt) {
						t.Fatalf("policy %d attempt %d elapsed %v: delay %v outside [0, min(cap %v, ceiling %v, remaining %v)]",
							i, attempt, el, v.Delay, d.Cap, p.Ceiling(attempt), remaining)
					}
				}
			}
		}
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	def := Policy{}
	short := Policy{MaxAttempts: 5, MaxElapsed: time.Minute, Base: time.Second, Cap: 10 * time.Second}
	tests := []struct {
		name    string
		p       Policy
		in      Input
		retry   bool
		delay   time.Duration // checked exactly when exact
		exact   bool
		maxWant time.Duration // otherwise Delay must be in [0, maxWant]
	}{
		{name: "first failure retries", p: def, in: Input{Attempt: 1, FirstAt: t0, Now: t0}, retry: true, maxWant: 500 * time.Millisecond},
		{name: "last allowed retry", p: def, in: Input{Attempt: 7, FirstAt: t0, Now: t0}, retry: true, maxWant: 30 * time.Second},
		{name: "attempts exhausted", p: def, in: Input{Attempt: 8, FirstAt: t0, Now: t0}},
		{name: "attempts beyond budget", p: def, in: Input{Attempt: 9, FirstAt: t0, Now: t0}},
		{name: "custom attempts exhausted", p: short, in: Input{Attempt: 5, FirstAt: t0, Now: t0}},
		{name: "single attempt policy", p: Policy{MaxAttempts: 1}, in: Input{Attempt: 1, FirstAt: t0, Now: t0}},
		{name: "attempts exhausted beats hint", p: def, in: Input{Attempt: 8, FirstAt: t0, Now: t0, Hint: time.Second}},
		{name: "elapsed exactly spent", p: def, in: Input{Attempt: 2, FirstAt: t0, Now: t0.Add(15 * time.Minute)}},
		{name: "elapsed overspent", p: def, in: Input{Attempt: 2, FirstAt: t0, Now: t0.Add(time.Hour)}},
		{name: "elapsed spent beats hint", p: short, in: Input{Attempt: 2, FirstAt: t0, Now: t0.Add(time.Minute), Hint: time.Nanosecond}},
		{name: "jitter clipped to remaining", p: def, in: Input{Attempt: 7, FirstAt: t0, Now: t0.Add(15*time.Minute - time.Millisecond)}, retry: true, maxWant: time.Millisecond},
		{name: "one nanosecond left", p: def, in: Input{Attempt: 7, FirstAt: t0, Now: t0.Add(15*time.Minute - 1)}, retry: true, maxWant: 1},
		{name: "hint honoured", p: def, in: Input{Attempt: 1, FirstAt: t0, Now: t0, Hint: 3 * time.Second}, retry: true, delay: 3 * time.Second, exact: true},
		{name: "hint above cap honoured", p: short, in: Input{Attempt: 1, FirstAt: t0, Now: t0, Hint: 45 * time.Second}, retry: true, delay: 45 * time.Second, exact: true},
		{name: "hint equal to remaining", p: short, in: Input{Attempt: 2, FirstAt: t0, Now: t0.Add(20 * time.Second), Hint: 40 * time.Second}, retry: true, delay: 40 * time.Second, exact: true},
		{name: "hint beyond remaining exhausts", p: short, in: Input{Attempt: 2, FirstAt: t0, Now: t0.Add(20 * time.Second), Hint: 40*time.Second + 1}},
		{name: "hint beyond whole budget exhausts", p: def, in: Input{Attempt: 1, FirstAt: t0, Now: t0, Hint: time.Hour}},
		{name: "negative hint ignored", p: short, in: Input{Attempt: 1, FirstAt: t0, Now: t0, Hint: -time.Hour}, retry: true, maxWant: time.Second},
		{name: "clock skew counts as no elapsed", p: short, in: Input{Attempt: 3, FirstAt: t0, Now: t0.Add(-time.Hour)}, retry: true, maxWant: 4 * time.Second},
		{name: "clock skew hint bounded by full budget", p: short, in: Input{Attempt: 3, FirstAt: t0, Now: t0.Add(-time.Hour), Hint: 2 * time.Minute}},
		{name: "zero times", p: def, in: Input{Attempt: 1}, retry: true, maxWant: 500 * time.Millisecond},
		{name: "attempt zero treated as first", p: def, in: Input{Attempt: 0, FirstAt: t0, Now: t0}, retry: true, maxWant: 500 * time.Millisecond},
		{name: "invalid negative policy exhausts", p: Policy{MaxAttempts: -1}, in: Input{Attempt: 1, FirstAt: t0, Now: t0}},
		{name: "invalid negative elapsed budget exhausts", p: Policy{MaxElapsed: -time.Second}, in: Input{Attempt: 1, FirstAt: t0, Now: t0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := tt.p.Decide(tt.in, newTestRand())
			if v.Retry != tt.retry {
				t.Fatalf("Decide() = %+v, want Retry=%v", v, tt.retry)
			}
			if !tt.retry {
				if v.Reason != ReasonExhausted || v.Delay != 0 {
					t.Errorf("Decide() = %+v, want {Reason: %q, Delay: 0}", v, ReasonExhausted)
				}
				return
			}
			if v.Reason != "" {
				t.Errorf("Decide() Reason = %q, want empty on retry", v.Reason)
			}
			if tt.exact {
				if v.Delay != tt.delay {
					t.Errorf("Decide() Delay = %v, want %v", v.Delay, tt.delay)
				}
				return
			}
			if v.Delay < 0 || v.Delay > tt.maxWant {
				t.Errorf("Decide() Delay = %v, want in [0, %v]", v.Delay, tt.maxWant)
			}
		})
	}
}

func TestReasonExhaustedValue(t *testing.T) {
	t.Parallel()
	if ReasonExhausted != "retries_exhausted" {
		t.Errorf("ReasonExhausted = %q", ReasonExhausted)
	}
}

func TestDecideDeterministic(t *testing.T) {
	t.Parallel()
	p := Policy{}
	r1, r2 := newTestRand(), newTestRand()
	for a := 1; a < 8; a++ {
		in := Input{Attempt: a, FirstAt: t0, Now: t0.Add(time.Duration(a) * time.Second)}
		if v1, v2 := p.Decide(in, r1), p.Decide(in, r2); v1 != v2 {
			t.Fatalf("attempt %d: same seed gave %+v and %+v", a, v1, v2)
		}
	}
}

func TestDecideNilRand(t *testing.T) {
	t.Parallel()
	p := Policy{}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				a := 1 + (g+i)%7
				v := p.Decide(Input{Attempt: a, FirstAt: t0, Now: t0}, nil)
				if !v.Retry || v.Delay < 0 || v.Delay > p.Ceiling(a) {
					t.Errorf("Decide(attempt %d, nil rand) = %+v, want retry within [0, %v]", a, v, p.Ceiling(a))
					return
				}
			}
		})
	}
	wg.Wait()
	if d := p.Backoff(3, nil); d < 0 || d > 2*time.Second {
		t.Errorf("Backoff(3, nil) = %v, want in [0, 2s]", d)
	}
}

func TestOverflowHugeAttempts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		p       Policy
		attempt int
	}{
		{"default 2^60", Policy{MaxAttempts: math.MaxInt}, 61},
		{"default 2^63", Policy{MaxAttempts: math.MaxInt}, 64},
		{"default MaxInt-1", Policy{MaxAttempts: math.MaxInt}, math.MaxInt - 1},
		{"huge base", Policy{MaxAttempts: math.MaxInt, Base: math.MaxInt64 / 2, Cap: math.MaxInt64, MaxElapsed: math.MaxInt64}, 3},
		{"max everything", Policy{MaxAttempts: math.MaxInt, Base: math.MaxInt64, Cap: math.MaxInt64, MaxElapsed: math.MaxInt64}, math.MaxInt - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := tt.p.WithDefaults()
			r := newTestRand()
			for range 1000 {
				v := tt.p.Decide(Input{Attempt: tt.attempt, FirstAt: t0, Now: t0}, r)
				if !v.Retry || v.Delay < 0 || v.Delay > d.Cap || v.Delay > d.MaxElapsed {
					t.Fatalf("Decide(attempt %d) = %+v, want retry within [0, %v]", tt.attempt, v, min(d.Cap, d.MaxElapsed))
				}
			}
			if c := tt.p.Ceiling(tt.attempt); c != d.Cap {
				t.Errorf("Ceiling(%d) = %v, want Cap %v", tt.attempt, c, d.Cap)
			}
		})
	}

	t.Run("extreme times", func(t *testing.T) {
		t.Parallel()
		p := Policy{MaxElapsed: math.MaxInt64}
		far := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
		past := time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
		// Now-FirstAt saturates at MaxInt64: budget spent, no wrap-around.
		if v := p.Decide(Input{Attempt: 1, FirstAt: past, Now: far}, newTestRand()); v.Retry {
			t.Errorf("Decide(saturated elapsed) = %+v, want exhausted", v)
		}
		// Saturated negative elapsed is clock skew: full budget, no overflow.
		if v := p.Decide(Input{Attempt: 1, FirstAt: far, Now: past}, newTestRand()); !v.Retry || v.Delay < 0 || v.Delay > BaseDefault {
			t.Errorf("Decide(negative elapsed) = %+v, want retry within [0, %v]", v, BaseDefault)
		}
	})
}

func TestWorstCase(t *testing.T) {
	t.Parallel()
	// Defaults by hand: 0.5 + 1 + 2 + 4 + 8 + 16 + 30 (capped) for attempts 1..7.
	defaultsByHand := 500*time.Millisecond + 1*time.Second + 2*time.Second + 4*time.Second +
		8*time.Second + 16*time.Second + 30*time.Second
	tests := []struct {
		name string
		p    Policy
		want time.Duration
	}{
		{"defaults", Policy{}, defaultsByHand},
		{"defaults is 61.5s", Policy{}, 61500 * time.Millisecond},
		{"one attempt never retries", Policy{MaxAttempts: 1}, 0},
		{"two attempts", Policy{MaxAttempts: 2}, 500 * time.Millisecond},
		{"long plateau at cap", Policy{MaxAttempts: 12}, 61500*time.Millisecond + 4*30*time.Second},
		{"capped by MaxElapsed", Policy{MaxAttempts: 8, MaxElapsed: 10 * time.Second}, 10 * time.Second},
		{"capped exactly at MaxElapsed", Policy{MaxElapsed: 61500 * time.Millisecond}, 61500 * time.Millisecond},
		{"capped during doubling", Policy{MaxElapsed: 3 * time.Second}, 3 * time.Second},
		{"base above cap", Policy{MaxAttempts: 4, Base: time.Minute, Cap: time.Second}, 3 * time.Second},
		{"huge MaxAttempts", Policy{MaxAttempts: math.MaxInt}, 15 * time.Minute},
		{"huge everything", Policy{MaxAttempts: math.MaxInt, MaxElapsed: math.MaxInt64, Base: time.Nanosecond, Cap: math.MaxInt64}, math.MaxInt64},
		{"huge cap not reached", Policy{MaxAttempts: 4, MaxElapsed: math.MaxInt64, Base: time.Second, Cap: math.MaxInt64}, 7 * time.Second},
		{"invalid negative elapsed", Policy{MaxElapsed: -time.Second}, 0},
		{"invalid negative base", Policy{Base: -time.Second}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.p.WorstCase(); got != tt.want {
				t.Errorf("WorstCase() = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestWorstCaseMatchesNaiveSum cross-checks the closed form against a direct
// sum of Ceiling for small, non-overflowing policies.
func TestWorstCaseMatchesNaiveSum(t *testing.T) {
	t.Parallel()
	for attempts := 1; attempts <= 40; attempts++ {
		for _, base := range []time.Duration{1, time.Millisecond, 300 * time.Millisecond, time.Second} {
			for _, capD := range []time.Duration{time.Second, 7 * time.Second, time.Hour} {
				for _, elapsed := range []time.Duration{time.Second, time.Minute, 24 * time.Hour} {
					p := Policy{MaxAttempts: attempts, MaxElapsed: elapsed, Base: base, Cap: capD}
					var sum time.Duration
					for a := 1; a < attempts; a++ {
						sum += p.Ceiling(a)
					}
					if want, got := min(sum, elapsed), p.WorstCase(); got != want {
						t.Fatalf("%+v: WorstCase() = %v, want %v", p, got, want)
					}
				}
			}
		}
	}
}
