package demo

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/idemkit/idem/cmd/idem/internal/payments"
)

// Verdict is what a demo run proved, computed from the database (the guarantees) and from the
// consumer's observer (the counters).
type Verdict struct {
	// Events is the number of orders the producer wrote (demo_orders rows of the run).
	Events int `json:"events"`
	// Deliveries counts every delivery the consumer settled, redeliveries included.
	Deliveries int `json:"deliveries"`
	// Processed counts deliveries whose effect committed.
	Processed int `json:"processed"`
	// DuplicatesIgnored counts deliveries recognised as already applied.
	DuplicatesIgnored int `json:"duplicates_ignored"`
	// Retries counts deliveries handed back to the broker for another attempt.
	Retries int `json:"retries"`
	// DeadLetteredDeliveries counts deliveries that ended in a dead letter (a redelivered copy
	// of a dead-lettered message updates the same dead letter, so it can exceed DeadLettered).
	DeadLetteredDeliveries int `json:"dead_lettered_deliveries"`
	// OtherDeliveries counts the deliveries of any other outcome (abandoned: given back without
	// a verdict, e.g. at a lease's end), so that Deliveries is the sum of the five.
	OtherDeliveries int `json:"other_deliveries"`
	// DeadLettered counts the run's dead letters by reason, from idem's dead-letter table. Dead
	// letters the relay wrote are keyed "relay:<reason>".
	DeadLettered map[string]int `json:"dead_lettered"`

	PoisonInjected     int `json:"poison_injected"`
	DuplicatesInjected int `json:"duplicates_injected"`
	// DuplicatesDroppedByBroker counts injected duplicates the broker itself dropped (JetStream
	// deduplicates a republished Nats-Msg-Id): they never reached the consumer.
	DuplicatesDroppedByBroker int `json:"duplicates_dropped_by_broker,omitempty"`
	TransientInjected         int `json:"transient_injected"`
	// LostAcksInjected counts commits whose ack was lost (a crash after commit, before ack; the
	// demo's --lost-acks): each comes back and is ignored as a duplicate.
	LostAcksInjected int `json:"lost_acks_injected"`

	// DoubleApplied counts events with more than one ledger row.
	DoubleApplied int `json:"double_applied"`
	// Lost counts valid events with neither a ledger row nor a dead letter.
	Lost int `json:"lost"`
	// BalancesOK: every wallet's balance equals the sum of its valid orders.
	BalancesOK bool `json:"balances_ok"`
	// PoisonOK: every poison message was dead-lettered exactly once, with the right reason.
	PoisonOK bool `json:"poison_ok"`
	// WrongLedger counts ledger rows that match no valid order; StrayDeadLetters dead letters
	// that match no poison order; Unpublished outbox rows never published; ClaimsWithoutEffect
	// claims with no ledger row and EffectsWithoutClaim ledger rows with no claim. Each must be
	// 0 (payments.Books, the verdict chaos reads too).
	WrongLedger         int `json:"wrong_ledger"`
	StrayDeadLetters    int `json:"stray_dead_letters"`
	Unpublished         int `json:"unpublished"`
	ClaimsWithoutEffect int `json:"claims_without_effect"`
	EffectsWithoutClaim int `json:"effects_without_claim"`

	DurationMS int64   `json:"duration_ms"`
	EventsPerS float64 `json:"events_per_s"`
	// P50MS, P95MS and P99MS are percentiles of the time from the producer's commit to the
	// consumer's commit of each processed event.
	P50MS float64 `json:"p50_ms"`
	P95MS float64 `json:"p95_ms"`
	P99MS float64 `json:"p99_ms"`

	// Store and Broker are the URLs the run used, passwords masked.
	Store  string `json:"store"`
	Broker string `json:"broker"`
	Seed   int64  `json:"seed"`
	RunID  string `json:"run_id"`

	// OK: nothing applied twice, nothing lost, balances right, poison dead-lettered, and every
	// valid event applied exactly once.
	OK bool `json:"ok"`
	// Problems says why, when OK is false.
	Problems []string `json:"problems,omitempty"`
	// Notes explain results that are not problems (duplicates the broker dropped).
	Notes []string `json:"notes,omitempty"`
	// FanOut is the e-mail consumer's half of a --fanout run (nil without).
	FanOut *FanOutVerdict `json:"fanout,omitempty"`
}

// FanOutVerdict is what a --fanout run proved of its second consumer, the e-mail consumer on a
// subscription of its own to the same topic: computed from demo_emails and its dead letters,
// with its observer's counters.
type FanOutVerdict struct {
	Consumer          string `json:"consumer"`
	Deliveries        int    `json:"deliveries"`
	Processed         int    `json:"processed"`
	DuplicatesIgnored int    `json:"duplicates_ignored"`
	CrashesInjected   int    `json:"crashes_injected"`
	// DeadLettered counts its dead letters by reason.
	DeadLettered map[string]int `json:"dead_lettered"`
	// DoubleSent counts events with more than one demo_emails row.
	DoubleSent int `json:"double_sent"`
	// Missing counts valid events without exactly one demo_emails row of their amount.
	Missing int `json:"missing"`
	// Wrong counts demo_emails rows that match no valid order.
	Wrong int `json:"wrong"`
	// PoisonOK: every poison message was dead-lettered for it exactly once, with the right reason.
	PoisonOK bool `json:"poison_ok"`
	// Problems says what failed; they are in the run's Problems too.
	Problems []string `json:"problems,omitempty"`
}

// The SQL of the e-mail consumer's half of the verdict (--fanout), so that anyone can rerun it
// by hand; the ledger's half is payments.Check's. Each takes the run id as its first argument.
const (
	// qEmailsDouble: events with more than one e-mail row (--fanout).
	qEmailsDouble = `SELECT count(*) FROM (SELECT event_id FROM {emails} WHERE run_id = ?
		GROUP BY event_id HAVING count(*) > 1) AS twice`
	// qEmailsMissing: valid orders without exactly one e-mail row of their wallet and amount.
	qEmailsMissing = `SELECT count(*) FROM {orders} o WHERE o.run_id = ? AND o.valid
		AND (SELECT count(*) FROM {emails} e WHERE e.run_id = o.run_id AND e.event_id = o.event_id
			AND e.wallet_id = o.wallet_id AND e.amount_cents = o.amount_cents) <> 1`
	// qEmailsWrong: e-mail rows that match no valid order.
	qEmailsWrong = `SELECT count(*) FROM {emails} e WHERE e.run_id = ?
		AND NOT EXISTS (SELECT 1 FROM {orders} o WHERE o.run_id = e.run_id AND o.event_id = e.event_id
			AND o.valid AND o.wallet_id = e.wallet_id AND o.amount_cents = e.amount_cents)`
	// qConsumerDeadLetters: the run's dead letters of one consumer, by reason.
	qConsumerDeadLetters = `SELECT reason, count(*) FROM {dead_letters}
		WHERE consumer = ? AND substr(event_id, 1, ?) = ? GROUP BY reason`
)

// check computes the database half of a verdict for run runID, whose events are claimed under
// tenant, with payments.Check (the books chaos reads too): everything but the observer's
// counters, the injection counts and the timings. It can be run on any finished run.
func check(ctx context.Context, db *payments.DB, runID, tenant string) (Verdict, error) {
	v := Verdict{RunID: runID, DeadLettered: map[string]int{}}
	b, err := payments.Check(ctx, db, payments.Scope{RunID: runID, Tenant: tenant})
	if err != nil {
		return v, err
	}
	v.Events, v.DoubleApplied, v.Lost, v.DeadLettered = b.Events, b.DoubleApplied, b.Lost, b.DeadLetters
	for _, n := range b.Poison {
		v.PoisonInjected += n
	}
	v.BalancesOK, v.PoisonOK = b.BadBalances == 0, b.BadPoison == 0 && b.StrayDeadLetters == 0
	v.WrongLedger, v.StrayDeadLetters, v.Unpublished = b.WrongLedger, b.StrayDeadLetters, b.Unpublished
	v.ClaimsWithoutEffect, v.EffectsWithoutClaim = b.ClaimsWithoutEffect, b.EffectsWithoutClaim
	v.Problems = b.Problems()
	v.OK = len(v.Problems) == 0
	return v, nil
}

// checkFanOut computes the database half of the e-mail consumer's verdict for run runID
// (--fanout): each valid event sent once, poison dead-lettered once, nothing else sent.
func checkFanOut(ctx context.Context, db *payments.DB, runID string) (FanOutVerdict, error) {
	v := FanOutVerdict{Consumer: emailConsumerName, DeadLettered: map[string]int{}}
	fail := func(what string, err error) (FanOutVerdict, error) {
		return v, fmt.Errorf("check run %s, consumer %s: %s: %w", runID, emailConsumerName, what, err)
	}
	var (
		poison, badPoison int
		err               error
	)
	if v.DoubleSent, err = db.Count(ctx, qEmailsDouble, runID); err != nil {
		return fail("count double sends", err)
	}
	if v.Missing, err = db.Count(ctx, qEmailsMissing, runID); err != nil {
		return fail("count valid orders not sent once", err)
	}
	if v.Wrong, err = db.Count(ctx, qEmailsWrong, runID); err != nil {
		return fail("compare e-mails with orders", err)
	}
	if poison, err = db.Count(ctx, `SELECT count(*) FROM {orders} WHERE run_id = ? AND poison <> ''`, runID); err != nil {
		return fail("count poison orders", err)
	}
	if badPoison, err = payments.BadPoison(ctx, db, payments.Scope{RunID: runID}, emailConsumerName); err != nil {
		return fail("check poison dead letters", err)
	}
	prefix := runID + "-"
	if err := db.Rows(ctx, qConsumerDeadLetters, []any{emailConsumerName, len(prefix), prefix}, func(scan func(...any) error) error {
		var reason string
		var c int
		if err := scan(&reason, &c); err != nil {
			return err
		}
		v.DeadLettered[reason] += c
		return nil
	}); err != nil {
		return fail("count dead letters", err)
	}
	v.PoisonOK = badPoison == 0
	if v.DoubleSent > 0 {
		v.Problems = append(v.Problems, fmt.Sprintf("%s: %d events were sent more than once (several demo_emails rows)", emailConsumerName, v.DoubleSent))
	}
	if v.Missing > 0 {
		v.Problems = append(v.Problems, fmt.Sprintf("%s: %d valid events were not sent exactly once", emailConsumerName, v.Missing))
	}
	if v.Wrong > 0 {
		v.Problems = append(v.Problems, fmt.Sprintf("%s: %d e-mail rows match no valid order (a poison or key-reuse message was sent)", emailConsumerName, v.Wrong))
	}
	if badPoison > 0 {
		v.Problems = append(v.Problems, fmt.Sprintf("%s: %d of %d poison messages were not dead-lettered exactly once with the right reason", emailConsumerName, badPoison, poison))
	}
	return v, nil
}

// WriteTable writes v as a short aligned table ending with "verdict: ok" or "verdict: FAILED"
// and the problems, one per line.
func (v Verdict) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, f string, args ...any) { fmt.Fprintf(tw, "%s\t"+f+"\n", append([]any{k}, args...)...) }
	row("run", "%s (seed %d)", v.RunID, v.Seed)
	row("store", "%s", v.Store)
	row("broker", "%s", v.Broker)
	row("events", "%d", v.Events)
	row("injected", "%d duplicates, %d transient failures, %d poison, %d lost acks",
		v.DuplicatesInjected, v.TransientInjected, v.PoisonInjected, v.LostAcksInjected)
	row("deliveries", "%d = %d processed + %d duplicates ignored + %d retries + %d dead-lettered + %d other",
		v.Deliveries, v.Processed, v.DuplicatesIgnored, v.Retries, v.DeadLetteredDeliveries, v.OtherDeliveries)
	row("processed", "%d", v.Processed)
	row("duplicates ignored", "%d", v.DuplicatesIgnored)
	row("retries", "%d", v.Retries)
	row("dead letters", "%s", payments.CountText(v.DeadLettered))
	row("double applied", "%d", v.DoubleApplied)
	row("lost", "%d", v.Lost)
	row("balances", "%s", payments.OKText(v.BalancesOK))
	row("poison", "%s", payments.OKText(v.PoisonOK))
	row("outbox unpublished", "%d", v.Unpublished)
	row("claims w/o effect", "%d", v.ClaimsWithoutEffect)
	row("effects w/o claim", "%d", v.EffectsWithoutClaim)
	row("throughput", "%d events in %.1f s (%.0f events/s)", v.Events, float64(v.DurationMS)/1000, v.EventsPerS)
	row("latency", "p50 %.1f ms, p95 %.1f ms, p99 %.1f ms", v.P50MS, v.P95MS, v.P99MS)
	if f := v.FanOut; f != nil {
		row("fan-out", "%s on its own subscription: %d deliveries, %d processed, %d duplicates ignored, %d lost acks",
			f.Consumer, f.Deliveries, f.Processed, f.DuplicatesIgnored, f.CrashesInjected)
		row("", "dead letters %s, double sent %d, not sent once %d, wrong %d, poison %s",
			payments.CountText(f.DeadLettered), f.DoubleSent, f.Missing, f.Wrong, payments.OKText(f.PoisonOK))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return payments.WriteVerdict(w, v.Notes, v.OK, v.Problems)
}
