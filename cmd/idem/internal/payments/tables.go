package payments

// The scenario's tables, per database, with the placeholders {orders}, {ledger} and {wallets}
// for their qualified names. The ledger is append-only and has NO unique key on event_id on
// purpose: idem's claim is what keeps an event from being applied twice, and a double
// application shows up as a second row. A poison identity (id_…, tenant_10k, chaos only) goes
// straight to the broker: sent says it went, edge_accepted that the outbox took its identity
// (it must refuse it).
var (
	// SQLiteTables creates the tables on SQLite.
	SQLiteTables = []string{
		`CREATE TABLE IF NOT EXISTS {orders} (
			id           INTEGER NOT NULL, -- order index within the run
			run_id       TEXT    NOT NULL,
			event_id     TEXT    NOT NULL,
			wallet_id    TEXT    NOT NULL,
			amount_cents INTEGER NOT NULL,
			valid        BOOLEAN NOT NULL, -- false for poison
			poison       TEXT    NOT NULL DEFAULT '', -- '', invalid_json, missing_field, key_reuse, id_…, tenant_10k
			sent          BOOLEAN NOT NULL DEFAULT true,
			edge_accepted BOOLEAN NOT NULL DEFAULT false,
			PRIMARY KEY (run_id, id))`,
		`CREATE INDEX IF NOT EXISTS demo_orders_event ON {orders} (run_id, event_id)`,
		`CREATE TABLE IF NOT EXISTS {ledger} (
			id           INTEGER PRIMARY KEY AUTOINCREMENT,
			run_id       TEXT    NOT NULL,
			event_id     TEXT    NOT NULL,
			wallet_id    TEXT    NOT NULL,
			amount_cents INTEGER NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS demo_ledger_event ON {ledger} (run_id, event_id)`,
		`CREATE TABLE IF NOT EXISTS {wallets} (
			run_id        TEXT    NOT NULL,
			id            TEXT    NOT NULL,
			balance_cents INTEGER NOT NULL DEFAULT 0,
			PRIMARY KEY (run_id, id))`,
	}
	// MySQLTables creates the tables on MySQL and MariaDB, with the indexes inside CREATE TABLE: MySQL 8 has no CREATE INDEX IF NOT
	// EXISTS.
	MySQLTables = []string{
		`CREATE TABLE IF NOT EXISTS {orders} (
			id           BIGINT       NOT NULL COMMENT 'order index within the run',
			run_id       VARCHAR(64)  NOT NULL,
			event_id     VARCHAR(255) NOT NULL,
			wallet_id    VARCHAR(64)  NOT NULL,
			amount_cents BIGINT       NOT NULL,
			valid        BOOLEAN      NOT NULL COMMENT 'false for poison',
			poison       VARCHAR(32)  NOT NULL DEFAULT '' COMMENT 'invalid_json, missing_field, key_reuse, id_…, tenant_10k',
			sent          BOOLEAN     NOT NULL DEFAULT true,
			edge_accepted BOOLEAN     NOT NULL DEFAULT false,
			PRIMARY KEY (run_id, id),
			KEY demo_orders_event (run_id, event_id)
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
		`CREATE TABLE IF NOT EXISTS {ledger} (
			id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
			run_id       VARCHAR(64)  NOT NULL,
			event_id     VARCHAR(255) NOT NULL,
			wallet_id    VARCHAR(64)  NOT NULL,
			amount_cents BIGINT       NOT NULL,
			KEY demo_ledger_event (run_id, event_id)
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
		`CREATE TABLE IF NOT EXISTS {wallets} (
			run_id        VARCHAR(64) NOT NULL,
			id            VARCHAR(64) NOT NULL,
			balance_cents BIGINT      NOT NULL DEFAULT 0,
			PRIMARY KEY (run_id, id)
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
	}
	// PostgresTables creates the tables on PostgreSQL.
	PostgresTables = []string{
		`CREATE TABLE IF NOT EXISTS {orders} (
			id           bigint  NOT NULL, -- order index within the run
			run_id       text    NOT NULL,
			event_id     text    NOT NULL,
			wallet_id    text    NOT NULL,
			amount_cents bigint  NOT NULL,
			valid        boolean NOT NULL, -- false for poison
			poison       text    NOT NULL DEFAULT '', -- '', invalid_json, missing_field, key_reuse, id_…, tenant_10k
			sent          boolean NOT NULL DEFAULT true,
			edge_accepted boolean NOT NULL DEFAULT false,
			PRIMARY KEY (run_id, id))`,
		`CREATE INDEX IF NOT EXISTS demo_orders_event ON {orders} (run_id, event_id)`,
		`CREATE TABLE IF NOT EXISTS {ledger} (
			id           bigserial PRIMARY KEY,
			run_id       text      NOT NULL,
			event_id     text      NOT NULL,
			wallet_id    text      NOT NULL,
			amount_cents bigint    NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS demo_ledger_event ON {ledger} (run_id, event_id)`,
		`CREATE TABLE IF NOT EXISTS {wallets} (
			run_id        text   NOT NULL,
			id            text   NOT NULL,
			balance_cents bigint NOT NULL DEFAULT 0,
			PRIMARY KEY (run_id, id))`,
	}
)
