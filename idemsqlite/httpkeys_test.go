package idemsqlite_test

import (
	"testing"

	"github.com/idemkit/idem/storetest"
)

// TestIdempotencyKeys runs the Idempotency-Key middleware's checks against SQLite
// (storetest.ExerciseIdempotencyKeys): the key table's statements, and the middleware through a
// real HTTP client and server.
func TestIdempotencyKeys(t *testing.T) {
	t.Parallel()
	storetest.ExerciseIdempotencyKeys(t, factory)
}

// BenchmarkIdempotencyKeys measures a POST through the middleware on SQLite
// (storetest.BenchmarkIdempotencyKeys).
func BenchmarkIdempotencyKeys(b *testing.B) {
	storetest.BenchmarkIdempotencyKeys(b, factory)
}
