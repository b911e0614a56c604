// Package idempg is idem's PostgreSQL store, through pgx v5: claims, dead letters and their
// audit trail, the queue table, the transactional outbox and leases, in tables of their own in
// the application's database. A handler receives the pgx.Tx that holds its event's claim and
// writes its business change in it, so the claim and the effect commit or roll back together.
//
// The tables live in a configurable schema with a configurable name prefix (Config); the
// store migrates them itself (Store.Migrate) or hands the SQL to the team's own migration tool
// (Store.MigrationSQL). Idle queue workers and outbox relays wake through LISTEN/NOTIFY on one
// shared connection, and fall back to polling when that connection is unavailable.
//
// The claims table is plain by default, and garbage collection deletes expired claims in
// batches. For a high-volume inbox, Config.Partition range-partitions it by the claim's creation
// time (truncated to an hour or a day), while the key stays (tenant, consumer, event_id) alone:
// a claim locks its key and finds an earlier claim in any partition. Retention then drops whole
// partitions (DropExpiredPartitions), partitions are created ahead of time (EnsurePartitions),
// and the store implements idemstore.BucketedStore, so consumers require each event's OccurredAt and
// dead-letter as too_old an event older than their retention. See partition.go.
//
//	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	…
//	store := idempg.New(pool)
//	defer store.Close()
//	if err := store.Migrate(ctx); err != nil {
//		…
//	}
package idempg
