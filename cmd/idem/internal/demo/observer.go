package demo

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

// tally is the consumer's idem.Observer: it counts deliveries by outcome, keeps which orders
// are settled (for progress, back-pressure and the key-reuse producer) and measures latency.
// The verdict's guarantees never come from here, only from the database.
type tally struct {
	runPrefix string
	// committed holds, per order index, the unix nanoseconds of the producer's commit.
	committed []atomic.Int64

	mu         sync.Mutex
	deliveries int
	outcomes   map[idem.Outcome]int
	processed  map[string]time.Time // event ids applied, and when
	dead       map[deadKey]struct{}
	latencies  []time.Duration

	// changed gets a token whenever an order may have settled.
	changed chan struct{}
}

type deadKey struct {
	eventID string
	reason  idem.Reason
}

var _ idem.Observer = (*tally)(nil)

func newTally(runID string, n int) *tally {
	return &tally{
		runPrefix: runID + "-",
		committed: make([]atomic.Int64, n),
		outcomes:  make(map[idem.Outcome]int),
		processed: make(map[string]time.Time, n),
		dead:      make(map[deadKey]struct{}),
		latencies: make([]time.Duration, 0, n),
		changed:   make(chan struct{}, 1),
	}
}

// Observe is called once per settled delivery, after the commit (and the ack).
func (t *tally) Observe(ev idem.Observation) {
	now := time.Now()
	t.mu.Lock()
	t.deliveries++
	t.outcomes[ev.Outcome]++
	switch ev.Outcome {
	case idem.OutcomeProcessed:
		if _, seen := t.processed[ev.EventID]; !seen {
			t.processed[ev.EventID] = now
			if at := t.commitTime(ev.EventID); at > 0 {
				t.latencies = append(t.latencies, now.Sub(time.Unix(0, at)))
			}
		}
	case idem.OutcomeDeadLettered:
		t.dead[deadKey{ev.EventID, ev.Reason}] = struct{}{}
	}
	t.mu.Unlock()
	if ev.Outcome == idem.OutcomeProcessed || ev.Outcome == idem.OutcomeDeadLettered {
		select {
		case t.changed <- struct{}{}:
		default:
		}
	}
}

// Paused is never expected: the demo dead-letters panics.
func (t *tally) Paused(string) {}

// commitTime returns the producer's commit time of the order behind eventID, or 0.
func (t *tally) commitTime(eventID string) int64 {
	rest, ok := strings.CutPrefix(eventID, t.runPrefix)
	if !ok {
		return 0
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= len(t.committed) {
		return 0
	}
	return t.committed[i].Load()
}

// settled is how many orders are applied or dead-lettered, as far as the observer saw.
func (t *tally) settled() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.processed) + len(t.dead)
}

// applied reports whether eventID's effect has committed, and when the observer heard of it.
func (t *tally) applied(eventID string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.processed[eventID]
	return at, ok
}

// counts copies the counters into v.
func (t *tally) counts(v *Verdict) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v.Deliveries = t.deliveries
	v.Processed = t.outcomes[idem.OutcomeProcessed]
	v.DuplicatesIgnored = t.outcomes[idem.OutcomeDuplicate]
	v.Retries = t.outcomes[idem.OutcomeRetried]
	v.DeadLetteredDeliveries = t.outcomes[idem.OutcomeDeadLettered]
	v.OtherDeliveries = t.deliveries - v.Processed - v.DuplicatesIgnored - v.Retries - v.DeadLetteredDeliveries
	lat := slices.Clone(t.latencies)
	slices.Sort(lat)
	v.P50MS, v.P95MS, v.P99MS = percentile(lat, 50), percentile(lat, 95), percentile(lat, 99)
}

// percentile returns the nearest-rank p-th percentile of sorted in milliseconds (0 if empty).
func percentile(sorted []time.Duration, p int) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	i = min(max(i, 1), len(sorted)) - 1
	return float64(sorted[i].Microseconds()) / 1000
}
