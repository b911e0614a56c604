package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// recorder is an idem.Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []idem.Event
	paused int
}

func (r *recorder) Observe(ev idem.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
}

func (r *recorder) Paused(string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.paused++
}

func (r *recorder) count(o idem.Outcome) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ev := range r.events {
		if ev.Outcome == o {
			n++
		}
	}
	return n
}

func (r *recorder) pauses() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.paused
}

// runFor runs c over src until stop is called (or the test ends). stop cancels Run and returns
// its error; done is closed when Run returns, and err then holds its error.
func runFor(t *testing.T, c *idem.Consumer[*memTx], src idem.Source) (stop func() error, done <-chan struct{}, err *error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{})
	var runErr error
	go func() { runErr = c.Run(ctx, src); close(ch) }()
	stop = func() error {
		cancel()
		select {
		case <-ch:
			return runErr
		case <-time.After(10 * time.Second):
			return errors.New("Run did not return within 10s")
		}
	}
	t.Cleanup(func() { _ = stop() })
	return stop, ch, &runErr
}

func TestDeadLetterWriteFailureKeepsMessageAndPauses(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	store.setFailDeadLetters(true)
	rec := &recorder{}
	var logs bytes.Buffer
	c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
		cfg.Handler = func(context.Context, *memTx, idem.Message) error { return idem.Permanent(errors.New("card declined")) }
		cfg.DeadLetterFailuresToPause = 3
		cfg.Observer = rec
		cfg.Logger = slog.New(slog.NewJSONHandler(&syncWriter{w: &logs}, nil))
	})
	src := newMemSource(idem.Message{EventID: "evt-1", Tenant: "acme", Payload: []byte(`{}`)})
	_, done, runErr := runFor(t, c, src)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the consumer did not pause")
	}
	err := *runErr
	require.ErrorIs(t, err, idem.ErrPaused)
	var pe *idem.PausedError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "ledger@v1", pe.Consumer)
	require.ErrorContains(t, err, "memstore: connection refused", "the cause is named")
	require.ErrorContains(t, err, `(event "evt-1")`)
	require.Equal(t, 3, rec.count(idem.OutcomeDeadLetterFailed), "each failed write is counted")
	require.Equal(t, 1, rec.count(idem.OutcomeAbandoned), "then the delivery is given back without a verdict")
	require.Zero(t, rec.count(idem.OutcomeRetried), "no nak with a retry delay")
	require.Equal(t, 1, rec.pauses())
	require.Equal(t, "", src.settledAs("evt-1"), "neither acked nor terminated")
	require.Equal(t, 1, src.nakCount(), "given back once")
	require.Empty(t, store.dls())
	require.Contains(t, logs.String(), "dead letters cannot be written")

	// The store comes back: a resumed consumer writes the dead letter and terminates.
	store.setFailDeadLetters(false)
	stop, _, _ := runFor(t, c, src)
	require.Eventually(t, func() bool { return src.settledAs("evt-1") == "term" }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())
	require.Len(t, store.dls(), 1)
	require.Equal(t, idem.ReasonPermanentError, store.dls()[0].Reason)
}

// TestDeadLetterWriteRecoversWithinTheRetries: a store that fails twice and then accepts gets
// the dead letter on the third write, without a pause.
func TestDeadLetterWriteRecoversWithinTheRetries(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	store.setFailDeadLetters(true)
	rec := &recorder{}
	c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
		cfg.Handler = func(context.Context, *memTx, idem.Message) error { return idem.Permanent(errors.New("card declined")) }
		cfg.Observer = rec
	})
	src := newMemSource(idem.Message{EventID: "evt-1", Tenant: "acme", Payload: []byte(`{}`)})
	stop, _, _ := runFor(t, c, src)
	require.Eventually(t, func() bool { return rec.count(idem.OutcomeDeadLetterFailed) >= 2 }, 10*time.Second, 5*time.Millisecond)
	store.setFailDeadLetters(false)
	require.Eventually(t, func() bool { return src.settledAs("evt-1") == "term" }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())
	require.Zero(t, rec.pauses())
	require.Zero(t, src.nakCount(), "kept, not nak'ed, while the write was retried")
	require.Len(t, store.dls(), 1)
}
