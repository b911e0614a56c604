package idem_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/retry"
)

// traceKey keys what fakeTracer puts in contexts: the chain of spans, outermost first.
type traceKey struct{}

func chain(ctx context.Context) []string {
	c, _ := ctx.Value(traceKey{}).([]string)
	return c
}

func with(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, traceKey{}, append(append([]string(nil), chain(ctx)...), name))
}

// fakeTracer is an idem.Tracer that records what Run tells it.
type fakeTracer struct {
	mu       sync.Mutex
	events   map[string][]idem.Outcome // by event id
	results  map[string][]idem.Outcome // the events' Result, by event id
	handlers map[string][]string       // the chain each handler ran under, by event id
	ends     map[string][]error        // the handler errors, by event id
}

func newFakeTracer() *fakeTracer {
	return &fakeTracer{events: map[string][]idem.Outcome{}, results: map[string][]idem.Outcome{}, handlers: map[string][]string{}, ends: map[string][]error{}}
}

func (f *fakeTracer) StartDelivery(ctx context.Context, consumer, queue string, msg idem.Message) idem.DeliveryTrace {
	return &fakeDelivery{f: f, name: "delivery " + msg.EventID, id: msg.EventID}
}

func (f *fakeTracer) StartBatch(ctx context.Context, consumer, queue string, msgs []idem.Message) (context.Context, func()) {
	return with(ctx, "batch"), func() {}
}

func (f *fakeTracer) StartHandler(ctx context.Context, msg idem.Message) (context.Context, func(error)) {
	ctx = with(ctx, "handler")
	f.mu.Lock()
	f.handlers[msg.EventID] = chain(ctx)
	f.mu.Unlock()
	return ctx, func(err error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.ends[msg.EventID] = append(f.ends[msg.EventID], err)
	}
}

func (f *fakeTracer) outcomes(id string) []idem.Outcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]idem.Outcome(nil), f.events[id]...)
}

type fakeDelivery struct {
	f        *fakeTracer
	name, id string
}

func (d *fakeDelivery) Context(ctx context.Context) context.Context { return with(ctx, d.name) }

func (d *fakeDelivery) Observe(ev idem.Observation) {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	d.f.events[d.id] = append(d.f.events[d.id], ev.Outcome)
	d.f.results[d.id] = append(d.f.results[d.id], ev.Result)
}

// TestTracerSeesEveryDelivery: Run hands each delivery's verdict to its trace, runs the handler
// under the delivery's context (so a tracer's handler span is the delivery's child) and ends the
// handler's trace with what it returned, a panic included.
func TestTracerSeesEveryDelivery(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	tr := newFakeTracer()
	boom := errors.New("upstream 503")
	var calls sync.Map
	c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
		cfg.Observe.Tracer = tr
		cfg.Failure.Retry = retry.Policy{MaxAttempts: 3, MaxElapsed: time.Minute, Base: time.Millisecond, Cap: 2 * time.Millisecond}
		cfg.Handler = func(ctx context.Context, tx *memTx, msg idem.Message) error {
			n, _ := calls.LoadOrStore(msg.EventID, new(int))
			*n.(*int)++
			switch {
			case msg.EventID == "evt-retry" && *n.(*int) == 1:
				return idem.Transient(boom)
			case msg.EventID == "evt-panic":
				panic("bug")
			}
			return nil
		}
	})
	src := newMemSource(
		idem.Message{EventID: "evt-retry", Payload: []byte(`{}`)},
		idem.Message{EventID: "evt-panic", Payload: []byte(`{}`)},
		idem.Message{EventID: "evt-dup", Payload: []byte(`{}`)},
		idem.Message{EventID: "evt-dup", Payload: []byte(`{}`)},
	)
	stop, _, _ := runFor(t, c, src)
	require.Eventually(t, func() bool {
		return len(tr.outcomes("evt-retry")) == 2 && len(tr.outcomes("evt-panic")) == 1 && len(tr.outcomes("evt-dup")) == 2
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, stop())

	// The retry's verdict may reach its trace after the redelivery's (the nak goes first, and
	// the redelivery comes back within a millisecond), so the order is not checked.
	require.ElementsMatch(t, []idem.Outcome{idem.OutcomeRetried, idem.OutcomeProcessed}, tr.outcomes("evt-retry"))
	require.Equal(t, []idem.Outcome{idem.OutcomeDeadLettered}, tr.outcomes("evt-panic"))
	require.ElementsMatch(t, []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeDuplicate}, tr.outcomes("evt-dup"))

	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.ElementsMatch(t, []idem.Outcome{idem.OutcomeFailed, idem.OutcomeProcessed}, tr.results["evt-retry"])
	require.Equal(t, []idem.Outcome{idem.OutcomeFailed}, tr.results["evt-panic"])
	require.ElementsMatch(t, []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeDuplicate}, tr.results["evt-dup"])
	require.Equal(t, []string{"delivery evt-retry", "handler"}, tr.handlers["evt-retry"])
	require.Len(t, tr.ends["evt-retry"], 2)
	require.ErrorIs(t, tr.ends["evt-retry"][0], boom)
	require.NoError(t, tr.ends["evt-retry"][1])
	require.Len(t, tr.ends["evt-panic"], 1)
	require.ErrorContains(t, tr.ends["evt-panic"][0], "handler panic: bug")
	require.Len(t, tr.ends["evt-dup"], 1, "the duplicate ran the handler")
}
