package idem

import "time"

// Outcome is how a delivery was settled.
type Outcome string

// The outcomes of one delivery.
const (
	// OutcomeProcessed: the claim and the handler's effect committed.
	OutcomeProcessed Outcome = "processed"
	// OutcomeDuplicate: the key was already claimed with the same fingerprint; nothing applied.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeKeyReuse: the key was claimed with another fingerprint; nothing applied.
	OutcomeKeyReuse Outcome = "key_reuse"
	// OutcomeFailed: the handler or the database failed; everything rolled back.
	OutcomeFailed Outcome = "failed"
	// OutcomeRetried: failed and handed back to the broker for a later attempt.
	OutcomeRetried Outcome = "retried"
	// OutcomeDeadLettered: failed for good and recorded in the dead-letter queue.
	OutcomeDeadLettered Outcome = "dead_lettered"
	// OutcomeAbandoned: left to the broker without a verdict (shutdown, lost lease, pause).
	OutcomeAbandoned Outcome = "abandoned"
)

// Event describes one settled delivery, for metrics. It carries no payload.
type Event struct {
	Consumer  string
	Queue     string
	Tenant    string
	EventID   string
	Attempt   int
	Outcome   Outcome
	ErrorType Class
	// Reason is set when Outcome is OutcomeDeadLettered.
	Reason Reason
	// Delay is the retry delay when Outcome is OutcomeRetried.
	Delay    time.Duration
	Duration time.Duration
	// Recovered holds, for a processed replay of dead letters, the time from each dead letter's
	// first failure to this recovery.
	Recovered []time.Duration
}

// Observer receives events from a consumer; package idemprom turns them into Prometheus
// metrics. Implementations must be safe for concurrent use and must not block.
type Observer interface {
	Observe(Event)
	// Paused is called when the consumer pauses itself after a handler bug.
	Paused(consumer string)
}
