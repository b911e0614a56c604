package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/idempg"
)

// tables names the tables of one run's schema: idem's (default prefix) and the scenario's,
// which have the demo's shapes. Statements are written with {orders}, {ledger}, {wallets},
// {claims}, {dead_letters} and {outbox}; sql qualifies them.
type tables struct {
	schema string
	names  *strings.Replacer
}

func newTables(schema string) tables {
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	p := idempg.PrefixDefault
	return tables{schema: schema, names: strings.NewReplacer(
		"{orders}", q("demo_orders"),
		"{ledger}", q("demo_ledger"),
		"{wallets}", q("demo_wallets"),
		"{claims}", q(p+"claims"),
		"{dead_letters}", q(p+"dead_letters"),
		"{outbox}", q(p+"outbox"),
		"{faults}", q("chaos_faults"),
		"{outages}", q("chaos_outages"),
		"{dl_refused}", q("chaos_dl_refused"),
		"{refuse_dl}", q("chaos_refuse_dead_letter"),
		// {ident}: order o is a poison identity, matched with its dead letter by the order
		// index its message carries ({dl_order}, NULL when d carries none), not by event id.
		"{ident}", `(o.poison LIKE 'id\_%' OR o.poison LIKE 'tenant\_%')`,
		"{dl_order}", `(CASE WHEN d.headers->>'`+headerOrder+`' ~ '^[0-9]{1,18}$' THEN (d.headers->>'`+headerOrder+`')::bigint END)`,
	)}
}

func (t tables) sql(q string) string { return t.names.Replace(q) }

// scenarioDDL creates the scenario's tables (payments.PostgresTables, the demo's) and the
// harness's fault switches.
var scenarioDDL = append(slices.Clone(payments.PostgresTables),
	// Fault switches the harness flips (through its own connection, never the proxy).
	`CREATE TABLE {faults} (refuse_dead_letters boolean NOT NULL)`,
	`INSERT INTO {faults} VALUES (false)`,
	// Refused dead-letter writes, counted by a sequence: nextval survives the rollback.
	`CREATE SEQUENCE {dl_refused}`,
	// While refuse_dead_letters is on, every dead-letter write fails as a full disk would
	// (SQLSTATE 53100, a transient class): the consumers must keep the message, retry the
	// write and lose nothing.
	`CREATE FUNCTION {refuse_dl}() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		IF (SELECT refuse_dead_letters FROM {faults}) THEN
			PERFORM nextval('{dl_refused}');
			RAISE EXCEPTION 'could not extend the dead-letter table: no space left (injected by idem chaos)'
				USING ERRCODE = '53100';
		END IF;
		RETURN NEW;
	END $$`,
	`CREATE TRIGGER chaos_refuse_dead_letters BEFORE INSERT ON {dead_letters}
		FOR EACH ROW EXECUTE FUNCTION {refuse_dl}()`,
	// The database outages longer than the consumers' retry budget, with the grace after each
	// in which a valid event may end as a retries_exhausted dead letter.
	`CREATE TABLE {outages} (
		started_at timestamptz NOT NULL,
		ended_at   timestamptz NOT NULL,
		grace      interval    NOT NULL)`,
)

// storeConfig is the idempg configuration of every process of a run: the run's schema, and the
// claims table partitioned by day (or hour) buckets of OccurredAt when bucket is not 0, with
// partitions kept as long as the consumers keep their claims.
func storeConfig(schema string, bucket time.Duration) idempg.Config {
	cfg := idempg.Config{Schema: schema}
	if bucket > 0 {
		cfg.Partition = idempg.PartitionConfig{Bucket: bucket, Retention: idem.RetentionDefault}
	}
	return cfg
}

// setupSchema creates a fresh schema with idem's tables (migrated, partitioned by bucket
// when it is not 0) and the scenario's, and the
// run's wallets at a zero balance.
func setupSchema(ctx context.Context, pool *pgxpool.Pool, schema, runID string, bucket time.Duration) error {
	store, err := idempg.NewWithConfig(pool, storeConfig(schema, bucket))
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate schema %s: %w", schema, err)
	}
	t := newTables(schema)
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, s := range scenarioDDL {
			if _, err := tx.Exec(ctx, t.sql(s)); err != nil {
				return fmt.Errorf("create scenario tables in schema %s: %w", schema, err)
			}
		}
		_, err := tx.Exec(ctx, t.sql(`INSERT INTO {wallets} (run_id, id)
			SELECT $1, 'w' || lpad(i::text, 3, '0') FROM generate_series(0, $2 - 1) AS i`), runID, payments.WalletCount)
		if err != nil {
			return fmt.Errorf("create wallets: %w", err)
		}
		return nil
	})
}

// dropSchema removes a run's schema and everything in it.
func dropSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	_, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	return err
}
