// Package retry is a pure, deterministic retry policy for redelivered
// messages: given the attempt that just failed, it says whether to try again
// and after how long.
//
// Delays follow capped exponential backoff with full jitter:
//
//	delay = rand(0, min(cap, base·2^(attempt-1)))
//
// where rand(0, x) is uniform over [0, x] inclusive. The exponential ceiling
// backs off a struggling destination quickly, the cap keeps any single wait
// bounded, and full jitter (drawing over the whole range rather than adding a
// small random offset to a fixed delay) spreads the retries of many clients
// that failed at the same moment over time, so they do not come back in
// synchronized waves that knock the destination over again.
//
// Two budgets bound a message: the number of deliveries (Policy.MaxAttempts,
// counting the first) and the time elapsed since the first delivery
// (Policy.MaxElapsed). A destination's Retry-After hint replaces the jittered
// delay when it fits the remaining time budget, and exhausts the message when
// it does not. Policy.WorstCase reports how long retries can keep a message
// alive, which retention checks compare against storage lifetimes.
//
// The package keeps no global mutable state: randomness is injected through
// the Rand interface (a *math/rand/v2.Rand satisfies it), so tests and
// simulations are reproducible, and all arithmetic is overflow-safe.
package retry
