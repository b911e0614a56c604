package transporttest

import (
	"testing"

	"github.com/idemkit/idem"
)

// testFanOut: sources of two names on one topic (two subscriptions, consumer groups or
// durables), all opened before the publish, each receive every message once; a second source of
// the first name shares that name's messages with the first, never taking one the other holds;
// and nothing comes back after every delivery was acked.
func testFanOut(t *testing.T, h Harness) {
	const n, firstTake = 12, 5
	topic := h.NewTopic(t)
	ledger := openSource(t, h, topic, "ledger", longLease)
	ledger2 := openSource(t, h, topic, "ledger", longLease)
	email := openSource(t, h, topic, "email", longLease)
	msgs, ids := numbered(t, n)
	publish(t, h.Sink(t), topic, msgs...)

	first := receiveN(t, ledger, firstTake, slack)
	if len(first) == 0 {
		t.Fatalf("the first ledger source received nothing within %v", slack)
	}
	rest := receiveN(t, ledger2, n-len(first), slack+slack)
	shared := append(append([]idem.Delivery(nil), first...), rest...)
	requireIDs(t, shared, ids...) // each once: the second source took none the first holds
	mails := receiveN(t, email, n, slack+slack)
	requireIDs(t, mails, ids...)
	for _, d := range append(shared, mails...) {
		ack(t, d)
	}
	for _, src := range []idem.Source{ledger, ledger2, email} {
		expectNone(t, src, shortLease)
	}
}
