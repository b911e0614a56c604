package e2e_test

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/storetest"
)

func pgBundle(tb testing.TB) storetest.Bundle[pgx.Tx] { _, b := testdb.Postgres(tb); return b }

func sqliteBundle(tb testing.TB) storetest.Bundle[*sql.Tx] { _, b := testdb.SQLite(tb); return b }

func TestBatchConformancePostgres(t *testing.T) {
	t.Parallel()
	storetest.ExerciseBatch(t, pgBundle)
}

func mysqlBundle(tb testing.TB) storetest.Bundle[*sql.Tx] { _, b := testdb.MySQL(tb); return b }

func TestBatchConformanceMySQL(t *testing.T) {
	t.Parallel()
	storetest.ExerciseBatch(t, mysqlBundle)
}

func TestBatchConformanceSQLite(t *testing.T) {
	t.Parallel()
	storetest.ExerciseBatch(t, sqliteBundle)
}
