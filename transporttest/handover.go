package transporttest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// ExerciseHandover checks a transport whose sources share work by name (a Kafka consumer group,
// competing consumers on one queue or durable): when one of two sources of the same name closes
// while it holds unsettled deliveries, nothing is lost — every message is acked by one of them —
// and an Ack on a held delivery after its source closed either fails or truly settled the
// message, which then never comes back. A transport that reports success for a settle it could
// no longer make (a Kafka offset of a partition it lost) would let the relay or the consumer
// believe in work nobody recorded.
//
// It is separate from Exercise so that only transports that declare shared sources run it; the
// harness's Source must let two sources of one name read the same topic at once.
func ExerciseHandover(t *testing.T, h Harness) {
	t.Helper()
	t.Run("HandoverOnClose", func(t *testing.T) {
		t.Parallel()
		testHandoverOnClose(t, h)
	})
}

// testHandoverOnClose: two sources share a topic; the first holds some deliveries and closes.
func testHandoverOnClose(t *testing.T, h Harness) {
	const n, held = 60, 10
	topic := h.NewTopic(t)
	msgs, ids := numbered(t, n)
	publish(t, h.Sink(t), topic, msgs...)

	first := openSource(t, h, topic, "handover", longLease)
	var hold []idem.Delivery
	deadline := time.Now().Add(5 * time.Second)
	for len(hold) < held && time.Now().Before(deadline) {
		ds, err := receive(t, first, held-len(hold), time.Until(deadline))
		if err != nil {
			break
		}
		hold = append(hold, ds...)
	}
	if len(hold) == 0 {
		t.Fatal("the first source received nothing to hold")
	}
	second := openSource(t, h, topic, "handover", longLease)

	var (
		mu    sync.Mutex
		acked = make(map[string]int)
		after = make(map[string]bool) // acked nil by the closed source: must not come back
	)
	ctx, cancel := context.WithTimeout(context.Background(), longLease+2*slack)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			ds, err := second.Receive(ctx, 10)
			if err != nil {
				return
			}
			for _, d := range ds {
				id := d.Message().EventID
				mu.Lock()
				if after[id] {
					t.Errorf("event %s came back after the closed source's Ack of it returned nil", id)
				}
				mu.Unlock()
				if call(t, "Ack", callTimeout, d.Ack) == nil {
					mu.Lock()
					acked[id]++
					done := len(acked) == n
					mu.Unlock()
					if done {
						// Leave a moment for a wrongly settled message to come back.
						time.AfterFunc(slack, cancel)
					}
				}
			}
		}
	})
	if err := first.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	for _, d := range hold {
		if call(t, "Ack after Close", callTimeout, d.Ack) == nil {
			mu.Lock()
			id := d.Message().EventID
			after[id] = true
			acked[id]++
			mu.Unlock()
		}
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if acked[id] == 0 {
			t.Errorf("event %s was never acked: lost when the first source closed", id)
		}
	}
}
