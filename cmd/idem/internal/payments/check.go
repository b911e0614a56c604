package payments

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idem/idemrelay"
)

// The SQL behind the verdict of the demo and chaos, so that anyone can rerun it by hand on a
// kept run (DB.SQL shows it in a dialect). The arguments are in the order of the ?s; {run_…}
// and {excused} depend on the Scope (see Scope.sql).
const (
	// qOrders: orders written by kind ('' for valid).
	qOrders = `SELECT poison, count(*) FROM {orders} WHERE run_id = ? GROUP BY poison`
	// qDuplicates: second copies enqueued on purpose (they carry a broker message id of their
	// own ending "/dup-<order>"; a key-reuse message has one ending "/reuse-<order>").
	qDuplicates = `SELECT count(*) FROM {outbox} WHERE {run_outbox} AND {broker_msg_id} LIKE '%/dup-%'`
	// qResends: re-sends of valid events with a new OccurredAt (a broker message id ending
	// "/resend-<order>").
	qResends = `SELECT count(*) FROM {outbox} WHERE {run_outbox} AND {broker_msg_id} LIKE '%/resend-%'`
	// qDoubleApplied [run]: events with more than one ledger row.
	qDoubleApplied = `SELECT count(*) FROM (SELECT event_id FROM {ledger} WHERE run_id = ?
		GROUP BY event_id HAVING count(*) > 1) AS twice`
	// qUnsettled [run, consumer, relay, consumer]: orders neither applied nor dead-lettered,
	// valid and poison. A valid order is settled by a ledger row or by a dead letter of its own
	// (not the key_reuse dead letter of the order that reused its id); a key-reuse order by a
	// key_reuse dead letter; a poison identity by a dead letter carrying its order index.
	qUnsettled = `SELECT
			COALESCE(sum(CASE WHEN o.valid THEN 1 ELSE 0 END), 0),
			COALESCE(sum(CASE WHEN o.valid THEN 0 ELSE 1 END), 0)
		FROM {orders} o WHERE ` + unsettledOrder
	// qUnsettledList [run, consumer, relay, consumer, limit]: the first unsettled orders, to name
	// them when a run does not drain.
	qUnsettledList = `SELECT o.id, o.poison, o.sent FROM {orders} o WHERE ` + unsettledOrder + ` ORDER BY o.id LIMIT ?`
	// unsettledOrder [run, consumer, relay, consumer]: order o is neither applied nor
	// dead-lettered (qUnsettled).
	unsettledOrder = `o.run_id = ?
		AND NOT (o.valid AND EXISTS (SELECT 1 FROM {ledger} l WHERE l.run_id = o.run_id AND l.event_id = o.event_id))
		AND NOT EXISTS (SELECT 1 FROM {dead_letters} d
			WHERE NOT {ident} AND d.event_id = o.event_id AND d.consumer IN (?, ?)
			AND (d.reason = 'key_reuse') = (o.poison = 'key_reuse'))
		AND NOT EXISTS (SELECT 1 FROM {dead_letters} d
			WHERE {ident} AND {dl_order} = o.id AND d.consumer = ? AND {run_dl})`
	// qNotApplied [run]: valid orders without a ledger row.
	qNotApplied = `SELECT count(*) FROM {orders} o WHERE o.run_id = ? AND o.valid
		AND NOT EXISTS (SELECT 1 FROM {ledger} l WHERE l.run_id = o.run_id AND l.event_id = o.event_id)`
	// qWrongLedger [run]: ledger rows that match no valid order (a poison message applied, or
	// the key-reuse message applied instead of the original).
	qWrongLedger = `SELECT count(*) FROM {ledger} l WHERE l.run_id = ?
		AND NOT EXISTS (SELECT 1 FROM {orders} o WHERE o.run_id = l.run_id AND o.event_id = l.event_id
			AND o.valid AND o.wallet_id = l.wallet_id AND o.amount_cents = l.amount_cents)`
	// excusedDL: dead letter d is a retries_exhausted one written during a database outage
	// longer than the retry budget, or in the grace after it (Scope.Outages). A valid event may
	// end so: the guarantee is "applied once, or a dead letter says why not".
	excusedDL = `(d.reason = 'retries_exhausted' AND EXISTS (SELECT 1 FROM {outages} x
		WHERE d.last_failed_at BETWEEN x.started_at AND x.ended_at + x.grace))`
	// exhaustedOrder [consumer]: valid order o was not applied and has an excused dead letter.
	exhaustedOrder = `(NOT EXISTS (SELECT 1 FROM {ledger} l WHERE l.run_id = o.run_id AND l.event_id = o.event_id)
		AND EXISTS (SELECT 1 FROM {dead_letters} d WHERE d.event_id = o.event_id AND d.consumer = ? AND {excused}))`
	// qExhausted [run, consumer]: valid orders not applied but dead-lettered as
	// retries_exhausted by an outage.
	qExhausted = `SELECT count(*) FROM {orders} o WHERE o.run_id = ? AND o.valid AND ` + exhaustedOrder
	// qBadBalances [run, consumer, run]: wallets whose balance is not the sum of their valid
	// orders (but those an outage dead-lettered: qExhausted).
	qBadBalances = `SELECT count(*) FROM {wallets} w
		LEFT JOIN (SELECT o.wallet_id, sum(o.amount_cents) AS total FROM {orders} o
			WHERE o.run_id = ? AND o.valid AND NOT ` + exhaustedOrder + ` GROUP BY o.wallet_id) o ON o.wallet_id = w.id
		WHERE w.run_id = ? AND w.balance_cents <> COALESCE(o.total, 0)`
	// qBadPoison [run, consumer, consumer]: poison orders without exactly one dead letter of
	// the right reason.
	qBadPoison = `SELECT count(*) FROM {orders} o WHERE o.run_id = ? AND o.poison <> ''
		AND CASE WHEN {ident}
			THEN (SELECT count(*) FROM {dead_letters} d WHERE {dl_order} = o.id AND d.consumer = ?
				AND d.reason = 'invalid_payload' AND {run_dl})
			ELSE (SELECT count(*) FROM {dead_letters} d WHERE d.event_id = o.event_id AND d.consumer = ?
				AND d.reason = CASE WHEN o.poison = 'key_reuse' THEN 'key_reuse' ELSE 'invalid_payload' END)
			END <> 1`
	// qStrayDeadLetters [consumer, relay, run, consumer, run, consumer, consumer]: dead letters
	// of the consumer and the relay that match no poison order with its reason, but those of
	// valid events an outage exhausted. A poison identity's dead letter matches by the order
	// index its message carries.
	qStrayDeadLetters = `SELECT count(*) FROM {dead_letters} d WHERE {run_dl} AND d.consumer IN (?, ?) AND NOT EXISTS (
		SELECT 1 FROM {orders} o WHERE o.run_id = ? AND o.event_id = {dl_event_id} AND o.poison <> ''
			AND NOT {ident} AND d.consumer = ?
			AND d.reason = CASE WHEN o.poison = 'key_reuse' THEN 'key_reuse' ELSE 'invalid_payload' END)
		AND NOT EXISTS (SELECT 1 FROM {orders} o WHERE o.run_id = ? AND o.id = {dl_order}
			AND {ident} AND d.consumer = ? AND d.reason = 'invalid_payload')
		AND NOT (d.consumer = ? AND {excused})`
	// qEdgeAccepted [run]: the kinds of the poison identities the outbox accepted (its Enqueue
	// must refuse them), and how many of each.
	qEdgeAccepted = `SELECT poison, count(*) FROM {orders} WHERE run_id = ? AND edge_accepted GROUP BY poison ORDER BY poison`
	// qValidDeadLettered [consumer, relay, run]: valid events with a dead letter of their own
	// (not key_reuse, not excused by an outage).
	qValidDeadLettered = `SELECT count(DISTINCT d.event_id) FROM {dead_letters} d
		WHERE {run_dl} AND d.consumer IN (?, ?) AND d.reason <> 'key_reuse' AND NOT {excused} AND EXISTS (SELECT 1 FROM {orders} o
			WHERE o.run_id = ? AND o.event_id = {dl_event_id} AND o.valid)`
	// qDeadLetters [consumer, relay]: dead letters by consumer and reason.
	qDeadLetters = `SELECT d.consumer, d.reason, count(*) FROM {dead_letters} d
		WHERE {run_dl} AND d.consumer IN (?, ?) GROUP BY d.consumer, d.reason`
	// qUnpublished: outbox rows never published, dead ones included.
	qUnpublished = `SELECT count(*) FROM {outbox} WHERE {run_outbox} AND published_at IS NULL`
	// qOutboxBacklog: outbox rows a relay still has to publish (drain progress; dead rows have
	// a dead letter).
	qOutboxBacklog = `SELECT count(*) FROM {outbox} WHERE {run_outbox} AND published_at IS NULL AND NOT dead`
	// qClaimsWithoutEffect [consumer, run]: claims of the consumer with no ledger row. Invalid
	// payloads fail validation before the claim, and a key-reuse message shares the id of an
	// applied event, so every claim must have its effect.
	qClaimsWithoutEffect = `SELECT count(*) FROM {claims} c WHERE {run_claims} AND c.consumer = ?
		AND NOT EXISTS (SELECT 1 FROM {ledger} l WHERE l.run_id = ? AND l.event_id = {claim_event_id})`
	// qEffectsWithoutClaim [run, tenant, consumer]: ledger rows with no claim of the consumer.
	qEffectsWithoutClaim = `SELECT count(*) FROM {ledger} l WHERE l.run_id = ?
		AND NOT EXISTS (SELECT 1 FROM {claims} c WHERE c.tenant = ? AND c.consumer = ? AND c.event_id = l.event_id)`
)

// Scope says which rows of idem's tables (claims, dead letters, outbox) belong to a run.
type Scope struct {
	// RunID is the run: every event id of its orders starts with RunID + "-".
	RunID string
	// Own says the run has idem's tables to itself (chaos: a schema or database per run), so
	// every row counts, poison identities' dead letters included (their ids do not start with
	// the run id). Without it only rows whose event id starts with the run's count, as when
	// demo runs share a database.
	Own bool
	// Tenant is the tenant the run's events are claimed under: "" but for events that come
	// through an authenticated channel, which names theirs (the demo's --http).
	Tenant string
	// Outages says the {outages} table exists (OutageTables): retries_exhausted dead letters
	// written in an outage's window are excused.
	Outages bool
}

// runIDRE is what a run id may be: it is pasted into the SQL of a shared-database scope.
var runIDRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)

// sql fills in the scope's fragments of q: {run_dl}, {run_claims}, {run_outbox} and {excused}.
func (s Scope) sql(q string) (string, error) {
	if !runIDRE.MatchString(s.RunID) {
		return "", fmt.Errorf("run id %q: want 1 to 64 letters, digits, '_', '.', ':' or '-'", s.RunID)
	}
	runDL, runClaims, runOutbox := "1 = 1", "1 = 1", "1 = 1"
	if !s.Own {
		prefix := s.RunID + "-"
		match := func(col string) string {
			return "substr(" + col + ", 1, " + strconv.Itoa(len(prefix)) + ") = '" + prefix + "'"
		}
		runDL, runClaims, runOutbox = match("d.event_id"), match("c.event_id"), match("event_id")
	}
	excused := "(1 = 0)"
	if s.Outages {
		excused = excusedDL
	}
	return strings.NewReplacer("{run_dl}", runDL, "{run_claims}", runClaims, "{run_outbox}", runOutbox, "{excused}", excused).Replace(q), nil
}

// Books is what the database proves about a run of the scenario: the counts behind the verdict
// of the demo and chaos alike. Every field but the counts of what was written and injected
// must be 0 (see Problems).
type Books struct {
	// Events is the number of orders written; Valid of them valid, Poison by kind.
	Events int            `json:"events"`
	Valid  int            `json:"valid"`
	Poison map[string]int `json:"poison"`
	// DuplicatesEnqueued and ResendsEnqueued count second copies and re-sends with a new
	// OccurredAt in the outbox (chaos writes them there; the demo injects its own elsewhere).
	DuplicatesEnqueued int `json:"duplicates_enqueued"`
	ResendsEnqueued    int `json:"resends_enqueued"`
	// DeadLetters counts the consumer's dead letters by reason; the relay's are keyed
	// "relay:<reason>".
	DeadLetters map[string]int `json:"dead_letters"`

	// DoubleApplied counts events with more than one ledger row.
	DoubleApplied int `json:"double_applied"`
	// Lost counts valid events with neither a ledger row nor a dead letter; LostPoison poison
	// orders without a dead letter.
	Lost       int `json:"lost"`
	LostPoison int `json:"lost_poison"`
	// NotApplied counts valid orders without a ledger row; Exhausted those of them an outage
	// dead-lettered as retries_exhausted (excused).
	NotApplied int `json:"not_applied"`
	Exhausted  int `json:"exhausted"`
	// DeadLetteredValid counts valid events with a dead letter of their own (not excused).
	DeadLetteredValid int `json:"dead_lettered_valid"`
	// WrongLedger counts ledger rows that match no valid order.
	WrongLedger int `json:"wrong_ledger"`
	// BadBalances counts wallets whose balance is not the sum of their valid orders.
	BadBalances int `json:"bad_balances"`
	// BadPoison counts poison orders without exactly one dead letter of the right reason;
	// BadIdents the poison identities among them.
	BadPoison int `json:"bad_poison"`
	BadIdents int `json:"bad_idents"`
	// StrayDeadLetters counts dead letters that match no poison order.
	StrayDeadLetters int `json:"stray_dead_letters"`
	// EdgeAccepted counts poison identities the outbox accepted, by kind.
	EdgeAccepted map[string]int `json:"edge_accepted,omitempty"`
	// Unpublished counts outbox rows never published (dead ones included).
	Unpublished int `json:"unpublished"`
	// ClaimsWithoutEffect counts claims of the consumer with no ledger row;
	// EffectsWithoutClaim ledger rows with no claim.
	ClaimsWithoutEffect int `json:"claims_without_effect"`
	EffectsWithoutClaim int `json:"effects_without_claim"`
}

// EdgeAcceptedCount is the number of poison identities the outbox accepted.
func (b Books) EdgeAcceptedCount() int {
	n := 0
	for _, c := range b.EdgeAccepted {
		n += c
	}
	return n
}

// ValidDeadLettered counts valid events dead-lettered instead of applied: not applied, not
// lost and not excused by an outage, or with a dead letter of their own.
func (b Books) ValidDeadLettered() int {
	return max(b.NotApplied-b.Lost-b.Exhausted, b.DeadLetteredValid)
}

// Problems says what the books show broken, one sentence each; none for a run that kept the
// guarantee.
func (b Books) Problems() []string {
	var p []string
	add := func(n int, f string, args ...any) {
		if n > 0 {
			p = append(p, fmt.Sprintf(f, append([]any{n}, args...)...))
		}
	}
	if b.Events == 0 {
		p = append(p, "no orders were written")
	}
	add(b.DoubleApplied, "%d events were applied more than once (several ledger rows)")
	add(b.Lost, "%d valid events were lost: neither applied nor dead-lettered")
	add(b.ValidDeadLettered(), "%d valid events were dead-lettered instead of applied")
	add(b.WrongLedger, "%d ledger rows match no valid order (a poison or key-reuse message was applied)")
	add(b.BadBalances, "%d wallets' balances differ from the sum of their valid orders")
	add(b.BadPoison, "%d poison messages were not dead-lettered exactly once with the right reason")
	if b.BadPoison == 0 {
		add(b.LostPoison, "%d poison messages have no dead letter")
	}
	add(b.StrayDeadLetters, "%d dead letters match no poison order")
	for _, k := range slices.Sorted(maps.Keys(b.DeadLetters)) {
		if strings.HasPrefix(k, idemrelay.ConsumerName+":") {
			add(b.DeadLetters[k], "the relay dead-lettered %d outbox rows (%s)", k)
		}
	}
	add(b.Unpublished, "%d outbox rows were never published")
	if n := b.EdgeAcceptedCount(); n > 0 {
		add(n, "the outbox accepted %d poison identities (%s; Enqueue must refuse them)", strings.Join(slices.Sorted(maps.Keys(b.EdgeAccepted)), ", "))
	}
	add(b.ClaimsWithoutEffect, "%d claims have no effect (no ledger row)")
	add(b.EffectsWithoutClaim, "%d ledger rows have no claim")
	return p
}

// Unsettled counts the run's orders neither applied nor dead-lettered, valid and poison.
func Unsettled(ctx context.Context, db *DB, s Scope) (valid, poison int, err error) {
	q, err := s.sql(qUnsettled)
	if err != nil {
		return 0, 0, err
	}
	err = db.Rows(ctx, q, unsettledArgs(s), func(scan func(...any) error) error {
		return scan(&valid, &poison)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("count unsettled orders: %w", err)
	}
	return valid, poison, nil
}

// unsettledArgs are the arguments of unsettledOrder: the run, and the consumers whose dead
// letters settle an order.
func unsettledArgs(s Scope) []any {
	return []any{s.RunID, ConsumerName, idemrelay.ConsumerName, ConsumerName}
}

// UnsettledOrder is an order neither applied nor dead-lettered, named when a run does not drain.
type UnsettledOrder struct {
	// ID is the order's index; Poison its kind ("" for a valid order).
	ID     int
	Poison string
	// Sent is false for a poison identity committed but not yet published to the broker.
	Sent bool
}

// String names the order, its kind and, for a poison identity not yet published, that.
func (o UnsettledOrder) String() string {
	kind := o.Poison
	if kind == "" {
		kind = "valid"
	}
	if !o.Sent {
		kind += ", never published"
	}
	return fmt.Sprintf("order %d (%s)", o.ID, kind)
}

// UnsettledOrders lists the first limit orders Unsettled counts, lowest index first.
func UnsettledOrders(ctx context.Context, db *DB, s Scope, limit int) ([]UnsettledOrder, error) {
	q, err := s.sql(qUnsettledList)
	if err != nil {
		return nil, err
	}
	var out []UnsettledOrder
	err = db.Rows(ctx, q, append(unsettledArgs(s), limit), func(scan func(...any) error) error {
		var o UnsettledOrder
		if err := scan(&o.ID, &o.Poison, &o.Sent); err != nil {
			return err
		}
		out = append(out, o)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list unsettled orders: %w", err)
	}
	return out, nil
}

// OutboxBacklog counts the run's outbox rows a relay still has to publish.
func OutboxBacklog(ctx context.Context, db *DB, s Scope) (int, error) {
	q, err := s.sql(qOutboxBacklog)
	if err != nil {
		return 0, err
	}
	n, err := db.Count(ctx, q)
	if err != nil {
		return 0, fmt.Errorf("count outbox backlog: %w", err)
	}
	return n, nil
}

// BadPoison counts the run's poison orders without exactly one dead letter of consumer with
// the right reason (a second consumer of the scenario, such as the demo's e-mail one, has its
// own).
func BadPoison(ctx context.Context, db *DB, s Scope, consumer string) (int, error) {
	q, err := s.sql(qBadPoison)
	if err != nil {
		return 0, err
	}
	n, err := db.Count(ctx, q, s.RunID, consumer, consumer)
	if err != nil {
		return 0, fmt.Errorf("check poison dead letters of %s: %w", consumer, err)
	}
	return n, nil
}

// Check reads the books of run s from db: the counts of orders and dead letters and every
// guarantee. It can be run on any finished run.
func Check(ctx context.Context, db *DB, s Scope) (Books, error) {
	b := Books{Poison: map[string]int{}, DeadLetters: map[string]int{}, EdgeAccepted: map[string]int{}}
	fail := func(what string, err error) (Books, error) {
		return b, fmt.Errorf("check run %s: %s: %w", s.RunID, what, err)
	}
	run, consumer, relay := s.RunID, ConsumerName, idemrelay.ConsumerName
	byKind := func(what, q string, args []any, dst map[string]int) error {
		q, err := s.sql(q)
		if err != nil {
			return err
		}
		return db.Rows(ctx, q, args, func(scan func(...any) error) error {
			var kind string
			var n int
			if err := scan(&kind, &n); err != nil {
				return err
			}
			dst[kind] += n
			return nil
		})
	}
	if err := byKind("count orders", qOrders, []any{run}, b.Poison); err != nil {
		return fail("count orders", err)
	}
	b.Valid = b.Poison[PoisonNone]
	delete(b.Poison, PoisonNone)
	for _, n := range b.Poison {
		b.Events += n
	}
	b.Events += b.Valid
	if err := byKind("poison identities the outbox accepted", qEdgeAccepted, []any{run}, b.EdgeAccepted); err != nil {
		return fail("poison identities the outbox accepted", err)
	}
	var err error
	if b.Lost, b.LostPoison, err = Unsettled(ctx, db, s); err != nil {
		return fail("count unsettled orders", err)
	}
	for _, c := range []struct {
		dst     *int
		what, q string
		args    []any
	}{
		{&b.DuplicatesEnqueued, "count injected duplicates", qDuplicates, nil},
		{&b.ResendsEnqueued, "count re-sends with a new OccurredAt", qResends, nil},
		{&b.DoubleApplied, "count double applications", qDoubleApplied, []any{run}},
		{&b.NotApplied, "count valid orders not applied", qNotApplied, []any{run}},
		{&b.DeadLetteredValid, "count valid events dead-lettered", qValidDeadLettered, []any{consumer, relay, run}},
		{&b.WrongLedger, "compare ledger with orders", qWrongLedger, []any{run}},
		{&b.BadBalances, "compare balances with orders", qBadBalances, []any{run, consumer, run}},
		{&b.Exhausted, "count valid orders an outage dead-lettered", qExhausted, []any{run, consumer}},
		{&b.BadIdents, "check poison identities' dead letters", qBadPoison + ` AND {ident}`, []any{run, consumer, consumer}},
		{&b.BadPoison, "check poison dead letters", qBadPoison, []any{run, consumer, consumer}},
		{&b.StrayDeadLetters, "look for stray dead letters", qStrayDeadLetters, []any{consumer, relay, run, consumer, run, consumer, consumer}},
		{&b.Unpublished, "count unpublished outbox rows", qUnpublished, nil},
		{&b.ClaimsWithoutEffect, "look for claims without effect", qClaimsWithoutEffect, []any{consumer, run}},
		{&b.EffectsWithoutClaim, "look for effects without claim", qEffectsWithoutClaim, []any{run, s.Tenant, consumer}},
	} {
		q, err := s.sql(c.q)
		if err != nil {
			return fail(c.what, err)
		}
		if *c.dst, err = db.Count(ctx, q, c.args...); err != nil {
			return fail(c.what, err)
		}
	}
	q, err := s.sql(qDeadLetters)
	if err != nil {
		return fail("count dead letters", err)
	}
	if err := db.Rows(ctx, q, []any{consumer, relay}, func(scan func(...any) error) error {
		var who, reason string
		var n int
		if err := scan(&who, &reason, &n); err != nil {
			return err
		}
		if who != consumer {
			reason = who + ":" + reason
		}
		b.DeadLetters[reason] += n
		return nil
	}); err != nil {
		return fail("count dead letters", err)
	}
	return b, nil
}
