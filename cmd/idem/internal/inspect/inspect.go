// Package inspect runs the read-only queries over a store's tables that the store interfaces do
// not offer (claims per consumer, claims per minute, the outbox per partition), for idem status
// and the dashboard. Table names are the store's configured prefix (in its schema on
// PostgreSQL); the stores validate prefix and schema as plain identifiers and they are quoted
// here besides.
package inspect

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
)

// ClaimCount is one consumer's claims: the events it processed within the claim retention.
type ClaimCount struct {
	Consumer string
	Count    int64
	// Last is the newest claim's creation time.
	Last time.Time
}

// ClaimCounts counts claims per consumer, ordered by consumer.
func ClaimCounts(ctx context.Context, s *connect.Stores) ([]ClaimCount, error) {
	const q = `SELECT consumer, COUNT(*), MAX(created_at) FROM %s GROUP BY consumer ORDER BY consumer`
	if db, table, ok := sqlTable(s, "claims"); ok {
		return scanSQL(ctx, db, fmt.Sprintf(q, table), nil, func(r *sql.Rows) (ClaimCount, error) {
			var (
				c      ClaimCount
				micros int64
			)
			err := r.Scan(&c.Consumer, &c.Count, &micros)
			c.Last = time.UnixMicro(micros).UTC()
			return c, err
		})
	}
	if s.Postgres != nil {
		rows, err := s.Postgres.Pool().Query(ctx, fmt.Sprintf(q, pgTable(s, "claims")))
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ClaimCount, error) {
			var c ClaimCount
			err := r.Scan(&c.Consumer, &c.Count, &c.Last)
			c.Last = c.Last.UTC()
			return c, err
		})
	}
	return nil, noSQL(s)
}

// RatePoint is how many claims a consumer created in one time bucket.
type RatePoint struct {
	Consumer string
	// Start is the bucket's start.
	Start time.Time
	Count int64
}

// ClaimRate counts claims per consumer per bucket created since since: the consumers'
// throughput over time, as far back as the claim retention keeps claims. Empty buckets are
// absent.
func ClaimRate(ctx context.Context, s *connect.Stores, since time.Time, bucket time.Duration) ([]RatePoint, error) {
	if bucket < time.Second {
		return nil, fmt.Errorf("inspect: bucket %s is under a second", bucket)
	}
	if db, table, ok := sqlTable(s, "claims"); ok {
		// created_at is microseconds since the epoch on SQLite and MySQL.
		us := bucket.Microseconds()
		div := "/"
		if s.MySQL != nil {
			div = " DIV "
		}
		q := fmt.Sprintf(`SELECT consumer, created_at%s%d AS b, COUNT(*) FROM %s WHERE created_at >= ? GROUP BY consumer, b ORDER BY consumer, b`,
			div, us, table)
		return scanSQL(ctx, db, q, []any{since.UnixMicro()}, func(r *sql.Rows) (RatePoint, error) {
			var (
				p RatePoint
				b int64
			)
			err := r.Scan(&p.Consumer, &b, &p.Count)
			p.Start = time.UnixMicro(b * us).UTC()
			return p, err
		})
	}
	if s.Postgres != nil {
		secs := int64(bucket / time.Second)
		q := fmt.Sprintf(`SELECT consumer, floor(extract(epoch FROM created_at) / %d)::bigint AS b, count(*) FROM %s
			WHERE created_at >= $1 GROUP BY consumer, b ORDER BY consumer, b`, secs, pgTable(s, "claims"))
		rows, err := s.Postgres.Pool().Query(ctx, q, since)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (RatePoint, error) {
			var (
				p RatePoint
				b int64
			)
			err := r.Scan(&p.Consumer, &b, &p.Count)
			p.Start = time.Unix(b*secs, 0).UTC()
			return p, err
		})
	}
	return nil, noSQL(s)
}

// PartitionBacklog is one outbox partition's rows waiting to be published (dead rows excluded,
// as in the store's OutboxStats).
type PartitionBacklog struct {
	Partition int
	Backlog   int64
	// Oldest is the oldest waiting row's creation time.
	Oldest time.Time
}

// OutboxPartitions reports the backlog and oldest row of each outbox partition that has one,
// ordered by partition.
func OutboxPartitions(ctx context.Context, s *connect.Stores) ([]PartitionBacklog, error) {
	const q = `SELECT %s, COUNT(*), MIN(created_at) FROM %s WHERE published_at IS NULL AND NOT dead GROUP BY %[1]s ORDER BY %[1]s`
	if db, table, ok := sqlTable(s, "outbox"); ok {
		col := `"partition"`
		if s.MySQL != nil {
			col = "partition_id"
		}
		return scanSQL(ctx, db, fmt.Sprintf(q, col, table), nil, func(r *sql.Rows) (PartitionBacklog, error) {
			var (
				p      PartitionBacklog
				micros int64
			)
			err := r.Scan(&p.Partition, &p.Backlog, &micros)
			p.Oldest = time.UnixMicro(micros).UTC()
			return p, err
		})
	}
	if s.Postgres != nil {
		rows, err := s.Postgres.Pool().Query(ctx, fmt.Sprintf(q, "partition", pgTable(s, "outbox")))
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionBacklog, error) {
			var p PartitionBacklog
			err := r.Scan(&p.Partition, &p.Backlog, &p.Oldest)
			p.Oldest = p.Oldest.UTC()
			return p, err
		})
	}
	return nil, noSQL(s)
}

// sqlTable returns the database/sql handle and quoted table name of a SQLite or MySQL store.
func sqlTable(s *connect.Stores, name string) (*sql.DB, string, bool) {
	switch {
	case s.SQLite != nil:
		return s.SQLite.DB(), `"` + s.SQLite.Config().Prefix + name + `"`, true
	case s.MySQL != nil:
		return s.MySQL.DB(), "`" + s.MySQL.Config().Prefix + name + "`", true
	}
	return nil, "", false
}

// pgTable is the quoted, schema-qualified name of a PostgreSQL store's table.
func pgTable(s *connect.Stores, name string) string {
	cfg := s.Postgres.Config()
	return pgx.Identifier{cfg.Schema, cfg.Prefix + name}.Sanitize()
}

func scanSQL[T any](ctx context.Context, db *sql.DB, q string, args []any, scan func(*sql.Rows) (T, error)) ([]T, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func noSQL(s *connect.Stores) error {
	return fmt.Errorf("store %s: no SQL database to inspect", s.URL)
}

// PendingCount is one consumer's pending dead letters.
type PendingCount struct {
	Consumer string
	Count    int64
	// Oldest is the first failure of the oldest one.
	Oldest time.Time
}

// PendingDeadLetters counts pending dead letters per consumer with the oldest first failure,
// ordered by consumer: one grouped query instead of reading every row.
func PendingDeadLetters(ctx context.Context, s *connect.Stores) ([]PendingCount, error) {
	const q = `SELECT consumer, COUNT(*), MIN(first_failed_at) FROM %s WHERE status = 'pending' GROUP BY consumer ORDER BY consumer`
	if db, table, ok := sqlTable(s, "dead_letters"); ok {
		return scanSQL(ctx, db, fmt.Sprintf(q, table), nil, func(r *sql.Rows) (PendingCount, error) {
			var (
				c      PendingCount
				micros int64
			)
			err := r.Scan(&c.Consumer, &c.Count, &micros)
			c.Oldest = time.UnixMicro(micros).UTC()
			return c, err
		})
	}
	if s.Postgres != nil {
		rows, err := s.Postgres.Pool().Query(ctx, fmt.Sprintf(q, pgTable(s, "dead_letters")))
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (PendingCount, error) {
			var c PendingCount
			err := r.Scan(&c.Consumer, &c.Count, &c.Oldest)
			c.Oldest = c.Oldest.UTC()
			return c, err
		})
	}
	return nil, noSQL(s)
}

// PendingSources returns the distinct sources of pending dead letters ("queue:payments",
// "outbox:orders", a stream), sorted.
func PendingSources(ctx context.Context, s *connect.Stores) ([]string, error) {
	const q = `SELECT DISTINCT source FROM %s WHERE status = 'pending' ORDER BY source`
	if db, table, ok := sqlTable(s, "dead_letters"); ok {
		return scanSQL(ctx, db, fmt.Sprintf(q, table), nil, func(r *sql.Rows) (string, error) {
			var src string
			return src, r.Scan(&src)
		})
	}
	if s.Postgres != nil {
		rows, err := s.Postgres.Pool().Query(ctx, fmt.Sprintf(q, pgTable(s, "dead_letters")))
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[string])
	}
	return nil, noSQL(s)
}

// RecoveryTimes returns, for the most recently recovered dead letters (at most limit), the time
// from each one's first failure to the processing of its replay.
func RecoveryTimes(ctx context.Context, s *connect.Stores, limit int) ([]time.Duration, error) {
	if db, table, ok := sqlTable(s, "dead_letters"); ok {
		q := fmt.Sprintf(`SELECT recovered_at - first_failed_at FROM %s WHERE recovered_at IS NOT NULL ORDER BY recovered_at DESC LIMIT ?`, table)
		return scanSQL(ctx, db, q, []any{limit}, func(r *sql.Rows) (time.Duration, error) {
			var micros int64
			err := r.Scan(&micros)
			return time.Duration(micros) * time.Microsecond, err
		})
	}
	if s.Postgres != nil {
		q := fmt.Sprintf(`SELECT (extract(epoch FROM recovered_at - first_failed_at) * 1000000)::bigint FROM %s
			WHERE recovered_at IS NOT NULL ORDER BY recovered_at DESC LIMIT $1`, pgTable(s, "dead_letters"))
		rows, err := s.Postgres.Pool().Query(ctx, q, limit)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (time.Duration, error) {
			var micros int64
			err := r.Scan(&micros)
			return time.Duration(micros) * time.Microsecond, err
		})
	}
	return nil, noSQL(s)
}

// IgnoredCounts counts, per consumer, the events its handler ignored (idem.Ignore): the audit
// rows with action idem.AuditActionIgnore, whose actor is the consumer.
func IgnoredCounts(ctx context.Context, s *connect.Stores) (map[string]int64, error) {
	const q = `SELECT actor, COUNT(*) FROM %s WHERE action = %s GROUP BY actor`
	type count struct {
		actor string
		n     int64
	}
	var rows []count
	var err error
	if db, table, ok := sqlTable(s, "audit"); ok {
		rows, err = scanSQL(ctx, db, fmt.Sprintf(q, table, "?"), []any{idem.AuditActionIgnore}, func(r *sql.Rows) (count, error) {
			var c count
			return c, r.Scan(&c.actor, &c.n)
		})
	} else if s.Postgres != nil {
		var pr pgx.Rows
		if pr, err = s.Postgres.Pool().Query(ctx, fmt.Sprintf(q, pgTable(s, "audit"), "$1"), idem.AuditActionIgnore); err == nil {
			rows, err = pgx.CollectRows(pr, func(r pgx.CollectableRow) (count, error) {
				var c count
				return c, r.Scan(&c.actor, &c.n)
			})
		}
	} else {
		return nil, noSQL(s)
	}
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(rows))
	for _, c := range rows {
		out[c.actor] = c.n
	}
	return out, nil
}
