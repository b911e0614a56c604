package idemsqlite_test

import (
	"testing"

	"github.com/idemkit/idem/storetest"
)

// TestDeadLetters runs the dead letter store's conformance checks (storetest.ExerciseDeadLetters).
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	storetest.ExerciseDeadLetters(t, factory)
}
