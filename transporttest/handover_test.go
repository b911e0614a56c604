package transporttest_test

import (
	"testing"

	"github.com/idemkit/idem/transporttest"
)

// TestExerciseHandoverInMemory runs the handover check against the in-memory broker, whose
// sources of one name share a durable cursor, so the check itself runs on every build.
func TestExerciseHandoverInMemory(t *testing.T) {
	t.Parallel()
	b := &memBroker{topics: map[string]*memTopic{}}
	transporttest.ExerciseHandover(t, b.harness())
}
