package chaos

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/cmd/idem/internal/payments"
)

// Report is what a chaos run did and what the database proves about it. The guarantee fields
// (DoubleApplied, Lost, …, Violations) come from the database alone (see verdict.go); the
// chaos counters from the harness; the delivery counters from the roles' stat lines, which a
// SIGKILL may cut short by a line or two, so they are a lower bound.
type Report struct {
	RunID string `json:"run_id"`
	// Store is the dialect of the run's database (postgres, mysql); Schema its schema
	// (PostgreSQL) or database (MySQL) of its own.
	Store  string `json:"store"`
	Schema string `json:"schema"`
	Seed   int64  `json:"seed"`
	// ChaosMS is how long the chaos phase ran; DrainMS how long the system took to drain after.
	ChaosMS int64 `json:"chaos_ms"`
	DrainMS int64 `json:"drain_ms"`

	// Events is the number of orders the producer committed (demo_orders rows); Valid of them
	// valid, Poison by kind.
	Events int            `json:"events"`
	Valid  int            `json:"valid"`
	Poison map[string]int `json:"poison"`
	// DuplicatesInjected counts second copies enqueued in the outbox.
	DuplicatesInjected int `json:"duplicates_injected"`
	// TransientInjected counts first attempts the handler failed on purpose.
	TransientInjected int `json:"transient_injected"`

	// Kills counts SIGKILLs sent, by role in KillsByRole; Restarts the role processes started
	// again after one.
	Kills       int            `json:"kills"`
	KillsByRole map[string]int `json:"kills_by_role"`
	Restarts    int            `json:"restarts"`
	// Cuts counts drops of every database connection; Stalls the times the proxy stopped
	// copying bytes for a while.
	Cuts   int `json:"cuts"`
	Stalls int `json:"stalls"`
	// NATSRestarts counts restarts of the NATS server.
	NATSRestarts int `json:"nats_restarts"`
	// Broker is the broker the run used (BrokerNATS, BrokerAMQP, BrokerRedis); BrokerKills
	// counts the times the harness closed the run's connections on RabbitMQ or Redis, and
	// BrokerConnsKilled the connections it closed.
	Broker            string `json:"broker"`
	BrokerKills       int    `json:"broker_kills"`
	BrokerConnsKilled int    `json:"broker_conns_killed"`
	// BrokerStalls and BrokerCuts count the times the harness's proxy stalled the run's broker
	// connections, or cut them and refused new ones for a while.
	BrokerStalls int `json:"broker_stalls"`
	BrokerCuts   int `json:"broker_cuts"`
	// UnexpectedExits counts role processes that exited without being killed.
	UnexpectedExits int `json:"unexpected_exits"`

	// Processed, DuplicatesIgnored, Retries and Abandoned count deliveries by outcome, as the
	// consumers reported them.
	Processed         int `json:"processed"`
	DuplicatesIgnored int `json:"duplicates_ignored"`
	Retries           int `json:"retries"`
	Abandoned         int `json:"abandoned"`
	// DeadLetters counts dead letters by reason, from the dead-letter table; the relay's are
	// keyed "relay:<reason>".
	DeadLetters map[string]int `json:"dead_letters"`

	// DoubleApplied counts events with more than one ledger row.
	DoubleApplied int `json:"double_applied"`
	// Lost counts valid events with neither a ledger row nor a dead letter.
	Lost int `json:"lost"`
	// DeadLetteredValid counts valid events dead-lettered instead of applied.
	DeadLetteredValid int `json:"dead_lettered_valid"`
	// WrongLedger counts ledger rows that match no valid order (a poison message applied).
	WrongLedger int `json:"wrong_ledger"`
	// BadBalances counts wallets whose balance is not the sum of their valid orders.
	BadBalances int `json:"bad_balances"`
	// BadPoison counts poison orders without exactly one dead letter of the right reason.
	BadPoison int `json:"bad_poison"`
	// StrayDeadLetters counts dead letters that match no poison order.
	StrayDeadLetters int `json:"stray_dead_letters"`
	// Unpublished counts outbox rows never published (dead ones included).
	Unpublished int `json:"unpublished"`
	// ClaimsWithoutEffect counts claims of the consumer with no ledger row; EffectsWithoutClaim
	// ledger rows with no claim.
	ClaimsWithoutEffect int `json:"claims_without_effect"`
	EffectsWithoutClaim int `json:"effects_without_claim"`

	// OrderViolations counts valid orders that reached the stream after a later order of their
	// wallet (the key of their events): the relay broke per-key order. It is read from the
	// stream itself after the drain.
	OrderViolations int `json:"order_violations"`
	// OrderNotChecked says the broker could not be read back (a RabbitMQ queue), so
	// OrderViolations means nothing.
	OrderNotChecked bool `json:"order_not_checked,omitempty"`
	// ApplyOrderInversions counts ledger rows committed after a later order of their wallet.
	// The consumers apply concurrently and retry failures later, so this is information: idem
	// keeps per-key order at the relay, not at the consumers.
	ApplyOrderInversions int `json:"apply_order_inversions"`

	// Faults reports each fault class the run injected: what, how many times, and the verdict
	// counts the class bears on.
	Faults map[string]FaultClass `json:"fault_classes"`

	// The counts behind Faults: the harness's (outages, outageTime, dlWindows) and the
	// verdict's.
	outages                             int
	outageTime                          time.Duration
	dlWindows                           int
	lostPoison, exhausted, edgeAccepted int
	resends, dlRefused, badIdents       int
	validDeadLettered                   int

	// OK: no violation.
	OK bool `json:"ok"`
	// Violations says what broke, one sentence each.
	Violations []string `json:"violations,omitempty"`
	// Notes explain results that are not violations.
	Notes []string `json:"notes,omitempty"`
}

// FaultClass is what the run did for one class of fault and what the verdict says about it.
type FaultClass struct {
	// Injected says what the class injects, in a sentence.
	Injected string `json:"injected"`
	// Count is how many times it was injected.
	Count int `json:"count"`
	// Detail breaks Count down (by kind), when the class has kinds.
	Detail map[string]int `json:"detail,omitempty"`
	// Verdict holds the verdict counts the class bears on; each must be 0 unless its name
	// says otherwise (e.g. "…_info").
	Verdict map[string]int `json:"verdict"`
}

// WriteTable writes r as an aligned table ending with "verdict: ok" or "verdict: FAILED" and
// the violations, one per line.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, f string, args ...any) { fmt.Fprintf(tw, "%s\t"+f+"\n", append([]any{k}, args...)...) }
	row("run", "%s (seed %d, %s %s)", r.RunID, r.Seed, r.Store, r.Schema)
	row("duration", "%.1f s of chaos, %.1f s to drain", float64(r.ChaosMS)/1000, float64(r.DrainMS)/1000)
	row("events", "%d (%d valid, poison: %s)", r.Events, r.Valid, payments.CountText(r.Poison))
	row("injected", "%d duplicates, %d transient failures", r.DuplicatesInjected, r.TransientInjected)
	row("kills", "%d (%s), %d restarts", r.Kills, payments.CountText(r.KillsByRole), r.Restarts)
	row("database", "%d cuts, %d stalls", r.Cuts, r.Stalls)
	if r.Broker == BrokerNATS || r.Broker == "" {
		row("nats restarts", "%d", r.NATSRestarts)
	} else {
		row("broker", "%s: %d connection kills (%d connections closed), %d stalls, %d cuts", r.Broker, r.BrokerKills, r.BrokerConnsKilled, r.BrokerStalls, r.BrokerCuts)
	}
	row("unexpected exits", "%d", r.UnexpectedExits)
	row("processed", "%d", r.Processed)
	row("duplicates ignored", "%d", r.DuplicatesIgnored)
	row("retries", "%d", r.Retries)
	row("abandoned", "%d", r.Abandoned)
	row("dead letters", "%s", payments.CountText(r.DeadLetters))
	row("double applied", "%d", r.DoubleApplied)
	row("lost", "%d", r.Lost)
	row("balances", "%s", payments.OKText(r.BadBalances == 0))
	row("poison", "%s", payments.OKText(r.BadPoison == 0 && r.StrayDeadLetters == 0))
	row("outbox unpublished", "%d", r.Unpublished)
	row("claims w/o effect", "%d", r.ClaimsWithoutEffect)
	row("effects w/o claim", "%d", r.EffectsWithoutClaim)
	if r.OrderNotChecked {
		row("order violations", "not checked (%d apply-order inversions, information)", r.ApplyOrderInversions)
	} else {
		row("order violations", "%d (%d apply-order inversions, information)", r.OrderViolations, r.ApplyOrderInversions)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Faults)) {
		f := r.Faults[k]
		row("fault "+k, "%d injected (%s); verdict: %s", f.Count, payments.CountText(f.Detail), payments.CountText(f.Verdict))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return payments.WriteVerdict(w, r.Notes, r.OK, r.Violations)
}

// buildFaults fills r.Faults from the counts the harness and the verdict gathered; counters are
// the roles' (sink_refused: messages the relays' broker refused; paused_restart: consumers that
// paused themselves and were started again), budget the consumers' retry budget, inboxBucket
// the claims table's partition width (0: plain table).
func (r *Report) buildFaults(counters map[string]int, budget, inboxBucket time.Duration) {
	idents := map[string]int{}
	n := 0
	for kind, c := range r.Poison {
		if payments.IsIdent(kind) {
			idents[kind] = c
			n += c
		}
	}
	r.Faults = map[string]FaultClass{
		"db_outage": {
			Injected: fmt.Sprintf("every database connection cut, new ones refused, for longer than the consumers' retry budget (%v)", budget),
			Count:    r.outages,
			Detail:   map[string]int{"seconds_down": int(r.outageTime.Seconds())},
			Verdict: map[string]int{"lost": r.Lost, "double_applied": r.DoubleApplied,
				"valid_dead_lettered": r.validDeadLettered, "retries_exhausted_after_outage_info": r.exhausted},
		},
		"dead_letter_write_failures": {
			Injected: "windows in which a trigger refuses every dead-letter write (SQLSTATE 53100; error 1041 on MySQL)",
			Count:    r.dlWindows,
			Detail:   map[string]int{"refused_writes": r.dlRefused, "consumer_pauses": counters["paused_restart"]},
			Verdict: map[string]int{"bad_poison": r.BadPoison, "poison_without_dead_letter": r.lostPoison,
				"stray_dead_letters": r.StrayDeadLetters, "lost": r.Lost},
		},
		"poison_identities": {
			Injected: "events published straight to the stream with a blank, whitespace-only, control-character, NUL, invalid UTF-8, 3 KB or 12 KB id or a 10 KB tenant (and offered to the outbox first, CR/LF too)",
			Count:    n,
			Detail:   idents,
			Verdict: map[string]int{"not_one_invalid_payload_dead_letter": r.badIdents,
				"accepted_by_the_outbox": r.edgeAccepted, "wrong_ledger": r.WrongLedger},
		},
		"resent_occurred_at": {
			Injected: "valid events enqueued again with the same id and payload and OccurredAt moved by 1 to 72 hours either way",
			Count:    r.resends,
			Detail:   map[string]int{"inbox_bucket_hours": int(inboxBucket.Hours())},
			Verdict:  map[string]int{"double_applied": r.DoubleApplied, "valid_dead_lettered": r.validDeadLettered},
		},
	}
	if r.Broker == BrokerNATS || r.Broker == "" {
		r.Faults["sink_refusals"] = FaultClass{
			Injected: "the broker refuses one message of a pipelined batch (its PubAck fails, the rest of the batch goes on)",
			Count:    counters["sink_refused"],
			Verdict:  map[string]int{"order_violations": r.OrderViolations, "unpublished": r.Unpublished},
		}
	} else {
		verdict := map[string]int{"lost": r.Lost, "double_applied": r.DoubleApplied}
		if !r.OrderNotChecked {
			verdict["order_violations"] = r.OrderViolations
		}
		r.Faults["broker_connection_kills"] = FaultClass{
			Injected: "the run's connections to the broker closed from the server's side (rabbitmqctl close_connection, CLIENT KILL ID)",
			Count:    r.BrokerKills,
			Detail:   map[string]int{"connections_closed": r.BrokerConnsKilled},
			Verdict:  verdict,
		}
		r.Faults["broker_stalls_and_cuts"] = FaultClass{
			Injected: "the run's broker connections stalled (no byte moves, as under DEBUG SLEEP), or cut with new ones refused (as in a restart), through the harness's proxy",
			Count:    r.BrokerStalls + r.BrokerCuts,
			Detail:   map[string]int{"stalls": r.BrokerStalls, "cuts": r.BrokerCuts},
			Verdict:  verdict,
		}
	}
}
