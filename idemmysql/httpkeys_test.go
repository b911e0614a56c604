package idemmysql_test

import (
	"database/sql"
	"testing"

	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/storetest"
)

// TestIdempotencyKeys runs the Idempotency-Key middleware's checks against MySQL (MariaDB)
// (storetest.ExerciseIdempotencyKeys): the key table's statements, and the middleware through a
// real HTTP client and server.
func TestIdempotencyKeys(t *testing.T) {
	t.Parallel()
	storetest.ExerciseIdempotencyKeys(t, factoryFor(idemmysql.Config{}))
}

// TestIdempotencyKeysReadCommitted runs the same checks with InTx at READ COMMITTED: the key's
// statements must not depend on REPEATABLE READ's snapshot (the default above).
func TestIdempotencyKeysReadCommitted(t *testing.T) {
	t.Parallel()
	storetest.ExerciseIdempotencyKeys(t, factoryFor(idemmysql.Config{Isolation: sql.LevelReadCommitted}))
}

// BenchmarkIdempotencyKeys measures a POST through the middleware on MySQL
// (storetest.BenchmarkIdempotencyKeys).
func BenchmarkIdempotencyKeys(b *testing.B) {
	storetest.BenchmarkIdempotencyKeys(b, factoryFor(idemmysql.Config{}))
}
