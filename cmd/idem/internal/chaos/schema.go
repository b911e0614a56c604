package chaos

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/idempg"
)

// runDB is the run's database as the harness sees it: its own connection (never through the
// proxy) to a schema (PostgreSQL) or database (MySQL) of the run's own, with idem's tables,
// the scenario's (payments) and the harness's fault switches. Statements are payments.DB's,
// plus {faults} and {dl_refused}.
type runDB struct {
	*payments.DB
	// name is the run's schema or database.
	name  string
	names *strings.Replacer
	// dropFn drops the run's database (MySQL; nil on PostgreSQL, whose schema drop needs no
	// other connection).
	dropFn  func(context.Context) error
	closeFn func()
}

// exec runs a statement of the harness.
func (r *runDB) exec(ctx context.Context, q string, args ...any) error {
	_, err := r.Exec(ctx, r.names.Replace(q), args...)
	return err
}

// setRefuseDeadLetters flips the switch the dead-letter trigger reads.
func (r *runDB) setRefuseDeadLetters(ctx context.Context, on bool) error {
	return r.exec(ctx, `UPDATE {faults} SET refuse_dead_letters = ?`, on)
}

// refused counts the dead-letter writes the trigger refused. PostgreSQL counts them with a
// sequence; MySQL has none, and counts them with the AUTO_INCREMENT of a table the trigger
// inserts into before it fails the statement: InnoDB never gives a value back on rollback.
func (r *runDB) refused(ctx context.Context) (int, error) {
	if r.Dialect() == payments.Postgres {
		return r.Count(ctx, r.names.Replace(`SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {dl_refused}`))
	}
	db := r.SQLDB()
	res, err := db.ExecContext(ctx, r.names.Replace(`INSERT INTO {dl_refused} () VALUES ()`))
	if err != nil {
		return 0, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, err
	}
	var inc, off int64
	if err := db.QueryRowContext(ctx, `SELECT @@auto_increment_increment, @@auto_increment_offset`).Scan(&inc, &off); err != nil {
		return 0, err
	}
	return int((id - off) / max(inc, 1)), nil
}

// analyze refreshes the statistics of the tables the verdict reads: they grew fast during
// the run, and fresh statistics keep its anti-joins on their indexes.
func (r *runDB) analyze(ctx context.Context) error {
	if r.Dialect() == payments.Postgres {
		return r.exec(ctx, `ANALYZE {orders}, {ledger}, {claims}, {dead_letters}, {outbox}`)
	}
	return r.Rows(ctx, `ANALYZE TABLE {orders}, {ledger}, {claims}, {dead_letters}, {outbox}`, nil,
		func(scan func(...any) error) error { return nil })
}

func (r *runDB) close() { r.closeFn() }

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

// postgresFaultDDL creates the harness's fault switches on PostgreSQL.
var postgresFaultDDL = []string{
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
}

// mysqlFaultDDL creates the harness's fault switches on MySQL and MariaDB.
var mysqlFaultDDL = []string{
	`CREATE TABLE {faults} (refuse_dead_letters BOOLEAN NOT NULL) ENGINE=InnoDB`,
	`INSERT INTO {faults} VALUES (false)`,
	// Refused dead-letter writes, counted by AUTO_INCREMENT values: the trigger's insert is
	// rolled back with the statement, the value it took is not.
	`CREATE TABLE {dl_refused} (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY) ENGINE=InnoDB`,
	// While refuse_dead_letters is on, every dead-letter write fails as a server out of
	// resources would (error 1041, ER_OUT_OF_RESOURCES, transient for idemmysql).
	`CREATE TRIGGER chaos_refuse_dead_letters BEFORE INSERT ON {dead_letters} FOR EACH ROW
	BEGIN
		IF (SELECT refuse_dead_letters FROM {faults} LIMIT 1) THEN
			INSERT INTO {dl_refused} () VALUES ();
			SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1041,
				MESSAGE_TEXT = 'could not extend the dead-letter table: no space left (injected by idem chaos)';
		END IF;
	END`,
	// idem looks dead letters up by key hash; the verdict matches them with orders by event
	// id, which a BLOB column can index only by a prefix (the run's database only).
	`ALTER TABLE {dead_letters} ADD KEY chaos_dead_letters_event (event_id(255))`,
}

// harnessNames names the harness's own tables in schema (PostgreSQL) or the current database.
func harnessNames(d payments.Dialect, schema string) *strings.Replacer {
	q := func(name string) string { return name }
	if d == payments.Postgres {
		q = func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	}
	return strings.NewReplacer(
		"{faults}", q("chaos_faults"),
		"{dl_refused}", q("chaos_dl_refused"),
		"{refuse_dl}", q("chaos_refuse_dead_letter"),
	)
}

// setupRun creates the run's tables in r: idem's (migrated), the scenario's, the outages
// table and the fault switches, and the run's wallets at a zero balance.
func (r *runDB) setupRun(ctx context.Context, runID string, migrate func(context.Context) error) error {
	if err := migrate(ctx); err != nil {
		return fmt.Errorf("migrate %s: %w", r.name, err)
	}
	ddl := slices.Concat(payments.Tables(r.Dialect()), payments.OutageTables(r.Dialect()), mysqlFaultDDL)
	if r.Dialect() == payments.Postgres {
		ddl = slices.Concat(payments.Tables(r.Dialect()), payments.OutageTables(r.Dialect()), postgresFaultDDL)
	}
	for _, s := range ddl {
		if err := r.exec(ctx, s); err != nil {
			return fmt.Errorf("create scenario tables in %s: %w", r.name, err)
		}
	}
	args := make([]any, 0, 2*payments.WalletCount)
	for w := range payments.WalletCount {
		args = append(args, runID, payments.WalletID(w))
	}
	if err := r.exec(ctx, payments.InsertValues("{wallets}", []string{"run_id", "id"}, payments.WalletCount), args...); err != nil {
		return fmt.Errorf("create wallets: %w", err)
	}
	return nil
}

// openPostgresRun creates schema on PostgreSQL at pgURL with the run's tables (the claims
// table partitioned by bucket when it is not 0).
func openPostgresRun(ctx context.Context, pgURL, schema, runID string, bucket time.Duration) (*runDB, error) {
	pcfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		return nil, fmt.Errorf("PostgresURL: %w", err)
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	r := &runDB{DB: payments.NewPostgresDB(pool, schema, idempg.PrefixDefault), name: schema,
		names: harnessNames(payments.Postgres, schema), closeFn: pool.Close}
	store, err := idempg.NewWithConfig(pool, storeConfig(schema, bucket))
	if err != nil {
		pool.Close()
		return nil, err
	}
	defer store.Close()
	if err := r.setupRun(ctx, runID, store.Migrate); err != nil {
		r.dropAndClose(ctx)
		return nil, err
	}
	return r, nil
}

// openMySQLRun creates database name on the MySQL or MariaDB server of dsn with the run's
// tables. The DSN's user needs CREATE, DROP and TRIGGER on it.
func openMySQLRun(ctx context.Context, dsn, name, runID string) (*runDB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("MySQLDSN: %w", err)
	}
	if err := adminExec(ctx, cfg, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	db, err := openMySQL(runDSN(cfg, "", name), 4)
	if err != nil {
		return nil, err
	}
	r := &runDB{DB: payments.NewSQLDB(db, payments.MySQL, idemmysql.PrefixDefault), name: name,
		names: harnessNames(payments.MySQL, ""), closeFn: func() { _ = db.Close() }}
	r.dropFn = func(ctx context.Context) error { return adminExec(ctx, cfg, "DROP DATABASE IF EXISTS `"+name+"`") }
	store, err := idemmysql.NewWithConfig(db, idemmysql.Config{})
	if err != nil {
		r.dropAndClose(ctx)
		return nil, err
	}
	defer store.Close()
	if err := r.setupRun(ctx, runID, store.Migrate); err != nil {
		r.dropAndClose(ctx)
		return nil, err
	}
	return r, nil
}

// adminExec runs stmt on cfg's server with no database selected (to create or drop the run's).
func adminExec(ctx context.Context, cfg *mysql.Config, stmt string) error {
	c := cfg.Clone()
	c.DBName = ""
	db, err := openMySQL(c.FormatDSN(), 1)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, stmt)
	return err
}

// runDSN is cfg on the run's database name, at addr when it is not "" (the proxy's).
func runDSN(cfg *mysql.Config, addr, name string) string {
	c := cfg.Clone()
	c.DBName = name
	if addr != "" {
		c.Net, c.Addr = "tcp", addr
	}
	return c.FormatDSN()
}

// mysqlTarget returns where the MySQL server of dsn listens: ("tcp", host:port) or ("unix", path).
func mysqlTarget(dsn string) (network, address string, err error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", "", err
	}
	if cfg.Net == "unix" {
		return "unix", cfg.Addr, nil
	}
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return "tcp", net.JoinHostPort(cfg.Addr, strconv.Itoa(3306)), nil
	}
	return "tcp", cfg.Addr, nil
}

// drop removes the run's schema or database and everything in it.
func (r *runDB) drop(ctx context.Context) error {
	if r.dropFn != nil {
		return r.dropFn(ctx)
	}
	_, err := r.Pool().Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{r.name}.Sanitize()+" CASCADE")
	return err
}

// dropAndClose drops the run's tables after a failed setup and closes r.
func (r *runDB) dropAndClose(ctx context.Context) {
	_ = r.drop(context.WithoutCancel(ctx))
	r.close()
}
