// Package consumertest checks the consumer runtime end to end: a real store, a real transport,
// Consumer.Run, and the behaviours that only show over time — retries within a budget, dead
// letters, lease extension, lost acks, pauses and graceful shutdown. It runs for every pair of
// store and transport, and a user can run it for their own.
package consumertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemdlq"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/storetest"
	"github.com/idemkit/idem/transporttest"
)

// Setup builds one isolated store and a transport harness that may use it (the queue table
// lives in the store).
type Setup[TTx any] func(tb testing.TB) (storetest.Bundle[TTx], transporttest.Harness)

// Recorder is an idem.Observer that keeps every event, for assertions.
type Recorder struct {
	mu     sync.Mutex
	events []idem.Observation
	paused atomic.Int64
}

// Observe records ev.
func (r *Recorder) Observe(ev idem.Observation) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
}

// Events returns the recorded events of eventID, in order.
func (r *Recorder) Events(eventID string) []idem.Observation {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []idem.Observation
	for _, ev := range r.events {
		if ev.EventID == eventID {
			out = append(out, ev)
		}
	}
	return out
}

// Paused counts pauses.
func (r *Recorder) Paused(string) { r.paused.Add(1) }

// Count returns how many events had outcome o (for eventID, when not empty).
func (r *Recorder) Count(o idem.Outcome, eventID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ev := range r.events {
		if ev.Outcome == o && (eventID == "" || ev.EventID == eventID) {
			n++
		}
	}
	return n
}

// Option varies the suite.
type Option func(*options)

type options struct {
	batch int
	set   bool
}

// Batched runs every check with batched processing (idem.BatchConfig) of up to size deliveries:
// each semantic of the per-event path must hold in batches too.
func Batched(size int) Option { return func(o *options) { o.batch = size } }

// SetBased runs every check with set-based batches of up to size deliveries: each check's
// handler also serves as an idem.SetHandler applied to every event of the set in turn, so every
// semantic of the per-event path (retries, dead letters, leases) must hold when a set fails and
// falls back event by event.
func SetBased(size int) Option { return func(o *options) { o.batch, o.set = size, true } }

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type env[TTx any] struct {
	logs   *syncBuffer
	opts   options
	t      *testing.T
	ctx    context.Context
	b      storetest.Bundle[TTx]
	h      transporttest.Harness
	topic  string
	sink   idem.Sink
	rec    *Recorder
	lease  time.Duration
	source func(name string) idem.Source
}

// fastRetry keeps the suite quick: tiny delays, a few attempts.
var fastRetry = retry.Policy{MaxAttempts: 5, MaxElapsed: time.Minute, Base: 20 * time.Millisecond, Cap: 100 * time.Millisecond}

func (e *env[TTx]) config(name string, h idem.Handler[TTx]) idem.ConsumerConfig[TTx] {
	var batch idem.BatchConfig
	if e.opts.batch > 0 {
		batch = idem.BatchConfig{Enabled: true, Size: e.opts.batch, MaxWait: 5 * time.Millisecond}
	}
	var set idem.SetHandler[TTx]
	if e.opts.set {
		set = func(ctx context.Context, tx TTx, msgs []idem.Message) error {
			for _, m := range msgs {
				if err := h(ctx, tx, m); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return idem.ConsumerConfig[TTx]{
		Batch:           batch,
		Name:            name,
		Owner:           "payments",
		Handler:         h,
		SetHandler:      set,
		Workers:         4,
		ShutdownTimeout: 5 * time.Second,
		Failure: idem.FailureConfig{
			Retry: fastRetry,
		},
		Claims: idem.ClaimConfig{
			Retention: 48 * time.Hour,
			// A day covers the harnesses' bounded redelivery windows (a stream's MaxAge; RabbitMQ's
			// message TTL + longest delay tier + consumer_timeout), which Run checks.
			RedeliveryWindow: 24 * time.Hour,
		},
		Observe: idem.ObserveConfig{
			Observer: e.rec,
			Logger:   slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		},
	}
}

func (e *env[TTx]) publish(msgs ...idem.Message) {
	e.t.Helper()
	require.NoError(e.t, e.sink.Publish(e.ctx, e.topic, msgs...))
}

// run starts c.Run on src in the background; stop cancels it and returns Run's error.
func (e *env[TTx]) run(c *idem.Consumer[TTx], src idem.Source) (stop func() error) {
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, src) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				err = errors.New("consumertest: Run did not return within 30s of cancel")
			}
		})
		return err
	}
	e.t.Cleanup(func() { _ = stop() })
	return stop
}

// eventually polls cond every 20ms until it holds or timeout passes.
func (e *env[TTx]) eventually(timeout time.Duration, what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("consumertest: timed out after %v waiting for %s; %s", timeout, what, e.seen(4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// seen describes what the check saw: the outcomes recorded so far and the end of the runtime's
// log, at most tail bytes of it.
func (e *env[TTx]) seen(tail int) string {
	e.rec.mu.Lock()
	outcomes := slices.Clone(e.rec.events)
	e.rec.mu.Unlock()
	logs := e.logs.String()
	if len(logs) > tail {
		logs = "…" + logs[len(logs)-tail:]
	}
	return fmt.Sprintf("outcomes so far: %+v; runtime log: %s", outcomes, logs)
}

func (e *env[TTx]) ledger(id string) int64 {
	n, err := e.b.LedgerRows(e.ctx, id)
	require.NoError(e.t, err)
	return n
}

func (e *env[TTx]) deadLetters(eventID string) []idem.DeadLetter {
	all, err := e.b.Store.ListDeadLetters(e.ctx, idemstore.DeadLetterFilter{Limit: 1000})
	require.NoError(e.t, err)
	var out []idem.DeadLetter
	for _, dl := range all {
		if dl.Message.EventID == eventID {
			out = append(out, dl)
		}
	}
	return out
}

// suiteLease is the lease of the checks' sources. A check that counts outcomes exactly breaks
// when a delivery outlives its lease (it ends abandoned, and comes again): on a loaded machine —
// the race detector, every package at once — a 1.5 s lease ran out once, so it is long enough
// that only a stall of seconds can do that, and short enough that the checks which wait out a
// lease stay brief.
const suiteLease = 3 * time.Second

// newEnv opens one check's store, topic and sink, with wallet w1.
func newEnv[TTx any](t *testing.T, setup Setup[TTx], o options) *env[TTx] {
	t.Helper()
	b, h := setup(t)
	e := &env[TTx]{logs: &syncBuffer{}, opts: o, t: t, ctx: context.Background(), b: b, h: h, rec: &Recorder{}, lease: suiteLease}
	e.topic = h.NewTopic(t)
	e.sink = h.Sink(t)
	e.source = func(name string) idem.Source { return h.Source(t, e.topic, name, e.lease) }
	require.NoError(t, b.CreateWallet(e.ctx, "w1"))
	// A failed check shows what the runtime saw and said: an exact count that is off under a
	// loaded CI run is otherwise a number without a cause.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("consumertest: %s", e.seen(8000))
		}
	})
	return e
}

// Exercise runs the runtime suite. Each subtest gets its own store, topic and consumer.
func Exercise[TTx any](t *testing.T, setup Setup[TTx], opts ...Option) {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	run := func(name string, fn func(e *env[TTx])) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(newEnv(t, setup, o))
		})
	}

	run("DuplicatesApplyOnce", func(e *env[TTx]) {
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", storetest.CreditHandler(e.b)))
		require.NoError(e.t, err)
		stop := e.run(c, e.source("ledger"))
		const n = 20
		for i := range n {
			m := storetest.PaymentMessage("acme", fmt.Sprintf("evt-%d", i), storetest.Payment{Wallet: "w1", Amount: 1})
			e.publish(m, m) // the same event twice: a republish
		}
		e.eventually(20*time.Second, "all events applied", func() bool {
			bal, err := e.b.Balance(e.ctx, "w1")
			return err == nil && bal >= n && e.rec.Count(idem.OutcomeProcessed, "") >= n
		})
		require.NoError(e.t, stop())
		for i := range n {
			require.EqualValues(e.t, 1, e.ledger(fmt.Sprintf("evt-%d", i)))
		}
		bal, err := e.b.Balance(e.ctx, "w1")
		require.NoError(e.t, err)
		require.EqualValues(e.t, n, bal)
	})

	run("TransientFailuresRetriedThenProcessed", func(e *env[TTx]) {
		var calls atomic.Int64
		var okAttempt atomic.Int64
		credit := storetest.CreditHandler(e.b)
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			if calls.Add(1) <= 2 {
				return idem.Transient(errors.New("upstream 503"))
			}
			okAttempt.Store(int64(msg.Attempt))
			return credit(ctx, tx, msg)
		}))
		require.NoError(e.t, err)
		stop := e.run(c, e.source("ledger"))
		e.publish(storetest.PaymentMessage("acme", "evt-t", storetest.Payment{Wallet: "w1", Amount: 5}))
		e.eventually(20*time.Second, "processed after two transient failures", func() bool { return e.rec.Count(idem.OutcomeProcessed, "evt-t") == 1 })
		require.NoError(e.t, stop())
		require.EqualValues(e.t, 3, okAttempt.Load(), "processed on attempt 3")
		require.Equal(e.t, 2, e.rec.Count(idem.OutcomeRetried, "evt-t"))
		require.EqualValues(e.t, 1, e.ledger("evt-t"))
		require.Empty(e.t, e.deadLetters("evt-t"))
	})

	run("RetryAfterHintIsHonoured", func(e *env[TTx]) {
		var calls atomic.Int64
		credit := storetest.CreditHandler(e.b)
		const hint = 700 * time.Millisecond // above the policy's 100ms cap: the hint wins
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			if calls.Add(1) == 1 {
				return idem.RetryAfter(errors.New("429 Too Many Requests"), hint)
			}
			return credit(ctx, tx, msg)
		}))
		require.NoError(e.t, err)
		stop := e.run(c, e.source("ledger"))
		start := time.Now()
		e.publish(storetest.PaymentMessage("acme", "evt-h", storetest.Payment{Wallet: "w1", Amount: 5}))
		e.eventually(20*time.Second, "processed after the hinted delay", func() bool { return e.rec.Count(idem.OutcomeProcessed, "evt-h") == 1 })
		require.NoError(e.t, stop())
		evs := e.rec.Events("evt-h")
		require.Equal(e.t, idem.OutcomeRetried, evs[0].Outcome)
		require.Equal(e.t, hint, evs[0].Delay, "the nak carries the destination's hint")
		if e.h.Features.DelayedNak {
			require.GreaterOrEqual(e.t, time.Since(start), hint, "not redelivered before the hint")
		}
		require.EqualValues(e.t, 1, e.ledger("evt-h"))
	})

	run("IgnoreAcksWithoutEffect", func(e *env[TTx]) {
		var (
			calls   atomic.Int64
			callsMu sync.Mutex
			callsOf = map[string]int{}
		)
		credit := storetest.CreditHandler(e.b)
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			calls.Add(1)
			callsMu.Lock()
			callsOf[msg.EventID]++
			callsMu.Unlock()
			if err := credit(ctx, tx, msg); err != nil {
				return err
			}
			if msg.EventID == "evt-gone" {
				return idem.Ignore("order_deleted") // written, then rolled back: the target is gone
			}
			return nil
		}))
		require.NoError(e.t, err)
		stop := e.run(c, e.source("ledger"))
		gone := storetest.PaymentMessage("acme", "evt-gone", storetest.Payment{Wallet: "w1", Amount: 5})
		e.publish(gone, storetest.PaymentMessage("acme", "evt-kept", storetest.Payment{Wallet: "w1", Amount: 7}))
		e.eventually(20*time.Second, "ignored and processed", func() bool {
			return e.rec.Count(idem.OutcomeIgnored, "evt-gone") == 1 && e.rec.Count(idem.OutcomeProcessed, "evt-kept") == 1
		})
		if !e.h.Features.BrokerDedup { // a broker that dedups would drop the republish
			e.publish(gone) // a redelivery of an ignored event is a duplicate
			e.eventually(20*time.Second, "the republish seen as a duplicate", func() bool { return e.rec.Count(idem.OutcomeDuplicate, "evt-gone") == 1 })
		}
		// Longer than a lease: an acked ignore must not come back.
		time.Sleep(e.lease + 500*time.Millisecond)
		require.NoError(e.t, stop())
		// A batch runs its other events again when one of them ends without savepoints (an
		// ignore included), and a failed set runs its events again one by one, both by design;
		// the ledger below shows their effects still apply once.
		if !e.opts.set && e.opts.batch == 0 {
			// Each delivery runs the handler at most once; a lease that ran out on a loaded
			// machine may bring a second delivery (the claim then decides), never a second run
			// within one delivery nor a run after the ignore was acked (the republish above is
			// a duplicate).
			callsMu.Lock()
			for _, id := range []string{"evt-gone", "evt-kept"} {
				require.GreaterOrEqual(e.t, callsOf[id], 1, "%s: the handler ran", id)
				require.LessOrEqual(e.t, callsOf[id], len(e.rec.Events(id)), "%s: at most one handler run per delivery (%d calls in all)", id, calls.Load())
			}
			callsMu.Unlock()
		}
		require.Equal(e.t, 1, e.rec.Count(idem.OutcomeIgnored, "evt-gone"))
		for _, ev := range e.rec.Events("evt-gone") {
			if ev.Outcome == idem.OutcomeIgnored {
				require.Equal(e.t, idem.Reason("order_deleted"), ev.Reason)
			}
		}
		require.EqualValues(e.t, 0, e.ledger("evt-gone"), "nothing of the ignored effect committed")
		require.EqualValues(e.t, 1, e.ledger("evt-kept"))
		bal, err := e.b.Balance(e.ctx, "w1")
		require.NoError(e.t, err)
		require.EqualValues(e.t, 7, bal)
		n, err := e.b.ClaimRows(e.ctx, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-gone"})
		require.NoError(e.t, err)
		require.EqualValues(e.t, 1, n, "the claim is kept")
		require.Empty(e.t, e.deadLetters("evt-gone"))
		if _, ok := e.b.Store.(idemstore.IgnoreStore[TTx]); ok {
			audit, err := e.b.Store.ListAudit(e.ctx, 100)
			require.NoError(e.t, err)
			var ignores int
			for _, a := range audit {
				if a.EventID == "evt-gone" && a.Action == idem.AuditActionIgnore {
					ignores++
					require.Equal(e.t, "order_deleted", a.Reason)
				}
			}
			require.Equal(e.t, 1, ignores, "one audit row")
		}
		require.Contains(e.t, e.logs.String(), `"reason":"order_deleted"`)
	})

	run("PermanentErrorDeadLettersOnce", func(e *env[TTx]) {
		var calls atomic.Int64
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			calls.Add(1)
			return idem.Permanent(errors.New("card declined; password=hunter2"))
		}))
		require.NoError(e.t, err)
		stop := e.run(c, e.source("ledger"))
		msg := storetest.PaymentMessage("acme", "evt-p", storetest.Payment{Wallet: "w1", Amount: 5})
		msg.Headers = map[string]string{"X-Trace": "abc"}
		e.publish(msg)
		e.eventually(20*time.Second, "dead letter", func() bool { return len(e.deadLetters("evt-p")) == 1 })
		// Longer than a lease: a terminated delivery must not come back.
		time.Sleep(e.lease + 500*time.Millisecond)
		require.NoError(e.t, stop())
		require.EqualValues(e.t, 1, calls.Load(), "never retried")
		dls := e.deadLetters("evt-p")
		require.Len(e.t, dls, 1)
		dl := dls[0]
		require.Equal(e.t, idem.ReasonPermanentError, dl.Reason)
		require.Equal(e.t, "ledger@v1", dl.Consumer)
		require.Equal(e.t, "v1", dl.ConsumerVersion())
		require.Equal(e.t, "payments", dl.Owner, "the consumer's owner is carried into its dead letters")
		if dl.Topic != "" { // a transport whose deliveries report their topic (idem.TopicReporter)
			require.Equal(e.t, e.topic, dl.Topic, "the dead letter records the topic it arrived on")
		}
		require.Equal(e.t, "acme", dl.Message.Tenant)
		require.Equal(e.t, msg.Payload, dl.Message.Payload)
		require.Equal(e.t, "abc", dl.Message.Headers["X-Trace"])
		require.Equal(e.t, 1, dl.Attempts)
		require.Contains(e.t, dl.Error, "card declined")
		require.NotContains(e.t, dl.Error, "hunter2", "secrets are redacted")
		require.Equal(e.t, idem.DeadLetterPending, dl.Status)
		require.False(e.t, dl.FirstFailed.IsZero())
		require.EqualValues(e.t, 0, e.ledger("evt-p"))

		// The runtime's log line carries the stable fields, and no secret.
		var line map[string]any
		for _, l := range strings.Split(e.logs.String(), "\n") {
			if strings.Contains(l, `"evt-p"`) && strings.Contains(l, `"dead_lettered"`) {
				require.NoError(e.t, json.Unmarshal([]byte(l), &line))
			}
		}
		require.NotNil(e.t, line, "a log line for the dead letter")
		for _, k := range []string{"event_id", "tenant", "consumer", "queue", "attempt", "outcome", "duration_ms", "error_type"} {
			require.Contains(e.t, line, k)
		}
		require.Equal(e.t, "permanent", line["error_type"])
		require.NotContains(e.t, e.logs.String(), "hunter2")
	})

	run("BudgetExhaustedDeadLetters", func(e *env[TTx]) {
		var calls atomic.Int64
		cfg := e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			calls.Add(1)
			return errors.New("still down")
		})
		cfg.Failure.Retry.MaxAttempts = 3
		c, err := idem.NewConsumer(e.b.Store, cfg)
		require.NoError(e.t, err)
		stop := e.run(c, e.source("ledger"))
		e.publish(storetest.PaymentMessage("acme", "evt-x", storetest.Payment{Wallet: "w1", Amount: 5}))
		e.eventually(20*time.Second, "retries_exhausted dead letter", func() bool { return len(e.deadLetters("evt-x")) == 1 })
		time.Sleep(e.lease + 500*time.Millisecond)
		require.NoError(e.t, stop())
		dl := e.deadLetters("evt-x")[0]
		require.Equal(e.t, idem.ReasonRetriesExhausted, dl.Reason)
		require.Equal(e.t, 3, dl.Attempts)
		require.EqualValues(e.t, 3, calls.Load())
	})

	run("KeyReuseDeadLetters", func(e *env[TTx]) {
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", storetest.CreditHandler(e.b)))
		require.NoError(e.t, err)
		stop := e.run(c, e.source("ledger"))
		e.publish(storetest.PaymentMessage("acme", "evt-k", storetest.Payment{Wallet: "w1", Amount: 5}))
		e.eventually(20*time.Second, "first processed", func() bool { return e.rec.Count(idem.OutcomeProcessed, "evt-k") == 1 })
		reuse := storetest.PaymentMessage("acme", "evt-k", storetest.Payment{Wallet: "w1", Amount: 500})
		// Through the broker on every transport: a broker whose deduplication dropped it (on the
		// event id alone) would hide key reuse for good.
		e.publish(reuse)
		e.eventually(20*time.Second, "key_reuse dead letter", func() bool { return len(e.deadLetters("evt-k")) == 1 })
		require.Equal(e.t, idem.ReasonKeyReuse, e.deadLetters("evt-k")[0].Reason)
		require.Contains(e.t, e.deadLetters("evt-k")[0].Error, `tenant "acme", consumer ledger@v1`)
		require.True(e.t, strings.HasSuffix(e.deadLetters("evt-k")[0].Error, ` (event "evt-k")`), "the event id once, at the end")
		require.NoError(e.t, stop())
		require.EqualValues(e.t, 1, e.ledger("evt-k"))
		bal, _ := e.b.Balance(e.ctx, "w1")
		require.EqualValues(e.t, 5, bal)
	})

	run("LostAckRedeliveredAsDuplicate", func(e *env[TTx]) {
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", storetest.CreditHandler(e.b)))
		require.NoError(e.t, err)
		src := &LoseFirstAck{Source: e.source("ledger")}
		stop := e.run(c, src)
		e.publish(storetest.PaymentMessage("acme", "evt-l", storetest.Payment{Wallet: "w1", Amount: 5}))
		e.eventually(30*time.Second, "redelivery recognised as duplicate", func() bool { return e.rec.Count(idem.OutcomeDuplicate, "evt-l") >= 1 })
		require.NoError(e.t, stop())
		require.EqualValues(e.t, 1, src.Lost.Load())
		require.Equal(e.t, 1, e.rec.Count(idem.OutcomeProcessed, "evt-l"))
		require.EqualValues(e.t, 1, e.ledger("evt-l"))
	})

	run("SlowHandlerKeepsLease", func(e *env[TTx]) {
		var calls atomic.Int64
		credit := storetest.CreditHandler(e.b)
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			calls.Add(1)
			select {
			case <-time.After(2*e.lease + e.lease/2):
			case <-ctx.Done():
				return ctx.Err()
			}
			return credit(ctx, tx, msg)
		}))
		require.NoError(e.t, err)
		stop := e.run(c, e.source("ledger"))
		e.publish(storetest.PaymentMessage("acme", "evt-s", storetest.Payment{Wallet: "w1", Amount: 5}))
		e.eventually(30*time.Second, "slow event processed", func() bool { return e.rec.Count(idem.OutcomeProcessed, "evt-s") == 1 })
		time.Sleep(e.lease)
		require.NoError(e.t, stop())
		require.EqualValues(e.t, 1, calls.Load(), "the lease was extended: no second delivery; %s", e.seen(4000))
		require.EqualValues(e.t, 1, e.ledger("evt-s"))
	})

	run("LostLeaseRollsBack", func(e *env[TTx]) {
		var calls atomic.Int64
		credit := storetest.CreditHandler(e.b)
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			if calls.Add(1) == 1 {
				if err := credit(ctx, tx, msg); err != nil {
					return err
				}
				<-ctx.Done() // the failed extension cancels us
				return ctx.Err()
			}
			return credit(ctx, tx, msg)
		}))
		require.NoError(e.t, err)
		src := &FailFirstExtend{Source: e.source("ledger")}
		stop := e.run(c, src)
		e.publish(storetest.PaymentMessage("acme", "evt-ll", storetest.Payment{Wallet: "w1", Amount: 5}))
		e.eventually(30*time.Second, "processed after the lease was lost", func() bool { return e.rec.Count(idem.OutcomeProcessed, "evt-ll") == 1 })
		require.NoError(e.t, stop())
		require.GreaterOrEqual(e.t, e.rec.Count(idem.OutcomeAbandoned, "evt-ll"), 1)
		require.EqualValues(e.t, 1, e.ledger("evt-ll"), "the first attempt's write rolled back")
		bal, _ := e.b.Balance(e.ctx, "w1")
		require.EqualValues(e.t, 5, bal)
	})

	run("PanicPausesConsumer", func(e *env[TTx]) {
		cfg := e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			panic("nil map in handler")
		})
		cfg.Failure.OnPanic = idem.PanicPause
		c, err := idem.NewConsumer(e.b.Store, cfg)
		require.NoError(e.t, err)
		ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
		defer cancel()
		e.publish(storetest.PaymentMessage("acme", "evt-pp", storetest.Payment{Wallet: "w1", Amount: 5}))
		err = c.Run(ctx, e.source("ledger"))
		require.ErrorIs(e.t, err, idem.ErrPaused)
		require.EqualValues(e.t, 1, e.rec.paused.Load())
		require.Empty(e.t, e.deadLetters("evt-pp"), "pausing does not drain into the dead-letter queue")
		// The message is still in the broker: a fixed consumer gets it.
		fixed, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", storetest.CreditHandler(e.b)))
		require.NoError(e.t, err)
		stop := e.run(fixed, e.source("ledger"))
		e.eventually(30*time.Second, "message processed after the fix", func() bool { return e.rec.Count(idem.OutcomeProcessed, "evt-pp") == 1 })
		require.NoError(e.t, stop())
		require.EqualValues(e.t, 1, e.ledger("evt-pp"))
	})

	run("PanicDeadLetters", func(e *env[TTx]) {
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			panic("index out of range")
		}))
		require.NoError(e.t, err)
		stop := e.run(c, e.source("ledger"))
		e.publish(storetest.PaymentMessage("acme", "evt-pd", storetest.Payment{Wallet: "w1", Amount: 5}))
		e.eventually(20*time.Second, "handler_panic dead letter", func() bool { return len(e.deadLetters("evt-pd")) == 1 })
		require.NoError(e.t, stop())
		require.Equal(e.t, idem.ReasonHandlerPanic, e.deadLetters("evt-pd")[0].Reason)
	})

	run("GracefulShutdownFinishesInFlight", func(e *env[TTx]) {
		started := make(chan struct{}, 1)
		credit := storetest.CreditHandler(e.b)
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			select {
			case started <- struct{}{}:
			default:
			}
			time.Sleep(300 * time.Millisecond)
			return credit(ctx, tx, msg)
		}))
		require.NoError(e.t, err)
		stop := e.run(c, e.source("ledger"))
		e.publish(storetest.PaymentMessage("acme", "evt-g", storetest.Payment{Wallet: "w1", Amount: 5}))
		select {
		case <-started:
		case <-time.After(20 * time.Second):
			e.t.Fatal("handler never started")
		}
		require.NoError(e.t, stop(), "shutdown returns nil")
		require.Equal(e.t, 1, e.rec.Count(idem.OutcomeProcessed, "evt-g"), "in-flight delivery finished")
		require.EqualValues(e.t, 1, e.ledger("evt-g"))
	})

	run("RetryBudgetCountsFromTheFirstAttempt", func(e *env[TTx]) {
		// The event waits in the broker longer than the whole elapsed budget (a deploy, an
		// outage): none of it is spent, so its first transient failure is retried. The lease is
		// long so that a loaded machine cannot end the first delivery without a verdict (an
		// abandoned delivery spends no attempt, but the elapsed budget runs on from it).
		e.lease = 15 * time.Second
		var calls atomic.Int64
		credit := storetest.CreditHandler(e.b)
		cfg := e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			if calls.Add(1) == 1 {
				return idem.Transient(errors.New("upstream 503"))
			}
			return credit(ctx, tx, msg)
		})
		cfg.Failure.Retry = retry.Policy{MaxAttempts: 5, MaxElapsed: 2 * time.Second, Base: 20 * time.Millisecond, Cap: 100 * time.Millisecond}
		c, err := idem.NewConsumer(e.b.Store, cfg)
		require.NoError(e.t, err)
		e.publish(storetest.PaymentMessage("acme", "evt-late", storetest.Payment{Wallet: "w1", Amount: 5}))
		time.Sleep(cfg.Failure.Retry.MaxElapsed + 500*time.Millisecond)
		stop := e.run(c, e.source("ledger"))
		e.eventually(20*time.Second, "processed after one retry", func() bool { return e.rec.Count(idem.OutcomeProcessed, "evt-late") == 1 })
		require.NoError(e.t, stop())
		require.Equal(e.t, 1, e.rec.Count(idem.OutcomeRetried, "evt-late"), "retried, not retries_exhausted: %+v", e.rec.Events("evt-late"))
		require.Empty(e.t, e.deadLetters("evt-late"))
		require.EqualValues(e.t, 1, e.ledger("evt-late"))
	})

	run("DeliveriesWithoutVerdictDoNotSpendTheBudget", func(e *env[TTx]) {
		// Two deliveries end without a verdict: the first loses its lease, the second is cut
		// off by the shutdown deadline and given back. Neither spends an attempt, so with two
		// attempts allowed the transient failure that follows is still retried.
		var calls atomic.Int64
		started := make(chan struct{}, 1)
		credit := storetest.CreditHandler(e.b)
		cfg := e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			switch calls.Add(1) {
			case 1: // the failed lease extension cancels it
				<-ctx.Done()
				return ctx.Err()
			case 2: // the shutdown deadline cancels it
				started <- struct{}{}
				<-ctx.Done()
				return ctx.Err()
			case 3:
				return idem.Transient(errors.New("upstream 503"))
			}
			return credit(ctx, tx, msg)
		})
		cfg.Failure.Retry.MaxAttempts = 2
		cfg.ShutdownTimeout = 300 * time.Millisecond
		c, err := idem.NewConsumer(e.b.Store, cfg)
		require.NoError(e.t, err)
		stop := e.run(c, &FailFirstExtend{Source: e.source("ledger")})
		e.publish(storetest.PaymentMessage("acme", "evt-nv", storetest.Payment{Wallet: "w1", Amount: 5}))
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			e.t.Fatal("consumertest: the delivery after the lost lease never came")
		}
		require.NoError(e.t, stop())
		require.Equal(e.t, 2, e.rec.Count(idem.OutcomeAbandoned, "evt-nv"), "two deliveries without a verdict")

		stop = e.run(c, e.source("ledger")) // the same consumer, resumed
		e.eventually(30*time.Second, "processed", func() bool { return e.rec.Count(idem.OutcomeProcessed, "evt-nv") == 1 })
		require.NoError(e.t, stop())
		require.Equal(e.t, 1, e.rec.Count(idem.OutcomeRetried, "evt-nv"), "the transient failure was attempt 1 of 2")
		require.Empty(e.t, e.deadLetters("evt-nv"), "not retries_exhausted")
		require.EqualValues(e.t, 4, calls.Load())
		require.EqualValues(e.t, 1, e.ledger("evt-nv"))
	})

	run("PayloadMustBeJSONByDefault", func(e *env[TTx]) {
		var calls atomic.Int64
		credit := storetest.CreditHandler(e.b)
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			calls.Add(1)
			return credit(ctx, tx, msg)
		}))
		require.NoError(e.t, err)
		stop := e.run(c, e.source("ledger"))
		truncated := storetest.PaymentMessage("acme", "evt-trunc", storetest.Payment{Wallet: "w1", Amount: 5})
		truncated.Payload = truncated.Payload[:len(truncated.Payload)-3]
		bom := storetest.PaymentMessage("acme", "evt-bom", storetest.Payment{Wallet: "w1", Amount: 5})
		bom.Payload = append([]byte("\ufeff"), bom.Payload...)
		e.publish(truncated, bom)
		e.eventually(20*time.Second, "both dead-lettered", func() bool {
			return len(e.deadLetters("evt-trunc")) == 1 && len(e.deadLetters("evt-bom")) == 1
		})
		require.NoError(e.t, stop())
		for _, id := range []string{"evt-trunc", "evt-bom"} {
			dl := e.deadLetters(id)[0]
			require.Equal(e.t, idem.ReasonInvalidPayload, dl.Reason, id)
			require.Contains(e.t, dl.Error, "payload is not JSON", id)
			require.EqualValues(e.t, 0, e.ledger(id), id)
		}
		require.Zero(e.t, calls.Load(), "the handler never saw them")

		// A consumer that declares its payloads are not JSON takes raw bytes.
		cfg := e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			n, err := e.b.Credit(ctx, tx, msg.EventID, "w1", int64(len(msg.Payload)))
			if err != nil {
				return err
			}
			return idem.ExpectRows(n, 1)
		})
		cfg.Input.Fingerprint.Raw = true
		raw, err := idem.NewConsumer(e.b.Store, cfg)
		require.NoError(e.t, err)
		stop = e.run(raw, e.source("ledger"))
		e.publish(idem.Message{EventID: "evt-raw", Tenant: "acme", Type: "payment.csv", Payload: []byte("w1;5")})
		e.eventually(20*time.Second, "raw payload processed", func() bool { return e.rec.Count(idem.OutcomeProcessed, "evt-raw") == 1 })
		require.NoError(e.t, stop())
		require.EqualValues(e.t, 1, e.ledger("evt-raw"))
	})

	run("DeadLetterWriteFailureKeepsMessageAndPauses", func(e *env[TTx]) {
		store := CutDeadLetters(e.b.Store)
		credit := storetest.CreditHandler(e.b)
		var refusals atomic.Int64
		handler := func(ctx context.Context, tx TTx, msg idem.Message) error {
			if msg.EventID == "evt-dlf" {
				refusals.Add(1)
				return idem.Permanent(errors.New("card declined"))
			}
			return credit(ctx, tx, msg)
		}
		cfg := e.config("ledger@v1", handler)
		cfg.Failure.DeadLetterFailuresToPause = 3
		c, err := idem.NewConsumer(store, cfg)
		require.NoError(e.t, err)
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx, e.source("ledger")) }()

		// Mid-run: the consumer works, then the dead-letter store is cut.
		e.publish(storetest.PaymentMessage("acme", "evt-ok", storetest.Payment{Wallet: "w1", Amount: 5}))
		e.eventually(20*time.Second, "first event processed", func() bool { return e.rec.Count(idem.OutcomeProcessed, "evt-ok") == 1 })
		store.Cut(true)
		e.publish(storetest.PaymentMessage("acme", "evt-dlf", storetest.Payment{Wallet: "w1", Amount: 5}))
		select {
		case err = <-done:
		case <-ctx.Done():
			e.t.Fatal("consumertest: the consumer neither dead-lettered nor paused")
		}
		require.ErrorIs(e.t, err, idem.ErrPaused, "Run returns ErrPaused with the cause")
		require.ErrorContains(e.t, err, errCut.Error())
		require.EqualValues(e.t, 3, store.Failures(), "the write was retried, then the consumer paused")
		require.Equal(e.t, 3, e.rec.Count(idem.OutcomeDeadLetterFailed, "evt-dlf"), "each failed write is counted")
		require.Zero(e.t, e.rec.Count(idem.OutcomeRetried, "evt-dlf"), "no nak that spends the broker's delivery limit with a delay")
		require.EqualValues(e.t, 1, e.rec.paused.Load())
		require.Empty(e.t, e.deadLetters("evt-dlf"))
		require.Contains(e.t, e.logs.String(), "dead letters cannot be written")

		// The store is back: the message is still in the broker, and a resumed consumer writes
		// its dead letter and terminates it.
		store.Cut(false)
		resumed, err := idem.NewConsumer(store, e.config("ledger@v1", handler))
		require.NoError(e.t, err)
		stop := e.run(resumed, e.source("ledger"))
		e.eventually(30*time.Second, "dead letter after the store came back", func() bool { return len(e.deadLetters("evt-dlf")) == 1 })
		time.Sleep(e.lease + 500*time.Millisecond) // a terminated delivery does not come back
		require.NoError(e.t, stop())
		require.EqualValues(e.t, 2, refusals.Load(), "handled once before the pause and once after")
		require.Equal(e.t, idem.ReasonPermanentError, e.deadLetters("evt-dlf")[0].Reason)
		require.EqualValues(e.t, 1, e.ledger("evt-ok"))
		require.EqualValues(e.t, 0, e.ledger("evt-dlf"))
	})

	run("PoisonIsNeverSettledWithoutItsDeadLetter", func(e *env[TTx]) {
		// Poison of three kinds (a handler's permanent error, a payload that is not JSON, key
		// reuse) meets a dead-letter store that refuses every write, a pause over it, and a
		// shutdown in the middle of the write's retries. None may be acked or terminated at the
		// broker before its dead letter committed: each stays redeliverable and, once the store
		// is back, ends as exactly one dead letter.
		store := CutDeadLetters(e.b.Store)
		credit := storetest.CreditHandler(e.b)
		handler := func(ctx context.Context, tx TTx, msg idem.Message) error {
			if msg.EventID == "evt-pz-perm" {
				return idem.Permanent(errors.New("card declined"))
			}
			return credit(ctx, tx, msg)
		}
		poison := func(m idem.Message) idem.Message {
			m.Headers = map[string]string{watchHeader: "1"}
			return m
		}
		perm := poison(storetest.PaymentMessage("acme", "evt-pz-perm", storetest.Payment{Wallet: "w1", Amount: 5}))
		notJSON := poison(storetest.PaymentMessage("acme", "evt-pz-json", storetest.Payment{Wallet: "w1", Amount: 5}))
		notJSON.Payload = notJSON.Payload[:len(notJSON.Payload)-2]
		reuse := poison(storetest.PaymentMessage("acme", "evt-pz-reuse", storetest.Payment{Wallet: "w1", Amount: 500}))
		ids := []string{perm.EventID, notJSON.EventID, reuse.EventID}
		committed := func(eventID string) bool { return len(e.deadLetters(eventID)) > 0 }
		watch := func() *SettleWatch[TTx] {
			return &SettleWatch[TTx]{Source: e.source("ledger"), Header: watchHeader, Committed: committed}
		}
		noEarlySettle := func(w *SettleWatch[TTx], when string) {
			e.t.Helper()
			require.Empty(e.t, w.Violations(), "%s: a poison event was settled before its dead letter committed", when)
		}

		// The key the poison reuses is claimed first, with the store whole.
		first, err := idem.NewConsumer(store, e.config("ledger@v1", handler))
		require.NoError(e.t, err)
		stop := e.run(first, e.source("ledger"))
		e.publish(storetest.PaymentMessage("acme", "evt-pz-reuse", storetest.Payment{Wallet: "w1", Amount: 5}))
		e.eventually(20*time.Second, "the reused key's first event processed", func() bool { return e.rec.Count(idem.OutcomeProcessed, "evt-pz-reuse") == 1 })
		require.NoError(e.t, stop())

		// Cut: the consumer retries the dead-letter writes, then pauses.
		store.Cut(true)
		e.publish(perm, notJSON, reuse, storetest.PaymentMessage("acme", "evt-pz-ok", storetest.Payment{Wallet: "w1", Amount: 7}))
		cfg := e.config("ledger@v1", handler)
		cfg.Failure.DeadLetterFailuresToPause = 3
		paused, err := idem.NewConsumer(store, cfg)
		require.NoError(e.t, err)
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		defer cancel()
		w := watch()
		err = paused.Run(ctx, w)
		noEarlySettle(w, "pause")
		require.ErrorIs(e.t, err, idem.ErrPaused, "the consumer pauses over dead letters it cannot write")

		// Still cut: a consumer that would retry for ever is shut down in the middle of it.
		cfg.Failure.DeadLetterFailuresToPause = 1 << 20
		cfg.ShutdownTimeout = 500 * time.Millisecond
		patient, err := idem.NewConsumer(store, cfg)
		require.NoError(e.t, err)
		w = watch()
		before := store.Failures()
		stop = e.run(patient, w)
		e.eventually(30*time.Second, "dead-letter writes retried", func() bool { return store.Failures() >= before+2 })
		require.NoError(e.t, stop(), "a shutdown mid-retry returns nil")
		noEarlySettle(w, "shutdown mid-retry")
		for _, id := range ids {
			require.Empty(e.t, e.deadLetters(id), id)
		}

		// The store is back: every poison event comes back and ends as one dead letter.
		store.Cut(false)
		resumed, err := idem.NewConsumer(store, e.config("ledger@v1", handler))
		require.NoError(e.t, err)
		w = watch()
		stop = e.run(resumed, w)
		e.eventually(30*time.Second, "a dead letter for each poison event", func() bool {
			for _, id := range ids {
				if len(e.deadLetters(id)) != 1 {
					return false
				}
			}
			return e.rec.Count(idem.OutcomeProcessed, "evt-pz-ok") == 1
		})
		time.Sleep(e.lease + 500*time.Millisecond) // a terminated delivery does not come back
		require.NoError(e.t, stop())
		noEarlySettle(w, "after the store came back")
		for _, id := range ids {
			require.Len(e.t, e.deadLetters(id), 1, id)
			require.Positive(e.t, w.Settled(id), "%s settled once its dead letter committed", id)
		}
		require.Equal(e.t, idem.ReasonPermanentError, e.deadLetters(perm.EventID)[0].Reason)
		require.Equal(e.t, idem.ReasonInvalidPayload, e.deadLetters(notJSON.EventID)[0].Reason)
		require.Equal(e.t, idem.ReasonKeyReuse, e.deadLetters(reuse.EventID)[0].Reason)
		require.EqualValues(e.t, 0, e.ledger(perm.EventID))
		require.EqualValues(e.t, 0, e.ledger(notJSON.EventID))
		require.EqualValues(e.t, 1, e.ledger("evt-pz-reuse"))
		require.EqualValues(e.t, 1, e.ledger("evt-pz-ok"))
		bal, err := e.b.Balance(e.ctx, "w1")
		require.NoError(e.t, err)
		require.EqualValues(e.t, 12, bal)
	})

	run("ReplayedDeadLetterRecordsRecovery", func(e *env[TTx]) {
		var fail atomic.Bool
		fail.Store(true)
		credit := storetest.CreditHandler(e.b)
		c, err := idem.NewConsumer(e.b.Store, e.config("ledger@v1", func(ctx context.Context, tx TTx, msg idem.Message) error {
			if fail.Load() {
				return idem.Permanent(errors.New("bug"))
			}
			return credit(ctx, tx, msg)
		}))
		require.NoError(e.t, err)
		stop := e.run(c, e.source("ledger"))
		e.publish(storetest.PaymentMessage("acme", "evt-r", storetest.Payment{Wallet: "w1", Amount: 5}))
		e.eventually(20*time.Second, "dead letter", func() bool { return len(e.deadLetters("evt-r")) == 1 })
		fail.Store(false)
		dl := e.deadLetters("evt-r")[0]
		replay, err := idemdlq.NewReplayer(e.b.Store, e.sink, idemdlq.ReplayerConfig{}).Replay(e.ctx, idemdlq.ReplayParams{Selection: idemdlq.Selection{IDs: []int64{dl.ID}, Actor: "test", Limit: 1}, Topic: e.topic})
		require.NoError(e.t, err)
		require.Equal(e.t, []int64{dl.ID}, replay.Replayed)
		e.eventually(20*time.Second, "replay processed", func() bool { return e.rec.Count(idem.OutcomeProcessed, "evt-r") == 1 })
		require.NoError(e.t, stop())
		got, err := e.b.Store.GetDeadLetter(e.ctx, dl.ID)
		require.NoError(e.t, err)
		require.Equal(e.t, idem.DeadLetterReplayed, got.Status)
		require.False(e.t, got.RecoveredAt.IsZero(), "recovery time recorded")
		require.EqualValues(e.t, 1, e.ledger("evt-r"))
	})
}

// LoseFirstAck wraps a Source so that the first delivery's ack is silently dropped after the
// commit, as when a consumer crashes between commit and ack. It hides TxAcker so the ack really
// happens after the commit.
type LoseFirstAck struct {
	idem.Source
	Lost atomic.Int64
}

// Receive wraps each delivery.
func (s *LoseFirstAck) Receive(ctx context.Context, max int) ([]idem.Delivery, error) {
	ds, err := s.Source.Receive(ctx, max)
	for i, d := range ds {
		ds[i] = &loseAck{Delivery: d, src: s}
	}
	return ds, err
}

type loseAck struct {
	idem.Delivery
	src *LoseFirstAck
}

func (d *loseAck) Ack(ctx context.Context) error {
	if d.src.Lost.CompareAndSwap(0, 1) {
		return nil // the ack never reaches the broker
	}
	return d.Delivery.Ack(ctx)
}

// FailFirstExtend wraps a Source so that the first lease extension fails, as when a worker
// stalls past its lease and another takes the message.
type FailFirstExtend struct {
	idem.Source
	failed atomic.Bool
}

// Receive wraps each delivery.
func (s *FailFirstExtend) Receive(ctx context.Context, max int) ([]idem.Delivery, error) {
	ds, err := s.Source.Receive(ctx, max)
	for i, d := range ds {
		ds[i] = &failExtend{Delivery: d, src: s}
	}
	return ds, err
}

type failExtend struct {
	idem.Delivery
	src *FailFirstExtend
}

func (d *failExtend) Extend(ctx context.Context) error {
	if d.src.failed.CompareAndSwap(false, true) {
		return errors.New("lease taken by another worker")
	}
	return d.Delivery.Extend(ctx)
}

// errCut is the error of a dead-letter store that CutDeadLetters cut.
var errCut = errors.New("consumertest: dead-letter store cut")

// CutStore wraps a store so that InsertDeadLetter fails on demand, as in a database outage that
// hits the dead-letter write. Everything else passes through.
type CutStore[TTx any] struct {
	idemstore.Store[TTx]
	cut      atomic.Bool
	failures atomic.Int64
}

// DeadLetterCutter is a store whose dead-letter writes can be cut (see CutDeadLetters).
type DeadLetterCutter[TTx any] interface {
	idemstore.Store[TTx]
	// Cut makes InsertDeadLetter fail (true) or pass through again (false).
	Cut(bool)
	// Failures counts the writes refused while cut.
	Failures() int64
}

// CutDeadLetters wraps store; the result is an idemstore.BatchStore when store is one.
func CutDeadLetters[TTx any](store idemstore.Store[TTx]) DeadLetterCutter[TTx] {
	cs := &CutStore[TTx]{Store: store}
	if bs, ok := store.(idemstore.BatchStore[TTx]); ok {
		return &cutBatchStore[TTx]{CutStore: cs, bs: bs}
	}
	return cs
}

// Cut makes InsertDeadLetter fail (true) or pass through again (false).
func (s *CutStore[TTx]) Cut(v bool) { s.cut.Store(v) }

// Failures counts the writes refused while cut.
func (s *CutStore[TTx]) Failures() int64 { return s.failures.Load() }

// InsertDeadLetter fails with errCut while the store is cut.
func (s *CutStore[TTx]) InsertDeadLetter(ctx context.Context, dl idem.DeadLetter) (idem.DeadLetter, error) {
	if s.cut.Load() {
		s.failures.Add(1)
		return idem.DeadLetter{}, errCut
	}
	return s.Store.InsertDeadLetter(ctx, dl)
}

type cutBatchStore[TTx any] struct {
	*CutStore[TTx]
	bs idemstore.BatchStore[TTx]
}

func (s *cutBatchStore[TTx]) ClaimBatchTx(ctx context.Context, tx TTx, ps []idemstore.ClaimParams) ([]idemstore.ClaimResult, error) {
	return s.bs.ClaimBatchTx(ctx, tx, ps)
}

func (s *cutBatchStore[TTx]) SavepointTx(ctx context.Context, tx TTx, fn func(ctx context.Context, tx TTx) error) error {
	return s.bs.SavepointTx(ctx, tx, fn)
}

func (s *cutBatchStore[TTx]) ReleaseClaimTx(ctx context.Context, tx TTx, key idem.Key) error {
	return s.bs.ReleaseClaimTx(ctx, tx, key)
}

// ClaimBucket passes the wrapped store's idemstore.BucketedStore through (0, not partitioned, when
// it is none), so that the consumer claims in the same buckets as over the bare store.
func (s *CutStore[TTx]) ClaimBucket() time.Duration {
	if b, ok := s.Store.(idemstore.BucketedStore); ok {
		return b.ClaimBucket()
	}
	return 0
}

// ClaimRetention passes the wrapped store's idemstore.BucketedStore through (0 when it is none).
func (s *CutStore[TTx]) ClaimRetention() time.Duration {
	if b, ok := s.Store.(idemstore.BucketedStore); ok {
		return b.ClaimRetention()
	}
	return 0
}

// TxEnded passes the wrapped store's idemstore.TxEndChecker through; without one it reports false,
// which the batch path takes as it takes a store that cannot tell.
func (s *cutBatchStore[TTx]) TxEnded(tx TTx) bool {
	if c, ok := s.bs.(idemstore.TxEndChecker[TTx]); ok {
		return c.TxEnded(tx)
	}
	return false
}

// watchHeader marks the messages a SettleWatch watches in the suite.
const watchHeader = "X-Idem-Watch"

// SettleWatch wraps a Source and records every settlement at the broker (Ack, Term, or AckTx
// inside the consumer's transaction) of a message that carries Header, asking Committed at that
// moment whether its dead letter is already in the store. A settlement without it is a
// violation: the broker would forget an event that was neither applied nor dead-lettered.
// Deliveries keep the optional interfaces of the wrapped ones (idem.TxAcker,
// idem.FirstAttempter), and the source those of the wrapped source (idem.DeliveryLimiter,
// idem.RedeliveryWindower), so the consumer takes the same path as over the bare source.
type SettleWatch[TTx any] struct {
	idem.Source
	// Header marks the watched messages (any value).
	Header string
	// Committed reports whether eventID's dead letter is committed.
	Committed func(eventID string) bool

	mu         sync.Mutex
	violations []string
	settled    map[string]int
}

// Receive wraps each delivery.
func (s *SettleWatch[TTx]) Receive(ctx context.Context, max int) ([]idem.Delivery, error) {
	ds, err := s.Source.Receive(ctx, max)
	for i, d := range ds {
		if _, ok := d.Message().Headers[s.Header]; !ok {
			continue
		}
		w := &watchedDelivery[TTx]{Delivery: d, src: s}
		if ta, ok := d.(idem.TxAcker[TTx]); ok {
			ds[i] = &watchedTxDelivery[TTx]{watchedDelivery: w, ta: ta}
		} else {
			ds[i] = w
		}
	}
	return ds, err
}

// DeliveryLimit passes the wrapped source's idem.DeliveryLimiter through (0, no limit, when it
// is none).
func (s *SettleWatch[TTx]) DeliveryLimit() int {
	if l, ok := s.Source.(idem.DeliveryLimiter); ok {
		return l.DeliveryLimit()
	}
	return 0
}

// RedeliveryWindow passes the wrapped source's idem.RedeliveryWindower through (0, which no
// RedeliveryWindow is shorter than, when it is none).
func (s *SettleWatch[TTx]) RedeliveryWindow() time.Duration {
	if w, ok := s.Source.(idem.RedeliveryWindower); ok {
		return w.RedeliveryWindow()
	}
	return 0
}

// Violations lists the settlements of watched messages whose dead letter was not committed.
func (s *SettleWatch[TTx]) Violations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.violations)
}

// Settled counts the settlements of eventID that found its dead letter committed.
func (s *SettleWatch[TTx]) Settled(eventID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settled[eventID]
}

// record checks one settlement of msg by how.
func (s *SettleWatch[TTx]) record(msg idem.Message, how string) {
	ok := s.Committed(msg.EventID)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok {
		s.violations = append(s.violations, fmt.Sprintf("%s of %q (attempt %d) before its dead letter committed", how, msg.EventID, msg.Attempt))
		return
	}
	if s.settled == nil {
		s.settled = map[string]int{}
	}
	s.settled[msg.EventID]++
}

type watchedDelivery[TTx any] struct {
	idem.Delivery
	src *SettleWatch[TTx]
}

func (d *watchedDelivery[TTx]) Ack(ctx context.Context) error {
	d.src.record(d.Message(), "ack")
	return d.Delivery.Ack(ctx)
}

func (d *watchedDelivery[TTx]) Term(ctx context.Context) error {
	d.src.record(d.Message(), "term")
	return d.Delivery.Term(ctx)
}

// FirstAttempt passes the wrapped delivery's idem.FirstAttempter through (zero, which the
// consumer reads as unknown, when it is none).
func (d *watchedDelivery[TTx]) FirstAttempt() time.Time {
	if fa, ok := d.Delivery.(idem.FirstAttempter); ok {
		return fa.FirstAttempt()
	}
	return time.Time{}
}

// watchedTxDelivery is a watched delivery that settles inside the transaction (the queue
// table); the settlement is checked as Ack and Term are.
type watchedTxDelivery[TTx any] struct {
	*watchedDelivery[TTx]
	ta idem.TxAcker[TTx]
}

func (d *watchedTxDelivery[TTx]) AckTx(ctx context.Context, tx TTx) error {
	d.src.record(d.Message(), "ack in transaction")
	return d.ta.AckTx(ctx, tx)
}
