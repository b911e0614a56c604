package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemdlq"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/retry"
)

// recorder is an idem.Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []idem.Observation
	paused int
}

func (r *recorder) Observe(ev idem.Observation) {
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
		cfg.Failure.DeadLetterFailuresToPause = 3
		cfg.Observe.Observer = rec
		cfg.Observe.Logger = slog.New(slog.NewJSONHandler(&syncWriter{w: &logs}, nil))
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
	require.Equal(t, idemtest.SettledNone, src.Settled("evt-1"), "neither acked nor terminated")
	require.Equal(t, 1, src.Naks(), "given back once")
	require.Empty(t, store.dls())
	require.Contains(t, logs.String(), "dead letters cannot be written")

	// The store comes back: a resumed consumer writes the dead letter and terminates.
	store.setFailDeadLetters(false)
	stop, _, _ := runFor(t, c, src)
	require.Eventually(t, func() bool { return src.Settled("evt-1") == "term" }, 10*time.Second, 10*time.Millisecond)
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
		cfg.Observe.Observer = rec
	})
	src := newMemSource(idem.Message{EventID: "evt-1", Tenant: "acme", Payload: []byte(`{}`)})
	stop, _, _ := runFor(t, c, src)
	require.Eventually(t, func() bool { return rec.count(idem.OutcomeDeadLetterFailed) >= 2 }, 10*time.Second, 5*time.Millisecond)
	store.setFailDeadLetters(false)
	require.Eventually(t, func() bool { return src.Settled("evt-1") == "term" }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())
	require.Zero(t, rec.pauses())
	require.Zero(t, src.Naks(), "kept, not nak'ed, while the write was retried")
	require.Len(t, store.dls(), 1)
}

// TestRetryBudgetCountsFromTheFirstAttempt: a message published long before the consumer got to
// it (a deploy, an outage) has spent none of its budget: its first transient failure is retried.
func TestRetryBudgetCountsFromTheFirstAttempt(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	rec := &recorder{}
	var calls sync.Map
	c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
		cfg.Failure.Retry = retry.Policy{MaxAttempts: 3, MaxElapsed: time.Minute, Base: time.Millisecond, Cap: 5 * time.Millisecond}
		cfg.Observe.Observer = rec
		cfg.Handler = func(ctx context.Context, tx *memTx, msg idem.Message) error {
			n, _ := calls.LoadOrStore(msg.EventID, new(atomic.Int64))
			if n.(*atomic.Int64).Add(1) == 1 {
				return idem.Transient(errors.New("upstream 503"))
			}
			return nil
		}
	})
	old := time.Now().Add(-time.Hour) // far beyond MaxElapsed, within Retention
	src := newMemSource(idem.Message{EventID: "evt-old", Payload: []byte(`{}`), PublishedAt: old})
	stop, _, _ := runFor(t, c, src)
	require.Eventually(t, func() bool { return src.Settled("evt-old") != "" }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, stop())
	require.Equal(t, idemtest.SettledAck, src.Settled("evt-old"), "retried and processed, not retries_exhausted")
	require.Empty(t, store.dls())
	require.Equal(t, 1, rec.count(idem.OutcomeRetried))

	// A transport that knows the first delivery was long ago (FirstAttempter) is believed.
	src = idemtest.NewSource(idemtest.SourceConfig{Name: "mem", FirstAttempt: time.Now().Add(-2 * time.Minute)})
	src.Push(idem.Message{EventID: "evt-known", Payload: []byte(`{}`)})
	stop, _, _ = runFor(t, c, src)
	require.Eventually(t, func() bool { return src.Settled("evt-known") != "" }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, stop())
	require.Equal(t, idemtest.SettledTerm, src.Settled("evt-known"))
	require.Len(t, store.dls(), 1)
	require.Equal(t, idem.ReasonRetriesExhausted, store.dls()[0].Reason)
}

// TestDeliveriesWithoutVerdictDoNotSpendTheBudget: deliveries given back at shutdown (the
// handler cancelled at the shutdown deadline) are not attempts; the broker's count of them is
// taken off, so a later transient failure is still retried.
func TestDeliveriesWithoutVerdictDoNotSpendTheBudget(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	rec := &recorder{}
	var calls atomic.Int64
	started := make(chan struct{}, 4)
	c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
		cfg.Failure.Retry = retry.Policy{MaxAttempts: 2, MaxElapsed: time.Minute, Base: time.Millisecond, Cap: 5 * time.Millisecond}
		cfg.ShutdownTimeout = 20 * time.Millisecond
		cfg.Observe.Observer = rec
		cfg.Handler = func(ctx context.Context, tx *memTx, msg idem.Message) error {
			switch calls.Add(1) {
			case 1, 2: // cut off by the shutdown deadline: no verdict
				started <- struct{}{}
				<-ctx.Done()
				return ctx.Err()
			case 3:
				return idem.Transient(errors.New("upstream 503"))
			}
			return nil
		}
	})
	src := newMemSource(idem.Message{EventID: "evt-1", Payload: []byte(`{}`)})
	for range 2 {
		stop, _, _ := runFor(t, c, src)
		<-started
		require.NoError(t, stop())
	}
	require.Equal(t, 2, rec.count(idem.OutcomeAbandoned))
	stop, _, _ := runFor(t, c, src)
	require.Eventually(t, func() bool { return src.Settled("evt-1") != "" }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, stop())
	require.Equal(t, idemtest.SettledAck, src.Settled("evt-1"), "the delivery on broker attempt 3 was attempt 1 of the budget")
	require.Empty(t, store.dls())
	require.EqualValues(t, 4, calls.Load())
}

func TestRunChecksSourceLimits(t *testing.T) {
	t.Parallel()
	policy := retry.Policy{MaxAttempts: 8, MaxElapsed: time.Minute, Base: time.Millisecond, Cap: 5 * time.Millisecond}
	for _, tc := range []struct {
		name   string
		limit  int
		window time.Duration
		want   []string // empty: Run starts
	}{
		{name: "unlimited, within the window", limit: 0, window: time.Hour},
		{name: "limit with the margin", limit: 8 + idem.DeliveryLimitMargin, window: time.Hour},
		{name: "limit without the margin", limit: 8 + idem.DeliveryLimitMargin - 1,
			want: []string{"source mem", "delivery limit is 12", "at least 13", "Failure.Retry.MaxAttempts 8", "DeliveryLimitMargin 5"}},
		{name: "the broker default of 1", limit: 1, want: []string{"delivery limit is 1"}},
		{name: "window longer than RedeliveryWindow", window: 25 * time.Hour,
			want: []string{"up to 25h0m0s after publishing", "Claims.RedeliveryWindow (24h0m0s)"}},
		{name: "both", limit: 3, window: 100 * 365 * 24 * time.Hour, want: []string{"delivery limit is 3", "RedeliveryWindow"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := memConsumer(t, newMemStore(), func(cfg *idem.ConsumerConfig[*memTx]) {
				cfg.Failure.Retry = policy
				cfg.Claims.RedeliveryWindow = 24 * time.Hour
			})
			src := idemtest.NewSource(idemtest.SourceConfig{Name: "mem", DeliveryLimit: tc.limit, RedeliveryWindow: tc.window})
			require.Equal(t, len(tc.want) == 0, idem.CheckSourceLimits(src, policy, 24*time.Hour) == nil)
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			err := c.Run(ctx, src)
			if len(tc.want) == 0 {
				require.NoError(t, err, "Run starts and stops at the deadline")
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

// TestUnauthenticatedInputIsStoredAsSuch: a forged copy of a legitimate message (same event id,
// tenant and payload, no valid signature) is dead-lettered without a tenant, the claimed one kept
// as untrusted text, and never merges into the legitimate message's pending dead letter.
func TestUnauthenticatedInputIsStoredAsSuch(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
		cfg.Handler = func(context.Context, *memTx, idem.Message) error { return idem.Permanent(errors.New("card declined")) }
		cfg.Input.Authenticator = idem.AuthenticatorFunc(func(_ context.Context, msg *idem.Message) error {
			if msg.Header("Sig") != "ok" {
				return fmt.Errorf("%w: no signature", idem.ErrUnauthenticated)
			}
			return nil
		})
	})
	legit := idem.Message{EventID: "evt-1", Tenant: "acme", Payload: []byte(`{"amount":1}`), Headers: map[string]string{"Sig": "ok"}}
	forged := legit.Clone()
	delete(forged.Headers, "Sig")
	src := newMemSource(legit)
	stop, _, _ := runFor(t, c, src)
	require.Eventually(t, func() bool { return len(store.dls()) == 1 }, 10*time.Second, 10*time.Millisecond)
	src.Push(forged)
	require.Eventually(t, func() bool { return len(store.dls()) == 2 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())

	dls := store.dls()
	require.Equal(t, idem.ReasonPermanentError, dls[0].Reason, "the legitimate dead letter is untouched")
	require.Equal(t, "acme", dls[0].Message.Tenant)
	require.Equal(t, "card declined", dls[0].Error[:len("card declined")])
	require.Equal(t, idem.ReasonUnauthenticated, dls[1].Reason)
	require.Empty(t, dls[1].Message.Tenant, "no tenant for what was never verified")
	require.Equal(t, "acme", dls[1].Message.Header(idem.HeaderUntrustedTenant))
	require.NotEqual(t, dls[0].Fingerprint, dls[1].Fingerprint)

	// An operator cannot replay it as if it were acme's.
	_, err := idemdlq.NewReplayer(store, discardSink{}, idemdlq.ReplayerConfig{}).Replay(context.Background(), idemdlq.ReplayParams{
		Selection: idemdlq.Selection{IDs: []int64{dls[1].ID}, Actor: "ops", Limit: 1}, Topic: "payments"})
	require.ErrorContains(t, err, "failed authentication")
}

// discardSink accepts every publish.
type discardSink struct{}

func (discardSink) Publish(context.Context, string, ...idem.Message) error { return nil }
func (discardSink) Close() error                                           { return nil }

// TestRetryLogIsReadableJSON: under a JSON handler the retry delay is text ("2ms"), not the
// nanosecond integer slog.Duration gives, so a person reading the log sees the delay.
func TestRetryLogIsReadableJSON(t *testing.T) {
	t.Parallel()
	var buf lockedBuffer
	store := newMemStore()
	var calls atomic.Int64
	c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
		cfg.Observe.Logger = slog.New(slog.NewJSONHandler(&buf, nil))
		cfg.Failure.Retry = retry.Policy{MaxAttempts: 3, MaxElapsed: time.Minute, Base: 2 * time.Millisecond, Cap: 2 * time.Millisecond}
		cfg.Handler = func(context.Context, *memTx, idem.Message) error {
			if calls.Add(1) == 1 {
				return idem.Transient(errors.New("upstream 503"))
			}
			return nil
		}
	})
	src := newMemSource(idem.Message{EventID: "evt-log", Payload: []byte(`{}`)})
	stop, _, _ := runFor(t, c, src)
	require.Eventually(t, func() bool { return src.Settled("evt-log") != "" }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, stop())
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if v, ok := rec["retry_in"]; ok {
			found = true
			s, isText := v.(string)
			require.True(t, isText, "retry_in is %T %v, want text", v, v)
			_, err := time.ParseDuration(s)
			require.NoError(t, err)
		}
	}
	require.True(t, found, "a retry was logged with retry_in:\n%s", buf.String())
}

// lockedBuffer is a bytes.Buffer safe for the runtime's concurrent log writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
