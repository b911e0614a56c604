package e2e_test

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/storetest"
)

// BenchmarkProcess compares the single-event path on the stores:
// go test -run=^$ -bench=Process -benchtime=3000x ./internal/e2e
func BenchmarkProcess(b *testing.B) {
	b.Run("postgres", func(b *testing.B) {
		storetest.Benchmark(b, func(tb testing.TB) storetest.Bundle[pgx.Tx] { _, bu := testdb.Postgres(tb); return bu })
	})
	b.Run("mysql", func(b *testing.B) {
		storetest.Benchmark(b, func(tb testing.TB) storetest.Bundle[*sql.Tx] { _, bu := testdb.MySQL(tb); return bu })
	})
	b.Run("sqlite", func(b *testing.B) {
		storetest.Benchmark(b, func(tb testing.TB) storetest.Bundle[*sql.Tx] { _, bu := testdb.SQLite(tb); return bu })
	})
}
