package retry

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Defaults applied by Policy.WithDefaults to zero fields; they suit a
// message bus whose destinations recover within minutes.
const (
	// MaxAttemptsDefault is the default total number of deliveries, including the first.
	MaxAttemptsDefault = 8
	// MaxElapsedDefault is the default time budget measured from the first delivery.
	MaxElapsedDefault = 15 * time.Minute
	// BaseDefault is the default ceiling of the first retry delay, doubled on each further attempt.
	BaseDefault = 500 * time.Millisecond
	// CapDefault is the default upper bound on any jittered delay, so a single wait stays short.
	CapDefault = 30 * time.Second
)

// ReasonExhausted is the Verdict.Reason given when a message must not be
// retried because its attempt or time budget is spent.
const ReasonExhausted = "retries_exhausted"

// Policy bounds retries: attempts, elapsed time since first delivery, base
// delay and cap. The zero value is usable and means all defaults.
type Policy struct {
	// MaxAttempts is the total number of deliveries allowed, including the
	// first; 0 means MaxAttemptsDefault.
	MaxAttempts int
	// MaxElapsed is the time budget measured from the first delivery; 0
	// means MaxElapsedDefault.
	MaxElapsed time.Duration
	// Base is the backoff ceiling of the first retry, doubled per attempt; 0
	// means BaseDefault.
	Base time.Duration
	// Cap bounds every jittered delay (but not destination hints); 0 means
	// CapDefault.
	Cap time.Duration
}

// Rand is the source of randomness for jitter; *math/rand/v2.Rand satisfies
// it. It is injected so that tests and simulations are deterministic.
type Rand interface {
	// Int64N returns a uniform value in [0, n) for n > 0.
	Int64N(n int64) int64
}

// Input describes the delivery attempt that just failed, which is everything
// Decide needs to know about the message.
type Input struct {
	// Attempt is the 1-based number of the delivery attempt that just failed.
	Attempt int
	// FirstAt is when this message was first delivered; the time budget
	// counts from here.
	FirstAt time.Time
	// Now is the current time, passed in so that decisions are pure.
	Now time.Time
	// Hint is the destination's Retry-After hint; 0 (or negative) means none.
	Hint time.Duration
}

// Verdict is the outcome of Decide: retry after Delay, or give up for Reason.
type Verdict struct {
	// Retry reports whether the message should be delivered again.
	Retry bool
	// Delay is how long to wait before the next delivery; valid when Retry.
	Delay time.Duration
	// Reason says why the message is not retried (ReasonExhausted); empty
	// when Retry.
	Reason string
}

// WithDefaults returns a copy of p in which every zero field holds its
// default, so callers can set only the fields they care about.
func (p Policy) WithDefaults() Policy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = MaxAttemptsDefault
	}
	if p.MaxElapsed == 0 {
		p.MaxElapsed = MaxElapsedDefault
	}
	if p.Base == 0 {
		p.Base = BaseDefault
	}
	if p.Cap == 0 {
		p.Cap = CapDefault
	}
	return p
}

// Validate reports configuration mistakes, naming the field and its value:
// negative fields are refused, and Cap must not be below Base once defaults
// are applied. Several problems are joined into one error.
func (p Policy) Validate() error {
	var errs []error
	if p.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("retry: MaxAttempts (%d) is negative", p.MaxAttempts))
	}
	if p.MaxElapsed < 0 {
		errs = append(errs, fmt.Errorf("retry: MaxElapsed (%s) is negative", p.MaxElapsed))
	}
	if p.Base < 0 {
		errs = append(errs, fmt.Errorf("retry: Base (%s) is negative", p.Base))
	}
	if p.Cap < 0 {
		errs = append(errs, fmt.Errorf("retry: Cap (%s) is negative", p.Cap))
	}
	if d := p.WithDefaults(); d.Base > 0 && d.Cap > 0 && d.Cap < d.Base {
		errs = append(errs, fmt.Errorf("retry: Cap (%s) is below Base (%s)", d.Cap, d.Base))
	}
	return errors.Join(errs...)
}

// Decide says whether the message whose delivery Attempt just failed should be
// retried and after what delay, applying defaults to zero fields of p. A nil r
// uses a fresh private random source for this call.
//
// The message is exhausted when Attempt >= MaxAttempts, when the time budget
// MaxElapsed since FirstAt is spent, or when a positive Hint exceeds the
// remaining budget. Otherwise the delay is Hint if given (it may exceed Cap:
// the destination knows best), else Backoff(Attempt) clipped to the remaining
// budget. A Now before FirstAt (clock skew) counts as no time elapsed.
func (p Policy) Decide(in Input, r Rand) Verdict {
	p = p.WithDefaults()
	if in.Attempt >= p.MaxAttempts {
		return exhausted()
	}
	elapsed := max(in.Now.Sub(in.FirstAt), 0) // Sub saturates instead of overflowing
	if elapsed >= p.MaxElapsed {
		return exhausted()
	}
	remaining := p.MaxElapsed - elapsed // 0 <= elapsed < MaxElapsed: no overflow
	if in.Hint > 0 {
		if in.Hint <= remaining {
			return Verdict{Retry: true, Delay: in.Hint}
		}
		return exhausted()
	}
	return Verdict{Retry: true, Delay: min(p.backoff(in.Attempt, r), remaining)}
}

// Ceiling returns the upper bound of the jittered delay after the given
// attempt, min(Cap, Base·2^(attempt-1)), with defaults applied and without
// overflow for any attempt; attempts below 1 count as 1.
func (p Policy) Ceiling(attempt int) time.Duration {
	return p.WithDefaults().ceiling(attempt)
}

// Backoff draws the full-jitter delay for the given attempt: uniform over
// [0, Ceiling(attempt)] inclusive, so retries of many clients spread out. A
// nil r uses a fresh private random source for this call.
func (p Policy) Backoff(attempt int, r Rand) time.Duration {
	return p.WithDefaults().backoff(attempt, r)
}

// WorstCase is the sum of Ceiling(a) for a in 1..MaxAttempts-1, capped by
// MaxElapsed: the longest a message can keep coming back because of retries.
// Retention checks compare it with how long deduplication records are kept.
func (p Policy) WorstCase() time.Duration {
	p = p.WithDefaults()
	limit := max(p.MaxElapsed, 0)
	capD := max(p.Cap, 0)
	var sum time.Duration
	for a := 1; a < p.MaxAttempts; a++ {
		c := p.ceiling(a)
		if c == capD || c == 0 {
			// Plateau: every remaining term a..MaxAttempts-1 equals c. Multiply
			// instead of looping, which matters for huge MaxAttempts.
			n := int64(p.MaxAttempts - a)
			if c == 0 {
				return sum
			}
			if n > int64(limit-sum)/int64(c) {
				return limit
			}
			return sum + c*time.Duration(n)
		}
		sum += c // c < Cap and sum < limit: no overflow
		if sum >= limit {
			return limit
		}
	}
	return min(sum, limit)
}

// ceiling is Ceiling on a policy whose defaults are already applied.
// Non-positive Base or Cap (invalid policies) yield 0 so delays stay >= 0.
func (p Policy) ceiling(attempt int) time.Duration {
	if p.Base <= 0 || p.Cap <= 0 {
		return 0
	}
	shift := max(attempt, 1) - 1
	// Base·2^shift <= Cap  ⇔  Base <= ⌊Cap / 2^shift⌋ for integers.
	if shift >= 63 || p.Base > p.Cap>>shift {
		return p.Cap
	}
	return p.Base << shift
}

// backoff is Backoff on a policy whose defaults are already applied.
func (p Policy) backoff(attempt int, r Rand) time.Duration {
	c := p.ceiling(attempt)
	if c <= 0 {
		return 0
	}
	if r == nil {
		r = newRand()
	}
	n := int64(c) + 1 // inclusive upper bound
	if c == math.MaxInt64 {
		n = math.MaxInt64 // c+1 would overflow; losing the single top value is harmless
	}
	d := time.Duration(r.Int64N(n))
	// Guard against Rand implementations that break their contract.
	return min(max(d, 0), c)
}

// newRand returns a private source seeded from the runtime's random
// generator, created per call so the package holds no shared mutable state.
func newRand() Rand {
	return rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
}

func exhausted() Verdict {
	return Verdict{Reason: ReasonExhausted}
}
