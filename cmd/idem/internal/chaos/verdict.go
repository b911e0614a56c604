package chaos

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/idemrelay"
)

// The SQL behind the verdict, so that anyone can rerun it by hand on a kept schema (--keep).
// $1 is the run id and $2 the consumer name wherever they appear.
const (
	// qOrders: orders written by kind.
	qOrders = `SELECT poison, count(*) FROM {orders} WHERE run_id = $1 GROUP BY poison`
	// qDuplicates: second copies enqueued on purpose (they carry a broker message id of their
	// own ending "/dup-<order>"; a key-reuse message has one ending "/reuse-<order>").
	qDuplicates = `SELECT count(*) FROM {outbox} WHERE headers->>'Idem-Broker-Msg-Id' LIKE '%/dup-%'`
	// qDoubleApplied: events with more than one ledger row.
	qDoubleApplied = `SELECT count(*) FROM (SELECT event_id FROM {ledger} WHERE run_id = $1
		GROUP BY event_id HAVING count(*) > 1) AS twice`
	// qUnsettled: orders neither applied nor dead-lettered, valid and poison. A valid order is
	// settled by a ledger row or by a dead letter of its own (not the key_reuse dead letter of
	// the order that reused its id); a key-reuse order by a key_reuse dead letter.
	qUnsettled = `SELECT
			COALESCE(sum(CASE WHEN o.valid THEN 1 ELSE 0 END), 0),
			COALESCE(sum(CASE WHEN o.valid THEN 0 ELSE 1 END), 0)
		FROM {orders} o
		WHERE o.run_id = $1
		AND NOT (o.valid AND EXISTS (SELECT 1 FROM {ledger} l WHERE l.run_id = o.run_id AND l.event_id = o.event_id))
		AND NOT EXISTS (SELECT 1 FROM {dead_letters} d
			WHERE NOT {ident} AND d.event_id = o.event_id AND d.consumer IN ($2, $3)
			AND (d.reason = 'key_reuse') = (o.poison = 'key_reuse'))
		AND NOT EXISTS (SELECT 1 FROM {dead_letters} d
			WHERE {ident} AND {dl_order} = o.id AND d.consumer = $2)`
	// qNotApplied: valid orders without a ledger row.
	qNotApplied = `SELECT count(*) FROM {orders} o WHERE o.run_id = $1 AND o.valid
		AND NOT EXISTS (SELECT 1 FROM {ledger} l WHERE l.run_id = o.run_id AND l.event_id = o.event_id)`
	// qWrongLedger: ledger rows that match no valid order (a poison message applied, or the
	// key-reuse message applied instead of the original).
	qWrongLedger = `SELECT count(*) FROM {ledger} l WHERE l.run_id = $1
		AND NOT EXISTS (SELECT 1 FROM {orders} o WHERE o.run_id = l.run_id AND o.event_id = l.event_id
			AND o.valid AND o.wallet_id = l.wallet_id AND o.amount_cents = l.amount_cents)`
	// excusedDL: dead letter d is a retries_exhausted one written during a database outage
	// longer than the retry budget, or in the grace after it. A valid event may end so: the
	// guarantee is "applied once, or a dead letter says why not".
	excusedDL = `(d.reason = 'retries_exhausted' AND EXISTS (SELECT 1 FROM {outages} x
		WHERE d.last_failed_at BETWEEN x.started_at AND x.ended_at + x.grace))`
	// exhaustedOrder: valid order o was not applied and has an excused dead letter.
	exhaustedOrder = `(NOT EXISTS (SELECT 1 FROM {ledger} l WHERE l.run_id = o.run_id AND l.event_id = o.event_id)
		AND EXISTS (SELECT 1 FROM {dead_letters} d WHERE d.event_id = o.event_id AND d.consumer = $2 AND ` + excusedDL + `))`
	// qExhausted: valid orders not applied but dead-lettered as retries_exhausted by an outage.
	qExhausted = `SELECT count(*) FROM {orders} o WHERE o.run_id = $1 AND o.valid AND ` + exhaustedOrder
	// qBadBalances: wallets whose balance is not the sum of their valid orders (but those an
	// outage dead-lettered: qExhausted).
	qBadBalances = `SELECT count(*) FROM {wallets} w
		LEFT JOIN (SELECT o.wallet_id, sum(o.amount_cents) AS total FROM {orders} o
			WHERE o.run_id = $1 AND o.valid AND NOT ` + exhaustedOrder + ` GROUP BY o.wallet_id) o ON o.wallet_id = w.id
		WHERE w.run_id = $1 AND w.balance_cents <> COALESCE(o.total, 0)`
	// qBadPoison: poison orders without exactly one dead letter of the right reason.
	qBadPoison = `SELECT count(*) FROM {orders} o WHERE o.run_id = $1 AND o.poison <> ''
		AND CASE WHEN {ident}
			THEN (SELECT count(*) FROM {dead_letters} d WHERE {dl_order} = o.id AND d.consumer = $2
				AND d.reason = 'invalid_payload')
			ELSE (SELECT count(*) FROM {dead_letters} d WHERE d.event_id = o.event_id AND d.consumer = $2
				AND d.reason = CASE WHEN o.poison = 'key_reuse' THEN 'key_reuse' ELSE 'invalid_payload' END)
			END <> 1`
	// qStrayDeadLetters: dead letters (of anyone: the consumer, the relay) that match no poison
	// order with its reason, but those of valid events an outage exhausted. A poison
	// identity's dead letter matches by the order index its message carries.
	qStrayDeadLetters = `SELECT count(*) FROM {dead_letters} d WHERE NOT EXISTS (
		SELECT 1 FROM {orders} o WHERE o.run_id = $1 AND o.event_id = d.event_id AND o.poison <> ''
			AND NOT {ident} AND d.consumer = $2
			AND d.reason = CASE WHEN o.poison = 'key_reuse' THEN 'key_reuse' ELSE 'invalid_payload' END)
		AND NOT EXISTS (SELECT 1 FROM {orders} o WHERE o.run_id = $1 AND o.id = {dl_order}
			AND {ident} AND d.consumer = $2 AND d.reason = 'invalid_payload')
		AND NOT (d.consumer = $2 AND ` + excusedDL + `)`
	// qEdgeAccepted: poison identities the outbox accepted (its Enqueue must refuse them).
	qEdgeAccepted = `SELECT count(*) FROM {orders} WHERE run_id = $1 AND edge_accepted`
	// qEdgeAcceptedKinds: the kinds of the poison identities the outbox accepted.
	qEdgeAcceptedKinds = `SELECT COALESCE(string_agg(DISTINCT poison, ', ' ORDER BY poison), '')
		FROM {orders} WHERE run_id = $1 AND edge_accepted`
	// qValidDeadLettered: valid events with a dead letter of their own (not key_reuse).
	qValidDeadLettered = `SELECT count(DISTINCT d.event_id) FROM {dead_letters} d
		WHERE d.reason <> 'key_reuse' AND NOT ` + excusedDL + ` AND EXISTS (SELECT 1 FROM {orders} o
			WHERE o.run_id = $1 AND o.event_id = d.event_id AND o.valid)`
	// qResends: re-sends of valid events with a new OccurredAt (a broker message id ending
	// "/resend-<order>").
	qResends = `SELECT count(*) FROM {outbox} WHERE headers->>'Idem-Broker-Msg-Id' LIKE '%/resend-%'`
	// qDeadLettersRefused: dead-letter writes the chaos trigger refused.
	qDeadLettersRefused = `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {dl_refused}`
	// qDeadLetters: dead letters by consumer and reason.
	qDeadLetters = `SELECT consumer, reason, count(*) FROM {dead_letters} GROUP BY consumer, reason`
	// qUnpublished: outbox rows never published, dead ones included.
	qUnpublished = `SELECT count(*) FROM {outbox} WHERE published_at IS NULL`
	// qOutboxBacklog: outbox rows a relay still has to publish (drain progress).
	qOutboxBacklog = `SELECT count(*) FROM {outbox} WHERE published_at IS NULL AND NOT dead`
	// qClaimsWithoutEffect: claims of the consumer with no ledger row. Invalid payloads fail
	// validation before the claim, and a key-reuse message shares the id of an applied event,
	// so every claim must have its effect.
	qClaimsWithoutEffect = `SELECT count(*) FROM {claims} c WHERE c.consumer = $2
		AND NOT EXISTS (SELECT 1 FROM {ledger} l WHERE l.run_id = $1 AND l.event_id = c.event_id)`
	// qEffectsWithoutClaim: ledger rows with no claim of the consumer.
	qEffectsWithoutClaim = `SELECT count(*) FROM {ledger} l WHERE l.run_id = $1
		AND NOT EXISTS (SELECT 1 FROM {claims} c WHERE c.tenant = '' AND c.consumer = $2 AND c.event_id = l.event_id)`
)

// drainState counts what is left to do: orders not yet settled and outbox rows not yet
// published.
type drainState struct {
	unsettled, outbox int
}

func readDrainState(ctx context.Context, pool *pgxpool.Pool, t tables, runID string) (drainState, error) {
	var d drainState
	var valid, poison int
	if err := pool.QueryRow(ctx, t.sql(qUnsettled), runID, payments.ConsumerName, idemrelay.ConsumerName).Scan(&valid, &poison); err != nil {
		return d, fmt.Errorf("count unsettled orders: %w", err)
	}
	d.unsettled = valid + poison
	if err := pool.QueryRow(ctx, t.sql(qOutboxBacklog)).Scan(&d.outbox); err != nil {
		return d, fmt.Errorf("count outbox backlog: %w", err)
	}
	return d, nil
}

// check fills the database half of r for run runID in schema t: the counts of orders and
// dead letters and every guarantee, with a violation for each that does not hold.
func check(ctx context.Context, pool *pgxpool.Pool, t tables, runID string, r *Report) error {
	count := func(what, q string, args ...any) (int, error) {
		var n int
		if err := pool.QueryRow(ctx, t.sql(q), args...).Scan(&n); err != nil {
			return 0, fmt.Errorf("check run %s: %s: %w", runID, what, err)
		}
		return n, nil
	}
	// The tables grew fast during the run; fresh statistics keep the anti-joins below on their
	// indexes instead of nested scans (a 10-minute run's checks otherwise time out).
	if _, err := pool.Exec(ctx, t.sql(`ANALYZE {orders}, {ledger}, {claims}, {dead_letters}, {outbox}`)); err != nil {
		return fmt.Errorf("check run %s: analyze: %w", runID, err)
	}
	r.Poison = map[string]int{}
	rows, err := pool.Query(ctx, t.sql(qOrders), runID)
	if err != nil {
		return fmt.Errorf("check run %s: count orders: %w", runID, err)
	}
	r.Events, r.Valid = 0, 0
	for rows.Next() {
		var kind string
		var n int
		if err := rows.Scan(&kind, &n); err != nil {
			rows.Close()
			return fmt.Errorf("check run %s: count orders: %w", runID, err)
		}
		r.Events += n
		if kind == payments.PoisonNone {
			r.Valid += n
		} else {
			r.Poison[kind] += n
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check run %s: count orders: %w", runID, err)
	}

	var notApplied int
	lostPoison, exhausted, edgeAccepted, resends, dlRefused := &r.lostPoison, &r.exhausted, &r.edgeAccepted, &r.resends, &r.dlRefused
	if err := pool.QueryRow(ctx, t.sql(qUnsettled), runID, payments.ConsumerName, idemrelay.ConsumerName).Scan(&r.Lost, lostPoison); err != nil {
		return fmt.Errorf("check run %s: count unsettled orders: %w", runID, err)
	}
	for _, c := range []struct {
		dst     *int
		what, q string
		args    []any
	}{
		{&r.DuplicatesInjected, "count injected duplicates", qDuplicates, nil},
		{&r.DoubleApplied, "count double applications", qDoubleApplied, []any{runID}},
		{&notApplied, "count valid orders not applied", qNotApplied, []any{runID}},
		{&r.DeadLetteredValid, "count valid events dead-lettered", qValidDeadLettered, []any{runID}},
		{&r.WrongLedger, "compare ledger with orders", qWrongLedger, []any{runID}},
		{&r.BadBalances, "compare balances with orders", qBadBalances, []any{runID, payments.ConsumerName}},
		{exhausted, "count valid orders an outage dead-lettered", qExhausted, []any{runID, payments.ConsumerName}},
		{edgeAccepted, "count poison identities the outbox accepted", qEdgeAccepted, []any{runID}},
		{resends, "count re-sends with a new OccurredAt", qResends, nil},
		{dlRefused, "count refused dead-letter writes", qDeadLettersRefused, nil},
		{&r.badIdents, "check poison identities' dead letters", qBadPoison + ` AND {ident}`, []any{runID, payments.ConsumerName}},
		{&r.BadPoison, "check poison dead letters", qBadPoison, []any{runID, payments.ConsumerName}},
		{&r.StrayDeadLetters, "look for stray dead letters", qStrayDeadLetters, []any{runID, payments.ConsumerName}},
		{&r.Unpublished, "count unpublished outbox rows", qUnpublished, nil},
		{&r.ClaimsWithoutEffect, "look for claims without effect", qClaimsWithoutEffect, []any{runID, payments.ConsumerName}},
		{&r.EffectsWithoutClaim, "look for effects without claim", qEffectsWithoutClaim, []any{runID, payments.ConsumerName}},
	} {
		if *c.dst, err = count(c.what, c.q, c.args...); err != nil {
			return err
		}
	}

	r.DeadLetters = map[string]int{}
	rows, err = pool.Query(ctx, t.sql(qDeadLetters))
	if err != nil {
		return fmt.Errorf("check run %s: count dead letters: %w", runID, err)
	}
	for rows.Next() {
		var consumer, reason string
		var n int
		if err := rows.Scan(&consumer, &reason, &n); err != nil {
			rows.Close()
			return fmt.Errorf("check run %s: count dead letters: %w", runID, err)
		}
		if consumer != payments.ConsumerName {
			reason = consumer + ":" + reason
		}
		r.DeadLetters[reason] += n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check run %s: count dead letters: %w", runID, err)
	}

	v := &r.Violations
	add := func(n int, f string, args ...any) {
		if n > 0 {
			*v = append(*v, fmt.Sprintf(f, append([]any{n}, args...)...))
		}
	}
	if r.Events == 0 {
		*v = append(*v, "no orders were written")
	}
	add(r.DoubleApplied, "%d events were applied more than once (several ledger rows)")
	add(r.Lost, "%d valid events were lost: neither applied nor dead-lettered")
	r.validDeadLettered = max(notApplied-r.Lost-*exhausted, r.DeadLetteredValid)
	add(r.validDeadLettered, "%d valid events were dead-lettered instead of applied")
	add(r.WrongLedger, "%d ledger rows match no valid order (a poison or key-reuse message was applied)")
	add(r.BadBalances, "%d wallets' balances differ from the sum of their valid orders")
	add(r.BadPoison, "%d poison messages were not dead-lettered exactly once with the right reason")
	if r.BadPoison == 0 {
		add(*lostPoison, "%d poison messages have no dead letter")
	}
	add(r.StrayDeadLetters, "%d dead letters match no poison order")
	for k, n := range r.DeadLetters {
		if strings.HasPrefix(k, idemrelay.ConsumerName+":") {
			add(n, "the relay dead-lettered %d outbox rows (%s)", k)
		}
	}
	add(r.Unpublished, "%d outbox rows were never published")
	if *edgeAccepted > 0 {
		var kinds string
		if err := pool.QueryRow(ctx, t.sql(qEdgeAcceptedKinds), runID).Scan(&kinds); err != nil {
			return fmt.Errorf("check run %s: kinds of poison identities the outbox accepted: %w", runID, err)
		}
		add(*edgeAccepted, "the outbox accepted %d poison identities (%s; Enqueue must refuse them)", kinds)
	}
	add(r.ClaimsWithoutEffect, "%d claims have no effect (no ledger row)")
	add(r.EffectsWithoutClaim, "%d ledger rows have no claim")
	r.OK = len(r.Violations) == 0
	return nil
}
