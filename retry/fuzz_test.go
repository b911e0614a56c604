package retry

import (
	"math/rand/v2"
	"testing"
	"time"
)

// FuzzDecide checks Decide's invariants over arbitrary, possibly invalid,
// policies and inputs: the delay is never negative, never above Cap unless
// hinted, never above the remaining budget, and the message is exhausted
// exactly when a budget is spent. A seed of 0 exercises the nil Rand path.
func FuzzDecide(f *testing.F) {
	f.Add(3, 8, int64(15*time.Minute), int64(500*time.Millisecond), int64(30*time.Second), int64(time.Second), int64(0), uint64(1))
	f.Add(8, 8, int64(0), int64(0), int64(0), int64(0), int64(0), uint64(2))
	f.Add(1, 0, int64(time.Minute), int64(time.Second), int64(10*time.Second), int64(20*time.Second), int64(40*time.Second), uint64(3))
	f.Fuzz(func(t *testing.T, attempt, maxAttempts int, maxElapsed, base, capD, elapsed, hint int64, seed uint64) {
		p := Policy{
			MaxAttempts: maxAttempts,
			MaxElapsed:  time.Duration(maxElapsed),
			Base:        time.Duration(base),
			Cap:         time.Duration(capD),
		}
		in := Input{
			Attempt: attempt,
			FirstAt: t0,
			Now:     t0.Add(time.Duration(elapsed)),
			Hint:    time.Duration(hint),
		}
		var r Rand
		if seed != 0 {
			r = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		}
		v := p.Decide(in, r)

		eff := p.WithDefaults()
		el := max(in.Now.Sub(in.FirstAt), 0)
		spent := attempt >= eff.MaxAttempts || el >= eff.MaxElapsed
		var remaining time.Duration
		if !spent {
			remaining = eff.MaxElapsed - el
			spent = in.Hint > 0 && in.Hint > remaining
		}

		if wc := p.WorstCase(); wc < 0 || wc > max(eff.MaxElapsed, 0) {
			t.Fatalf("WorstCase() = %v outside [0, MaxElapsed %v]", wc, eff.MaxElapsed)
		}
		if v.Retry == spent {
			t.Fatalf("Decide(%+v, %+v) = %+v; budget spent = %v", p, in, v, spent)
		}
		if !v.Retry {
			if v.Reason != ReasonExhausted || v.Delay != 0 {
				t.Fatalf("exhausted verdict %+v, want {Reason: %q, Delay: 0}", v, ReasonExhausted)
			}
			return
		}
		if v.Reason != "" {
			t.Fatalf("retry verdict %+v has a reason", v)
		}
		if v.Delay < 0 {
			t.Fatalf("negative delay %v", v.Delay)
		}
		if v.Delay > remaining {
			t.Fatalf("delay %v above remaining budget %v", v.Delay, remaining)
		}
		if in.Hint > 0 {
			if v.Delay != in.Hint {
				t.Fatalf("delay %v, want hint %v", v.Delay, in.Hint)
			}
			return
		}
		if v.Delay > max(eff.Cap, 0) || v.Delay > p.Ceiling(attempt) {
			t.Fatalf("unhinted delay %v above cap %v or ceiling %v", v.Delay, eff.Cap, p.Ceiling(attempt))
		}
	})
}
