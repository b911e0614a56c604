package idempg

import "strings"

// queries holds every statement the store runs, built once for the configured schema and
// prefix so that no call formats SQL (pgx then caches each one as a prepared statement per
// connection).
type queries struct {
	// Migrations.
	schemaExists, createSchema, createMigrations, migrationApplied, migrationRecord string

	// Claims. On a partitioned store, claim, claimBatch and claimRelease are the partitioned
	// variants, and claimSelect, claimBatchSelect and the claimDelete statements are unused.
	claim, claimSelect, claimDeleteAll, claimDeleteConsumer string
	claimBatch, claimBatchSelect, claimRelease              string
	// claimLock and claimBatchLock (partitioned only) take the keys' advisory locks and read
	// the transaction's isolation level, in a statement before the claim's own.
	claimLock, claimBatchLock string

	// The claims table's layout, and the partitions of a partitioned one.
	claimsLayout, partitionList string

	// Dead letters and audit.
	dlInsert, dlGet, dlList, dlSetStatus, dlRecover, dlStats, auditList, auditInsert string

	// Queue.
	queueInsert, queueNotify, queueFetch, queueAck, queueAckCommit1, queueAckCommit, queueNak, queueExtend, queueStats string
	// Subscriptions (fan-out).
	subInsert, subDelete, subDeleteJobs, subList string

	// Outbox and leases.
	outboxInsert, outboxNotify, outboxFetch, outboxMarkPublished, outboxMarkFailed,
	outboxDeletePublished, outboxStats string
	leaseAcquire, leaseRelease, leaseList string

	// Notification channels and the statements that listen on them.
	queueChannel, outboxChannel string
	listenQueue, listenOutbox   string
}

// The columns read back from the dead-letter, queue and outbox tables, in scan order.
const (
	dlColumns = `id, consumer, tenant, event_id, type, payload, headers, published_at, occurred_at,
		fingerprint, reason, error, attempts, first_failed_at, last_failed_at, status, source, recovered_at,
		owner, topic`
	outboxColumns = `id, partition, event_id, tenant, topic, ordering_key, type, payload, headers,
		occurred_at, created_at, attempts, last_error, next_attempt_at, first_attempt_at, dead,
		coalesce(dead_letter_id, 0)`
)

// buildQueries substitutes the schema and prefix into every statement. Both were validated as
// plain identifiers, and table names are quoted, so their case is kept. partitioned picks the
// claim statements of the partitioned inbox, whose key includes the bucket.
func buildQueries(schema, prefix string, partitioned bool) queries {
	table := func(name string) string { return `"` + schema + `"."` + prefix + name + `"` }
	r := strings.NewReplacer(
		"{{claims}}", table("claims"),
		"{{dead_letters}}", table("dead_letters"),
		"{{audit}}", table("audit"),
		"{{queue}}", table("queue"),
		"{{queue_subscriptions}}", table("queue_subscriptions"),
		"{{outbox}}", table("outbox"),
		"{{leases}}", table("leases"),
		"{{migrations}}", table("migrations"),
		"{{schema}}", `"`+schema+`"`,
		"{{dl_columns}}", dlColumns,
		"{{outbox_columns}}", outboxColumns,
	)
	q := queries{
		schemaExists: `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`,
		createSchema: `CREATE SCHEMA IF NOT EXISTS {{schema}}`,
		createMigrations: `CREATE TABLE IF NOT EXISTS {{migrations}} (
			version    integer     PRIMARY KEY,
			name       text        NOT NULL,
			applied_at timestamptz NOT NULL
		)`,
		migrationApplied: `SELECT EXISTS (SELECT 1 FROM {{migrations}} WHERE version = $1)`,
		migrationRecord:  `INSERT INTO {{migrations}} (version, name, applied_at) VALUES ($1, $2, $3)`,

		// One row: the inserted one (new), or else the existing one when it was committed
		// before this statement's snapshot. (The NOT EXISTS matters only when a claim the
		// snapshot still sees was deleted by a concurrent garbage collector while the INSERT
		// waited: the INSERT then succeeds and the stale row must not be reported.) A claimer
		// that committed while this statement waited on the primary key is visible to neither
		// half: no row, and ClaimTx reads it with claimSelect in a new statement.
		claim: `WITH ins AS (
			INSERT INTO {{claims}} (tenant, consumer, event_id, fingerprint, created_at)
			VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (tenant, consumer, event_id) DO NOTHING
			RETURNING fingerprint, created_at
		)
		SELECT true, fingerprint, created_at FROM ins
		UNION ALL
		SELECT false, fingerprint, created_at FROM {{claims}}
		WHERE tenant = $1 AND consumer = $2 AND event_id = $3 AND NOT EXISTS (SELECT FROM ins)`,
		claimSelect: `SELECT fingerprint, created_at FROM {{claims}}
			WHERE tenant = $1 AND consumer = $2 AND event_id = $3`,
		claimDeleteAll: `DELETE FROM {{claims}} WHERE ctid = ANY (ARRAY (
			SELECT ctid FROM {{claims}} WHERE created_at < $1 LIMIT $2))`,
		claimDeleteConsumer: `DELETE FROM {{claims}} WHERE ctid = ANY (ARRAY (
			SELECT ctid FROM {{claims}} WHERE consumer = $2 AND created_at < $1 LIMIT $3))`,

		dlInsert: `INSERT INTO {{dead_letters}} (consumer, tenant, event_id, type, payload, headers,
			published_at, occurred_at, fingerprint, reason, error, attempts, first_failed_at,
			last_failed_at, status, source, owner, topic)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, 'pending', $15, $16, $17)
		ON CONFLICT (consumer, tenant, event_id, fingerprint) WHERE status = 'pending'
		DO UPDATE SET attempts = excluded.attempts, error = excluded.error,
			last_failed_at = excluded.last_failed_at, reason = excluded.reason, owner = excluded.owner
		RETURNING {{dl_columns}}`,
		dlGet:  `SELECT {{dl_columns}} FROM {{dead_letters}} WHERE id = $1`,
		dlList: `SELECT {{dl_columns}} FROM {{dead_letters}}`,
		// One statement: the status change and its audit rows commit together.
		dlSetStatus: `WITH upd AS (
			UPDATE {{dead_letters}} SET status = $2
			WHERE id = ANY ($1) AND status = 'pending'
			RETURNING id, event_id
		)
		INSERT INTO {{audit}} (at, actor, action, dead_letter_id, event_id, reason, destination)
		SELECT $3::timestamptz, $4::text, $5::text, id, event_id, $6::text, $7::text FROM upd
		RETURNING dead_letter_id`,
		dlRecover: `UPDATE {{dead_letters}} SET recovered_at = $4
			WHERE event_id = $3 AND consumer = $2 AND tenant = $1
			AND recovered_at IS NULL AND (status = 'replayed' OR (id = $5 AND status = 'pending'))
			RETURNING first_failed_at`,
		dlStats: `SELECT reason, count(*), min(first_failed_at) FROM {{dead_letters}}
			WHERE status = 'pending' GROUP BY reason`,
		auditInsert: `INSERT INTO {{audit}} (at, actor, action, dead_letter_id, event_id, reason)
			VALUES ($1, $2, $3, 0, $4, $5)`,
		auditList: `SELECT id, at, actor, action, dead_letter_id, event_id, reason, destination
			FROM {{audit}} ORDER BY id DESC LIMIT $1`,

		// The messages go in as arrays, one statement for the whole publish: each message makes
		// one job per subscription of topic $1, in its queue $1 || '#' || name, or one job in
		// the queue $1 when the topic has none. Both halves read the statement's one snapshot,
		// so a message goes to the plain queue or to subscriptions, never both. The ids follow
		// the messages' order (ORDER BY the ordinality), which is the order a fetch takes them.
		queueInsert: `INSERT INTO {{queue}} (queue, event_id, tenant, type, payload, headers,
			occurred_at, enqueued_at, available_at)
			SELECT target.q, m.event_id, m.tenant, m.type, m.payload, m.headers::jsonb, m.occurred_at, $8, $8
			FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::timestamptz[])
				WITH ORDINALITY AS m(event_id, tenant, type, payload, headers, occurred_at, n)
			CROSS JOIN (
				SELECT $1::text || '#' || name AS q FROM {{queue_subscriptions}} WHERE topic = $1
				UNION ALL
				SELECT $1::text WHERE NOT EXISTS (SELECT FROM {{queue_subscriptions}} WHERE topic = $1)
			) AS target
			ORDER BY m.n, target.q`,
		// Wakes the waiters of the topic's queue and of each of its subscriptions' queues.
		queueNotify: `SELECT count(pg_notify($1, q)) FROM (
				SELECT $2::text AS q
				UNION ALL
				SELECT $2::text || '#' || name FROM {{queue_subscriptions}} WHERE topic = $2
			) AS target`,
		subInsert: `INSERT INTO {{queue_subscriptions}} (topic, name, created_at) VALUES ($1, $2, $3)
			ON CONFLICT (topic, name) DO NOTHING`,
		subDelete:     `DELETE FROM {{queue_subscriptions}} WHERE topic = $1 AND name = $2`,
		subDeleteJobs: `DELETE FROM {{queue}} WHERE id = ANY (ARRAY (SELECT id FROM {{queue}} WHERE queue = $1 LIMIT $2))`,
		subList:       `SELECT name FROM {{queue_subscriptions}} WHERE topic = $1 ORDER BY name`,
		// ARRAY(…) runs the locking subquery once, as an init plan; SKIP LOCKED lets
		// concurrent fetchers take different rows instead of queueing on the same ones.
		// first_fetched_at keeps the first fetch's time: the retry budget counts from it.
		// The fetch commits without waiting for its WAL flush (synchronous_commit off for this
		// statement's own transaction, set_config's third argument): losing a lease to a crash
		// only makes the job visible again, and any later synchronous commit (the claim's)
		// flushes it first. It saves a disk flush per fetch, most of a fetch's time. After a
		// database crash a token may be handed out twice for one job; the claim's unique key
		// still lets one effect commit.
		queueFetch: `UPDATE {{queue}} SET lease_until = $3, token = token + 1, attempts = attempts + 1,
				first_fetched_at = COALESCE(first_fetched_at, $2)
			FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async
			WHERE id = ANY (ARRAY (
				SELECT id FROM {{queue}}
				WHERE queue = $1 AND available_at <= $2 AND (lease_until IS NULL OR lease_until <= $2)
				ORDER BY id LIMIT $4
				FOR UPDATE SKIP LOCKED))
			RETURNING id, token, attempts, event_id, tenant, type, payload, headers, occurred_at, enqueued_at,
				first_fetched_at`,
		// A nak clears lease_until, so the token of a nak'ed job no longer acks or naks it.
		queueAck: `DELETE FROM {{queue}} WHERE id = $1 AND token = $2 AND lease_until IS NOT NULL`,
		// The acks of one InTx transaction, sent with its COMMIT in one batch (commitAcks): the
		// jobs still held under these tokens are deleted, and when one is not the statement
		// fails, so the server skips the COMMIT. The failure is a cast to int of a text that
		// starts with ackLostMarker and lists the jobs that were deleted (built only then: the
		// list is a subquery of the ELSE, which runs only when reached); it depends on the
		// delete's rows, so it is evaluated at run time only, never folded at planning.
		queueAckCommit1: `WITH d AS (DELETE FROM {{queue}} WHERE id = $1 AND token = $2 AND lease_until IS NOT NULL RETURNING id)
			SELECT (CASE WHEN count(*) = 1 THEN '0' ELSE '` + ackLostMarker + `' END)::int FROM d`,
		queueAckCommit: `WITH d AS (DELETE FROM {{queue}} q USING unnest($1::bigint[], $2::bigint[]) AS a(id, token)
				WHERE q.id = a.id AND q.token = a.token AND q.lease_until IS NOT NULL RETURNING q.id)
			SELECT (CASE WHEN (SELECT count(*) FROM d) = cardinality($1::bigint[]) THEN '0'
				ELSE '` + ackLostMarker + `' || coalesce((SELECT string_agg(id::text, ' ') FROM d), '') END)::int`,
		queueNak: `UPDATE {{queue}} SET available_at = $3, lease_until = NULL, last_error = $4
			WHERE id = $1 AND token = $2 AND lease_until IS NOT NULL`,
		queueExtend: `UPDATE {{queue}} SET lease_until = $3
			WHERE id = $1 AND token = $2 AND lease_until > $4`,
		queueStats: `SELECT count(*), min(enqueued_at) FROM {{queue}} WHERE queue = $1`,

		outboxInsert: `INSERT INTO {{outbox}} (partition, event_id, tenant, topic, ordering_key, type,
			payload, headers, occurred_at, created_at, next_attempt_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10)`,
		outboxNotify: `SELECT pg_notify($1, '')`,
		// Live rows and the dead rows still holding their keys, each through its partial index.
		outboxFetch: `SELECT * FROM (
			(SELECT {{outbox_columns}} FROM {{outbox}}
				WHERE partition = ANY ($1) AND published_at IS NULL AND NOT dead ORDER BY id LIMIT $2)
			UNION ALL
			(SELECT {{outbox_columns}} FROM {{outbox}}
				WHERE partition = ANY ($1) AND published_at IS NULL AND dead AND dead_letter_id IS NOT NULL
				ORDER BY id LIMIT $2)) AS rows
			ORDER BY id LIMIT $2`,
		// Like a queue fetch, marking rows published does not wait for its WAL flush: losing
		// the mark to a crash only publishes the rows again, with the same event ids, which the
		// broker's deduplication and the consumers absorb (a relay publishes at least once).
		outboxMarkPublished: `UPDATE {{outbox}} SET published_at = $2
			FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async
			WHERE id = ANY ($1)`,
		outboxMarkFailed: `UPDATE {{outbox}} SET attempts = $2, last_error = $3, next_attempt_at = $4, dead = $5,
			first_attempt_at = $6, dead_letter_id = nullif($7, 0) WHERE id = $1`,
		outboxDeletePublished: `DELETE FROM {{outbox}} WHERE id = ANY (ARRAY (
			SELECT id FROM {{outbox}} WHERE published_at < $1 LIMIT $2))`,
		outboxStats: `SELECT count(*), min(created_at) FROM {{outbox}}
			WHERE published_at IS NULL AND NOT dead`,

		// Succeeds when the lease is free, expired or already ours; the token moves on only
		// when the owner changes, so a renewal keeps it.
		leaseAcquire: `INSERT INTO {{leases}} AS l (name, owner, token, lease_until)
			VALUES ($1, $2, 1, $3)
			ON CONFLICT (name) DO UPDATE SET
				owner = excluded.owner,
				token = CASE WHEN l.owner = excluded.owner THEN l.token ELSE l.token + 1 END,
				lease_until = excluded.lease_until
			WHERE l.owner = excluded.owner OR l.lease_until <= $4
			RETURNING token`,
		// Releasing expires the lease instead of deleting it, so the token keeps increasing;
		// -infinity is expired under any caller's clock.
		leaseRelease: `UPDATE {{leases}} SET lease_until = '-infinity'
			WHERE name = $1 AND owner = $2`,
		leaseList: `SELECT name, owner, token, lease_until FROM {{leases}}
			WHERE starts_with(name, $1) AND lease_until > $2 ORDER BY name`,

		// The batch claim inserts in the caller's (sorted) order, so two batches that share keys
		// lock them in the same order and do not deadlock each other.
		claimBatch: `INSERT INTO {{claims}} (tenant, consumer, event_id, fingerprint, created_at)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::timestamptz[])
			ON CONFLICT DO NOTHING
			RETURNING tenant, consumer, event_id`,
		claimBatchSelect: `SELECT c.tenant, c.consumer, c.event_id, c.fingerprint, c.created_at
			FROM {{claims}} c
			JOIN unnest($1::text[], $2::text[], $3::text[]) AS k(tenant, consumer, event_id)
			  ON c.tenant = k.tenant AND c.consumer = k.consumer AND c.event_id = k.event_id`,
		claimRelease:  `DELETE FROM {{claims}} WHERE tenant = $1 AND consumer = $2 AND event_id = $3`,
		queueChannel:  prefix + "queue",
		outboxChannel: prefix + "outbox",
		listenQueue:   `LISTEN "` + prefix + `queue"`,
		listenOutbox:  `LISTEN "` + prefix + `outbox"`,
	}

	// The claims table's kind, its columns in order, the column it is range-partitioned by, and
	// which of the bucket-width constraints ($3) it has; no row when it does not exist.
	q.claimsLayout = `SELECT c.relkind = 'p',
			coalesce((SELECT string_agg(a.attname, ',' ORDER BY a.attnum) FROM pg_attribute a
				WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), ''),
			coalesce((SELECT string_agg(a.attname, ',') FROM pg_partitioned_table pt
				JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = ANY (pt.partattrs::int2[])
				WHERE pt.partrelid = c.oid AND pt.partstrat = 'r'), ''),
			coalesce((SELECT string_agg(conname, ',') FROM pg_constraint
				WHERE conrelid = c.oid AND contype = 'c' AND conname = ANY ($3)), '')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2`
	// Every table of the schema named like a partition (from $2 = "{prefix}claims_p" up to $3 =
	// "{prefix}claims_q": a range on pg_class's name index, as a catalog bloated by DDL churn
	// makes a scan slow), whether it is attached to some table and to the claims table ($4), and
	// whether a concurrent detach of it is pending.
	q.partitionList = `SELECT c.relname, i.inhparent IS NOT NULL, i.inhparent = (SELECT to_regclass($4)),
			coalesce(i.inhdetachpending, false)
		FROM pg_class c
		LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
		WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1)
		  AND c.relname >= $2::name AND c.relname < $3::name AND c.relkind = 'r'
		ORDER BY c.relname`

	if partitioned {
		// The key is (tenant, consumer, event_id) alone; the bucket ($4, the claim's own
		// creation time truncated) only places a new claim. ClaimTx first takes the key's
		// advisory lock (claimLock) in a statement of its own, so this statement's snapshot,
		// taken after the lock (READ COMMITTED), sees every claim of the key committed before,
		// in whichever partition: an existing claim is reported, else one is inserted. The
		// lookup visits each partition's primary key, newest first (a duplicate mostly follows
		// its first delivery closely, and the scan stops at the first claim). ON CONFLICT still guards the insert; a
		// conflict it absorbs (no row) is read again by ClaimTx. A claim in a partition that
		// does not exist fails the INSERT (SQLSTATE 23514, no constraint name), which ClaimTx
		// reports as ErrPartitionMissing.
		q.claim = `WITH found AS (
			SELECT fingerprint, created_at FROM {{claims}}
			WHERE tenant = $1 AND consumer = $2 AND event_id = $3
			ORDER BY bucket DESC LIMIT 1
		), ins AS (
			INSERT INTO {{claims}} (tenant, consumer, event_id, bucket, fingerprint, created_at)
			SELECT $1::text, $2::text, $3::text, $4::timestamptz, $5::bytea, $6::timestamptz
			WHERE NOT EXISTS (SELECT FROM found)
			ON CONFLICT (tenant, consumer, event_id, bucket) DO NOTHING
			RETURNING fingerprint, created_at
		)
		SELECT true, fingerprint, created_at FROM ins
		UNION ALL
		SELECT false, fingerprint, created_at FROM found`
		q.claimLock = `SELECT current_setting('transaction_isolation') FROM (SELECT pg_advisory_xact_lock($1)) AS l`
		// count() makes the executor take every lock, in the (sorted) order of the array.
		q.claimBatchLock = `SELECT count(pg_advisory_xact_lock(h)), current_setting('transaction_isolation')
			FROM unnest($1::bigint[]) AS h`
		// As claim, for many keys: the existing claims of the keys in any partition, and the
		// insert of the others, after claimBatchLock took every key's lock.
		q.claimBatch = `WITH k AS (
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::bytea[], $6::timestamptz[])
				AS k(tenant, consumer, event_id, bucket, fingerprint, created_at)
		), found AS (
			SELECT DISTINCT ON (c.tenant, c.consumer, c.event_id) c.tenant, c.consumer, c.event_id, c.fingerprint, c.created_at
			FROM {{claims}} c
			JOIN k ON c.tenant = k.tenant AND c.consumer = k.consumer AND c.event_id = k.event_id
		), ins AS (
			INSERT INTO {{claims}} (tenant, consumer, event_id, bucket, fingerprint, created_at)
			SELECT k.tenant, k.consumer, k.event_id, k.bucket, k.fingerprint, k.created_at FROM k
			WHERE NOT EXISTS (SELECT FROM found f
				WHERE f.tenant = k.tenant AND f.consumer = k.consumer AND f.event_id = k.event_id)
			ON CONFLICT DO NOTHING
			RETURNING tenant, consumer, event_id
		)
		SELECT true, tenant, consumer, event_id, NULL::bytea, NULL::timestamptz FROM ins
		UNION ALL
		SELECT false, tenant, consumer, event_id, fingerprint, created_at FROM found`
		q.claimSelect, q.claimBatchSelect = "", "" // claim and claimBatch read existing claims themselves
		// ReleaseClaimTx deletes the claim this very transaction inserted (xmin is the
		// inserting transaction), whatever its bucket, and never a committed claim of the key
		// (which the claim found and reported instead). It visits every partition's primary
		// key; it runs only after a handler failed in a batch.
		q.claimRelease = `DELETE FROM {{claims}}
			WHERE tenant = $1 AND consumer = $2 AND event_id = $3 AND xmin = pg_current_xact_id()::xid`
		q.claimDeleteAll, q.claimDeleteConsumer = "", ""
	}

	for _, s := range []*string{
		&q.createSchema, &q.createMigrations, &q.migrationApplied, &q.migrationRecord,
		&q.claim, &q.claimSelect, &q.claimDeleteAll, &q.claimDeleteConsumer,
		&q.claimBatch, &q.claimBatchSelect, &q.claimRelease, &q.claimLock, &q.claimBatchLock,
		&q.dlInsert, &q.dlGet, &q.dlList, &q.dlSetStatus, &q.dlRecover, &q.dlStats, &q.auditList, &q.auditInsert,
		&q.queueInsert, &q.queueNotify, &q.queueFetch, &q.queueAck, &q.queueAckCommit1, &q.queueAckCommit, &q.queueNak, &q.queueExtend, &q.queueStats,
		&q.subInsert, &q.subDelete, &q.subDeleteJobs, &q.subList,
		&q.outboxInsert, &q.outboxFetch, &q.outboxMarkPublished, &q.outboxMarkFailed,
		&q.outboxDeletePublished, &q.outboxStats,
		&q.leaseAcquire, &q.leaseRelease, &q.leaseList,
	} {
		*s = r.Replace(*s)
	}
	return q
}
