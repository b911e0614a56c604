package idemmysql_test

import (
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

// BenchmarkIdempotencyKeys measures a POST through the middleware on MySQL
// (storetest.BenchmarkIdempotencyKeys).
func BenchmarkIdempotencyKeys(b *testing.B) {
	storetest.BenchmarkIdempotencyKeys(b, factoryFor(idemmysql.Config{}))
}
