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
	first, second, stale, taken := takeover(t, h, "fenced")
	m := taken.Message()
	if m.Attempt != 2 {
		t.Errorf("event %s: Attempt = %d after the takeover, want 2", m.EventID, m.Attempt)
	}
	settles := []struct {
		name string
		fn   func(ctx context.Context) error
	}{
		{"Ack", stale.Ack},
		{"Extend", stale.Extend},
		{"Nak(0)", func(ctx context.Context) error { return stale.Nak(ctx, 0) }},
		{"Nak(delay)", func(ctx context.Context) error { return stale.Nak(ctx, nakDelay) }},
		{"Term", stale.Term},
	}
	for _, s := range settles {
		err := call(t, s.name, callTimeout, s.fn)
		if !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("stale %s of event %s after the takeover = %v, want an error wrapping idem.ErrLeaseLost", s.name, m.EventID, err)
		}
	}
	// None of the stale settles moved the message: nobody receives it while its owner holds it.
	expectNone(t, first, shortLease+time.Second)
	ack(t, taken)
	expectNone(t, second, time.Second)
}

// takeover publishes one message, receives it on a source with a short lease and lets that
// lease pass, so a second source of the same name takes it over; it returns both sources, the
// stale delivery and the new one.
func takeover(t *testing.T, h Harness, name string) (first, second idem.Source, stale, taken idem.Delivery) {
	t.Helper()
	topic := h.NewTopic(t)
	first = openSource(t, h, topic, name, shortLease)
	second = openSource(t, h, topic, name, longLease)
	m := idem.Message{EventID: newPrefix(t) + "-takeover", Payload: []byte("p")}
	publish(t, h.Sink(t), topic, m)

	old := receiveN(t, first, 1, 5*time.Second)
	requireIDs(t, old, m.EventID)
	// The first worker neither settles nor extends: past its lease the second one takes over.
	time.Sleep(shortLease)
	got := receiveN(t, second, 1, shortLease+slack)
	requireIDs(t, got, m.EventID)
	return first, second, old[0], got[0]
}

// testLateSettleKeepsTakeover: a worker whose lease passed and whose message another worker took
// over may still call Nak or Extend on its old delivery (a handler that ran long, a retry that
// fires late). Both must fail with an error wrapping idem.ErrLeaseLost and move nothing: the new
// owner keeps the message (nobody else receives it meanwhile) and its Ack settles it. An Extend
// that succeeds keeps the old handler running beside the new owner's; a Nak passed on would hand
// the message to a third worker while the new owner's transaction may still commit. SQS and
// Pub/Sub accept an old receipt handle or ack id for a visibility or deadline change, so
// idemsqs and idempubsub refuse them by the lease they count themselves.
func testLateSettleKeepsTakeover(t *testing.T, h Harness) {
	first, second, stale, taken := takeover(t, h, "fenced") // a name SourceNames lists
	for _, s := range []struct {
		name string
		fn   func(ctx context.Context) error
	}{
		{"Extend", stale.Extend},
		{"Nak(0)", func(ctx context.Context) error { return stale.Nak(ctx, 0) }},
		{"Nak(delay)", func(ctx context.Context) error { return stale.Nak(ctx, nakDelay) }},
	} {
		err := call(t, s.name, callTimeout, s.fn)
		if !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("late %s of event %s = %v, want an error wrapping idem.ErrLeaseLost", s.name, taken.Message().EventID, err)
		}
	}
	expectNone(t, first, shortLease+time.Second)
	ack(t, taken)
	expectNone(t, second, time.Second)
}
