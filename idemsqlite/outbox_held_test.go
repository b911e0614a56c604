package idemsqlite_test

import (
	"testing"

	"github.com/idemkit/idem/storetest"
)

// TestOutboxHeldRows runs the conformance check of first attempt times and dead rows holding
// their key (storetest.ExerciseOutboxHeldRows).
func TestOutboxHeldRows(t *testing.T) {
	t.Parallel()
	storetest.ExerciseOutboxHeldRows(t, factory)
}

// TestQueueRelease runs the conformance check of a job given back by a Receive that ended
// (storetest.ExerciseQueueRelease).
func TestQueueRelease(t *testing.T) {
	t.Parallel()
	storetest.ExerciseQueueRelease(t, factory)
}
