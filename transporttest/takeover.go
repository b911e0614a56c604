package transporttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// testFencedSettle: a worker whose lease passed and whose message another worker of the same
// durable consumer took over can no longer settle it: its Ack, Extend, Nak and Term fail with
// an error wrapping idem.ErrLeaseLost and change nothing, so the new owner still holds the
// message (nobody else receives it) and its own Ack succeeds. A transport that lets the stale
// Ack through settles a message whose handler may still roll back.
func testFencedSettle(t *testing.T, h Harness) {
	topic := h.NewTopic(t)
	first := openSource(t, h, topic, "fenced", shortLease)
	second := openSource(t, h, topic, "fenced", longLease)
	m := idem.Message{EventID: newPrefix(t) + "-takeover", Payload: []byte("p")}
	publish(t, h.Sink(t), topic, m)

	stale := receiveN(t, first, 1, 5*time.Second)
	requireIDs(t, stale, m.EventID)
	// The first worker neither settles nor extends: past its lease the second one takes over.
	time.Sleep(shortLease)
	taken := receiveN(t, second, 1, shortLease+slack)
	requireIDs(t, taken, m.EventID)
	if got := taken[0].Message().Attempt; got != 2 {
		t.Errorf("event %s: Attempt = %d after the takeover, want 2", m.EventID, got)
	}

	settles := []struct {
		name string
		fn   func(ctx context.Context) error
	}{
		{"Ack", stale[0].Ack},
		{"Extend", stale[0].Extend},
		{"Nak(0)", func(ctx context.Context) error { return stale[0].Nak(ctx, 0) }},
		{"Nak(delay)", func(ctx context.Context) error { return stale[0].Nak(ctx, nakDelay) }},
		{"Term", stale[0].Term},
	}
	for _, s := range settles {
		err := call(t, s.name, callTimeout, s.fn)
		if !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("stale %s of event %s after the takeover = %v, want an error wrapping idem.ErrLeaseLost", s.name, m.EventID, err)
		}
	}
	// None of the stale settles moved the message: nobody receives it while its owner holds it.
	expectNone(t, first, shortLease+time.Second)
	ack(t, taken[0])
	expectNone(t, second, time.Second)
}
