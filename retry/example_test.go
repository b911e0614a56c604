package retry_test

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idemkit/idem/retry"
)

func ExamplePolicy_Decide() {
	p := retry.Policy{MaxAttempts: 4, MaxElapsed: time.Minute, Base: time.Second, Cap: 10 * time.Second}
	r := rand.New(rand.NewPCG(1, 2)) // seeded: the jittered delays are reproducible
	first := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

	for attempt := 1; attempt <= 4; attempt++ {
		v := p.Decide(retry.Input{Attempt: attempt, FirstAt: first, Now: first.Add(5 * time.Second)}, r)
		fmt.Printf("attempt %d: retry=%v delay=%v ceiling=%v reason=%q\n",
			attempt, v.Retry, v.Delay, p.Ceiling(attempt), v.Reason)
	}

	// A Retry-After hint wins when it fits the remaining budget (55s here),
	// even above Cap...
	v := p.Decide(retry.Input{Attempt: 1, FirstAt: first, Now: first.Add(5 * time.Second), Hint: 20 * time.Second}, r)
	fmt.Printf("hint 20s: retry=%v delay=%v\n", v.Retry, v.Delay)
	// ...and exhausts the message when it does not.
	v = p.Decide(retry.Input{Attempt: 1, FirstAt: first, Now: first.Add(5 * time.Second), Hint: time.Hour}, r)
	fmt.Printf("hint 1h: retry=%v reason=%q\n", v.Retry, v.Reason)
	fmt.Println("worst case:", p.WorstCase())
	// Output:
	// attempt 1: retry=true delay=769.37327ms ceiling=1s reason=""
	// attempt 2: retry=true delay=1.232872448s ceiling=2s reason=""
	// attempt 3: retry=true delay=3.137712007s ceiling=4s reason=""
	// attempt 4: retry=false delay=0s ceiling=8s reason="retries_exhausted"
	// hint 20s: retry=true delay=20s
	// hint 1h: retry=false reason="retries_exhausted"
	// worst case: 7s
}
