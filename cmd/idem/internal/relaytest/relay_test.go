package relaytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemdlq"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retry"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  idemrelay.Config
		want string // substring of the error; empty means valid
	}{
		{"defaults", idemrelay.Config{}, ""},
		{"batch size", idemrelay.Config{BatchSize: -1}, "BatchSize is -1"},
		{"poll interval", idemrelay.Config{PollInterval: -time.Second}, "PollInterval is -1s"},
		{"lease ttl", idemrelay.Config{LeaseTTL: time.Millisecond}, "LeaseTTL is 1ms"},
		{"retention", idemrelay.Config{Retention: -time.Hour}, "Retention is -1h0m0s"},
		{"gc batch", idemrelay.Config{GCBatch: -5}, "GCBatch is -5"},
		{"gc interval", idemrelay.Config{GCInterval: -time.Minute}, "GCInterval is -1m0s"},
		{"retry", idemrelay.Config{Retry: retry.Policy{Base: time.Minute, Cap: time.Second}}, "Retry: retry: Cap (1s) is below Base (1m0s)"},
		{"id too long", idemrelay.Config{ID: strings.Repeat("x", 201)}, "ID \"xxx"},
		{"owner", idemrelay.Config{Owner: "Platform Team"}, `Owner "Platform Team"`},
		{"valid owner", idemrelay.Config{Owner: "platform"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.cfg.WithDefaults().Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "idemrelay: config")
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c := idemrelay.Config{}.WithDefaults()
	require.NotEmpty(t, c.ID)
	require.NotEqual(t, c.ID, idemrelay.Config{}.WithDefaults().ID, "default ids must differ between relays")
	require.Equal(t, idemrelay.BatchSizeDefault, c.BatchSize)
	require.Equal(t, idemrelay.PollIntervalDefault, c.PollInterval)
	require.Equal(t, idemrelay.LeaseTTLDefault, c.LeaseTTL)
	require.Equal(t, idemrelay.RetentionDefault, c.Retention)
	require.Equal(t, idemrelay.GCBatchDefault, c.GCBatch)
	require.Equal(t, idemrelay.GCIntervalDefault, c.GCInterval)
	require.Equal(t, "t", c.Topic(idem.Outgoing{Topic: "t"}))
}

func TestNewRefusesMissingParts(t *testing.T) {
	t.Parallel()
	k := newSQLite(t, storeCfg{})
	_, err := idemrelay.New(nil, nil, idemrelay.Config{})
	require.ErrorContains(t, err, "store is nil")
	require.ErrorContains(t, err, "sink is nil")
	_, err = idemrelay.New(relayStore{k.store, k.dlq}, &recSink{}, idemrelay.Config{BatchSize: -1})
	require.ErrorContains(t, err, "BatchSize")
}

// The outbox row commits or rolls back with the business row, because EnqueueTx runs in the
// caller's transaction; the relay then publishes only what committed.
func TestEnqueueTxCommitsWithBusinessWrite(t *testing.T) {
	t.Parallel()
	for _, kk := range kits {
		t.Run(kk.name, func(t *testing.T) {
			t.Parallel()
			k := kk.new(t, storeCfg{})
			ctx := ctxT(t, 20*time.Second)
			steps := []struct {
				name        string
				fail        bool
				wantErr     error
				wantOrders  int
				wantPending int
			}{
				{"commit", false, nil, 1, 1},
				{"rollback", true, errRollback, 1, 1},
				{"commit again", false, nil, 2, 2},
			}
			for i, st := range steps {
				err := k.order(ctx, fmt.Sprintf("order-%d", i), st.fail, ev(fmt.Sprintf("evt-%d", i), "", "orders"))
				if st.wantErr != nil {
					require.ErrorIs(t, err, st.wantErr, st.name)
				} else {
					require.NoError(t, err, st.name)
				}
				require.Equal(t, st.wantOrders, k.orders(ctx), st.name)
				require.Equal(t, st.wantPending, k.counts(ctx).Pending, st.name)
			}
			// An invalid event fails the enqueue, and with it the business write.
			err := k.order(ctx, "order-bad", false, idem.Outgoing{EventID: "", Topic: "orders"})
			require.ErrorContains(t, err, "EventID is empty")
			require.Equal(t, 2, k.orders(ctx))

			sink := &recSink{}
			r := newRelay(t, k.store, k.dlq, sink, nil)
			require.Equal(t, 2, drain(t, ctx, r))
			require.ElementsMatch(t, []string{"evt-0", "evt-2"}, sink.ids())
			require.Equal(t, counts{Published: 2}, k.counts(ctx))
			require.NoError(t, r.Release(ctx))
		})
	}
}

// observer records the relay's outcomes.
type observer struct {
	mu        sync.Mutex
	published int
	failed    map[string]int // "class/dead"
}

func (o *observer) Published(_ string, n int, lag time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.published += n
}

func (o *observer) PublishFailed(topic string, class idem.Class, dead bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failed == nil {
		o.failed = map[string]int{}
	}
	o.failed[fmt.Sprintf("%s/%v", class, dead)]++
}

func (o *observer) snapshot() (int, map[string]int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f := map[string]int{}
	for k, v := range o.failed {
		f[k] = v
	}
	return o.published, f
}

// keySeqs groups published event ids "<key>-<n>" by key, in publish order.
func keySeqs(ids []string) map[string][]string {
	out := map[string][]string{}
	for _, id := range ids {
		k := id[:strings.LastIndexByte(id, '-')]
		out[k] = append(out[k], id)
	}
	return out
}

// distinct returns ids without repetitions, each at its first occurrence.
func distinct(ids []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// requireKeyOrder checks that, for every key of want, the events published (ids, in publish
// order) are exactly want[key] at their first publication, and that no event ever went out
// after a later event of its key (a republish right after itself is allowed).
func requireKeyOrder(tb testing.TB, ids []string, want map[string][]string) {
	tb.Helper()
	got := keySeqs(ids)
	for key, seq := range want {
		require.Equal(tb, seq, distinct(got[key]), "key %s: first publications in enqueue order", key)
		pos := map[string]int{}
		for i, id := range seq {
			pos[id] = i
		}
		last := -1
		for _, id := range got[key] {
			require.GreaterOrEqual(tb, pos[id], last, "key %s: %s published after a later event: %v", key, id, got[key])
			last = pos[id]
		}
	}
}

func TestRelayPublishesEverythingInKeyOrder(t *testing.T) {
	t.Parallel()
	for _, kk := range kits {
		t.Run(kk.name, func(t *testing.T) {
			t.Parallel()
			k := kk.new(t, storeCfg{})
			ctx := ctxT(t, 20*time.Second)
			keys := []string{"k1", "k2", "k3", "k4", "k5"}
			want := map[string][]string{}
			var all []string
			for i := range 6 {
				var batch []idem.Outgoing
				for _, key := range keys {
					id := fmt.Sprintf("%s-%d", key, i)
					// Two topics alternate within each key: order must hold across topics.
					batch = append(batch, ev(id, key, []string{"orders", "payments"}[i%2]))
					want[key] = append(want[key], id)
					all = append(all, id)
				}
				batch = append(batch, ev(fmt.Sprintf("solo-%d", i), "", "orders"))
				all = append(all, fmt.Sprintf("solo-%d", i))
				k.enqueue(t, batch...)
			}

			sink := &recSink{}
			obs := &observer{}
			r := newRelay(t, k.store, k.dlq, sink, func(c *idemrelay.Config) {
				c.BatchSize = 7
				c.Observer = obs
			})
			require.Equal(t, len(all), drain(t, ctx, r))

			ids := sink.ids()
			require.ElementsMatch(t, all, ids, "every event exactly once")
			requireKeyOrder(t, ids, want)
			// The key travels with each event (idem.HeaderKey), so a partitioned or grouped
			// broker downstream keeps the same order; an event without a key carries none.
			for _, p := range sink.all() {
				key, _, _ := strings.Cut(p.msg.EventID, "-")
				if key == "solo" {
					require.NotContains(t, p.msg.Headers, idem.HeaderKey, p.msg.EventID)
				} else {
					require.Equal(t, key, p.msg.Headers[idem.HeaderKey], p.msg.EventID)
				}
			}
			require.Equal(t, counts{Published: len(all)}, k.counts(ctx))
			n, failed := obs.snapshot()
			require.Equal(t, len(all), n)
			require.Empty(t, failed)

			biggest := map[int]int{}
			for _, p := range sink.all() {
				biggest[p.call]++
			}
			batched := false
			for _, n := range biggest {
				batched = batched || n > 1
			}
			require.True(t, batched, "consecutive rows to one topic share a Publish call")
			require.NoError(t, r.Release(ctx))
		})
	}
}

// A failed publish holds back the later rows of its key, not the other keys; once the failed
// row is due again and succeeds, the key continues in order.
func TestRelayFailureHoldsBackOnlyItsKey(t *testing.T) {
	t.Parallel()
	for _, kk := range kits {
		t.Run(kk.name, func(t *testing.T) {
			t.Parallel()
			k := kk.new(t, storeCfg{})
			ctx := ctxT(t, 20*time.Second)
			k.enqueue(t,
				ev("a-1", "a", "orders"), ev("b-1", "b", "orders"),
				ev("a-2", "a", "orders"), ev("b-2", "b", "orders"),
				ev("a-3", "a", "orders"), ev("b-3", "b", "orders"),
				ev("solo-1", "", "orders"))

			sink := &recSink{}
			sink.setFail(func(_ string, m idem.Message) error {
				if m.EventID == "a-2" {
					return idem.RetryAfter(errors.New("broker busy"), time.Hour)
				}
				return nil
			})
			clk := &clock{}
			r := newRelay(t, k.store, k.dlq, sink, func(c *idemrelay.Config) {
				c.Now = clk.Now
				c.Retry = retry.Policy{MaxElapsed: 24 * time.Hour}
			})
			drain(t, ctx, r)
			// The batch failed at a-2 after the sink took a-1 and b-1; publishing the batch
			// again row by row sends those two twice, which the broker and consumers absorb.
			require.ElementsMatch(t, []string{"a-1", "b-1", "b-2", "b-3", "solo-1"}, distinct(sink.ids()))
			require.Equal(t, outboxState{Attempts: 1, LastError: "broker busy"}, k.row(ctx, "a-2"))
			require.Equal(t, outboxState{}, k.row(ctx, "a-3"), "a-3 waits behind a-2 untried")

			// Not due yet: another round leaves key a alone.
			n, err := r.RunOnce(ctx)
			require.NoError(t, err)
			require.Zero(t, n)

			sink.setFail(nil)
			clk.Advance(2 * time.Hour)
			require.Equal(t, 2, drain(t, ctx, r))
			requireKeyOrder(t, sink.ids(), map[string][]string{"a": {"a-1", "a-2", "a-3"}, "b": {"b-1", "b-2", "b-3"}})
			require.Equal(t, counts{Published: 7}, k.counts(ctx))
			require.NoError(t, r.Release(ctx))
		})
	}
}

// A sink that pipelines a batch stores the later messages of a call after an earlier one failed.
// The relay puts at most one row of a key in a call, so a key's later rows never go out before
// its failed row: they wait for it, and the other keys go on. Fails when a key's rows share a
// call (a-2 and a-3 were stored while a-1 was pending).
func TestRelayPipelinedFailureKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	for _, kk := range kits {
		t.Run(kk.name, func(t *testing.T) {
			t.Parallel()
			k := kk.new(t, storeCfg{})
			ctx := ctxT(t, 20*time.Second)
			k.enqueue(t,
				ev("a-1", "a", "orders"), ev("a-2", "a", "orders"), ev("a-3", "a", "orders"),
				ev("b-1", "b", "orders"), ev("b-2", "b", "orders"))

			sink := &recSink{pipelined: true}
			sink.setFail(func(_ string, m idem.Message) error {
				if m.EventID == "a-1" {
					return idem.RetryAfter(errors.New("stream refused the message"), time.Hour)
				}
				return nil
			})
			clk := &clock{}
			r := newRelay(t, k.store, k.dlq, sink, func(c *idemrelay.Config) {
				c.Now = clk.Now
				c.Retry = retry.Policy{MaxElapsed: 24 * time.Hour}
			})
			drain(t, ctx, r)
			require.ElementsMatch(t, []string{"b-1", "b-2"}, distinct(sink.ids()), "key a waits behind a-1; key b goes on")
			require.Equal(t, outboxState{}, k.row(ctx, "a-2"), "a-2 waits behind a-1 untried")
			type callKey struct {
				call int
				key  string
			}
			perCall := map[callKey]int{}
			for _, p := range sink.all() {
				ck := callKey{p.call, strings.Split(p.msg.EventID, "-")[0]}
				perCall[ck]++
				require.Equal(t, 1, perCall[ck], "call %d carries more than one row of key %s", ck.call, ck.key)
			}

			sink.setFail(nil)
			clk.Advance(2 * time.Hour)
			require.Equal(t, 3, drain(t, ctx, r))
			requireKeyOrder(t, sink.ids(), map[string][]string{"a": {"a-1", "a-2", "a-3"}, "b": {"b-1", "b-2"}})
			require.Equal(t, counts{Published: 5}, k.counts(ctx))
			require.NoError(t, r.Release(ctx))
		})
	}
}

// Transient failures are retried under the policy until they succeed or the budget is spent.
func TestRelayRetriesTransientFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		failures  int // failing attempts before success
		policy    retry.Policy
		wantCalls int
		wantState outboxState
		wantDL    bool
	}{
		{"recovers within budget", 2, fastRetry, 3, outboxState{Attempts: 2, Published: true, LastError: "unavailable"}, false},
		{"budget spent", 100, retry.Policy{MaxAttempts: 3, MaxElapsed: time.Minute, Base: 5 * time.Millisecond, Cap: 10 * time.Millisecond},
			3, outboxState{Attempts: 3, Dead: true, LastError: "unavailable"}, true},
	} {
		for _, kk := range kits {
			t.Run(tc.name+"/"+kk.name, func(t *testing.T) {
				t.Parallel()
				k := kk.new(t, storeCfg{})
				ctx := ctxT(t, 20*time.Second)
				k.enqueue(t, ev("x-1", "x", "orders"))
				var mu sync.Mutex
				calls := 0
				sink := &recSink{}
				sink.setFail(func(_ string, m idem.Message) error {
					mu.Lock()
					defer mu.Unlock()
					calls++
					if calls <= tc.failures {
						return errors.New("unavailable") // unclassified: transient
					}
					return nil
				})
				obs := &observer{}
				r := newRelay(t, k.store, k.dlq, sink, func(c *idemrelay.Config) {
					c.Retry = tc.policy
					c.Observer = obs
				})
				rr := start(t, r)
				eventually(t, 10*time.Second, func() bool {
					s := k.row(ctx, "x-1")
					return s.Published || s.Dead
				}, "x-1 published or dead")
				rr.stop(t)
				mu.Lock()
				require.Equal(t, tc.wantCalls, calls)
				mu.Unlock()
				require.Equal(t, tc.wantState, k.row(ctx, "x-1"))
				dls, err := k.dlq.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Consumer: idemrelay.ConsumerName})
				require.NoError(t, err)
				if !tc.wantDL {
					require.Empty(t, dls)
					return
				}
				require.Len(t, dls, 1)
				require.Equal(t, idem.ReasonRetriesExhausted, dls[0].Reason)
				require.Equal(t, 3, dls[0].Attempts)
				_, failed := obs.snapshot()
				require.Equal(t, map[string]int{"transient/false": 2, "transient/true": 1}, failed)
			})
		}
	}
}

// A permanent failure dead-letters the row at once (error redacted); the dead row holds back its
// key (see TestRelayDeadRowHoldsItsKey), and the other keys' rows are published.
func TestRelayPermanentFailureDeadLetters(t *testing.T) {
	t.Parallel()
	for _, kk := range kits {
		t.Run(kk.name, func(t *testing.T) {
			t.Parallel()
			k := kk.new(t, storeCfg{})
			ctx := ctxT(t, 20*time.Second)
			k.enqueue(t, ev("a-1", "a", "orders"), ev("b-1", "b", "orders"), ev("a-2", "a", "orders"), ev("c-1", "c", "orders"))
			var mu sync.Mutex
			calls := map[string]int{}
			sink := &recSink{}
			sink.setFail(func(_ string, m idem.Message) error {
				mu.Lock()
				defer mu.Unlock()
				calls[m.EventID]++
				if m.EventID == "a-1" {
					return idem.Permanent(errors.New("rejected by broker: password=hunter2"))
				}
				return nil
			})
			r := newRelay(t, k.store, k.dlq, sink, func(c *idemrelay.Config) { c.Owner = "platform" })
			drain(t, ctx, r)

			require.ElementsMatch(t, []string{"b-1", "c-1"}, sink.ids())
			mu.Lock()
			require.Equal(t, 2, calls["a-1"], "once in the batch, once alone to find the culprit; never retried")
			mu.Unlock()
			st := k.row(ctx, "a-1")
			require.True(t, st.Dead)
			require.Equal(t, 1, st.Attempts)
			require.NotContains(t, st.LastError, "hunter2")

			dls, err := k.dlq.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Consumer: idemrelay.ConsumerName})
			require.NoError(t, err)
			require.Len(t, dls, 1)
			dl := dls[0]
			require.Equal(t, idem.ReasonPermanentError, dl.Reason)
			require.Equal(t, "outbox:orders", dl.Source)
			require.Equal(t, "platform", dl.Owner, "the relay's owner is carried into its dead letters")
			require.Equal(t, "a-1", dl.Message.EventID)
			require.Equal(t, "acme", dl.Message.Tenant)
			require.JSONEq(t, `{"id":"a-1"}`, string(dl.Message.Payload))
			require.Equal(t, 1, dl.Attempts)
			require.Contains(t, dl.Error, idemredact.Masked)
			require.NotContains(t, dl.Error, "hunter2")
			require.Equal(t, counts{Pending: 1, Published: 2, Dead: 1}, k.counts(ctx))
			require.NoError(t, r.Release(ctx))
		})
	}
}

// The budget counts from the first publish attempt, not the row's creation: a row that waited
// longer than MaxElapsed (the relay was down, the broker out for an hour) is retried on its
// first failure, and dead-lettered once the budget is spent since that first attempt, with the
// first attempt as its first failure. Fails when the budget counts from CreatedAt.
func TestRelayBudgetCountsFromFirstAttempt(t *testing.T) {
	t.Parallel()
	for _, kk := range kits {
		t.Run(kk.name, func(t *testing.T) {
			t.Parallel()
			k := kk.new(t, storeCfg{})
			ctx := ctxT(t, 20*time.Second)
			k.enqueue(t, ev("x-1", "x", "orders"))
			sink := &recSink{}
			sink.setFail(func(string, idem.Message) error { return errors.New("broker unavailable") })
			clk := &clock{}
			r := newRelay(t, k.store, k.dlq, sink, func(c *idemrelay.Config) {
				c.Now = clk.Now
				c.Retry = retry.Policy{MaxAttempts: 100, MaxElapsed: 15 * time.Minute, Base: time.Second, Cap: time.Second}
			})
			clk.Advance(time.Hour) // the row is an hour old when the relay first tries it
			firstTry := clk.Now()
			drain(t, ctx, r)
			require.Equal(t, outboxState{Attempts: 1, LastError: "broker unavailable"}, k.row(ctx, "x-1"),
				"an outage before the first attempt does not spend the budget")

			clk.Advance(10 * time.Minute)
			drain(t, ctx, r)
			require.Equal(t, outboxState{Attempts: 2, LastError: "broker unavailable"}, k.row(ctx, "x-1"), "10 min into a 15 min budget")

			clk.Advance(10 * time.Minute)
			drain(t, ctx, r)
			require.Equal(t, outboxState{Attempts: 3, Dead: true, LastError: "broker unavailable"}, k.row(ctx, "x-1"), "20 min: budget spent")
			dls, err := k.dlq.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Consumer: idemrelay.ConsumerName})
			require.NoError(t, err)
			require.Len(t, dls, 1)
			require.Equal(t, idem.ReasonRetriesExhausted, dls[0].Reason)
			require.WithinDuration(t, firstTry, dls[0].FirstFailed, 5*time.Second, "first failure is the first attempt")
			require.NoError(t, r.Release(ctx))
		})
	}
}

// A dead row holds back the later rows of its key, not other keys, until an operator replays or
// discards its dead letter; then the key goes on in order. With SkipDeadRows the key's later rows
// go out at once. Fails when a dead row stops holding its key.
func TestRelayDeadRowHoldsItsKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		skip bool
		// decide is what the operator does with the dead letter (nil: nothing).
		decide func(t *testing.T, rep *idemdlq.Replayer, id int64)
	}{
		{name: "replay", decide: func(t *testing.T, rep *idemdlq.Replayer, id int64) {
			res, err := rep.Replay(context.Background(), idemdlq.ReplayParams{
				Selection: idemdlq.Selection{IDs: []int64{id}, Actor: "ops"}, Topic: "orders"})
			require.NoError(t, err)
			require.Equal(t, []int64{id}, res.Replayed)
		}},
		{name: "discard", decide: func(t *testing.T, rep *idemdlq.Replayer, id int64) {
			res, err := rep.Discard(context.Background(), idemdlq.Selection{IDs: []int64{id}, Actor: "ops", Reason: "superseded"})
			require.NoError(t, err)
			require.Equal(t, []int64{id}, res.Discarded)
		}},
		{name: "skip", skip: true},
	} {
		for _, kk := range kits {
			t.Run(tc.name+"/"+kk.name, func(t *testing.T) {
				t.Parallel()
				k := kk.new(t, storeCfg{})
				ctx := ctxT(t, 20*time.Second)
				k.enqueue(t, ev("a-1", "a", "orders"), ev("a-2", "a", "orders"), ev("b-1", "b", "orders"), ev("a-3", "a", "orders"))
				sink := &recSink{}
				sink.setFail(func(_ string, m idem.Message) error {
					if m.EventID == "a-1" && m.Header(idem.HeaderReplayOf) == "" {
						return idem.Permanent(errors.New("rejected"))
					}
					return nil
				})
				clk := &clock{}
				r := newRelay(t, k.store, k.dlq, sink, func(c *idemrelay.Config) {
					c.Now = clk.Now
					c.SkipDeadRows = tc.skip
				})
				drain(t, ctx, r)
				require.True(t, k.row(ctx, "a-1").Dead)
				if tc.skip {
					require.Equal(t, []string{"b-1", "a-2", "a-3"}, sink.ids(), "SkipDeadRows: key a goes on past its dead row")
					return
				}
				require.Equal(t, []string{"b-1"}, sink.ids(), "the dead row a-1 holds key a back, not key b")
				clk.Advance(time.Hour)
				drain(t, ctx, r)
				require.Equal(t, []string{"b-1"}, sink.ids(), "still held while the dead letter is pending")
				require.Equal(t, outboxState{}, k.row(ctx, "a-2"))

				dls, err := k.dlq.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Consumer: idemrelay.ConsumerName})
				require.NoError(t, err)
				require.Len(t, dls, 1)
				tc.decide(t, idemdlq.NewReplayer(k.dlq, sink, idemdlq.ReplayerConfig{}), dls[0].ID)
				clk.Advance(time.Second) // past the relay's next look at the dead letter
				drain(t, ctx, r)
				want := []string{"b-1", "a-2", "a-3"}
				if tc.name == "replay" {
					want = []string{"b-1", "a-1", "a-2", "a-3"} // the replay published a-1 first
				}
				require.Equal(t, want, sink.ids())
				st := k.row(ctx, "a-1")
				require.True(t, st.Dead && st.Published, "the released dead row leaves with the published rows: %+v", st)
				require.NoError(t, r.Release(ctx))
			})
		}
	}
}

// A relay killed between the sink's confirmation and the mark leaves the row unpublished; the
// relay that takes its partitions over publishes it again under the same event id.
func TestRelayCrashBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	for _, kk := range kits {
		t.Run(kk.name, func(t *testing.T) {
			t.Parallel()
			k := kk.new(t, storeCfg{})
			ctx := ctxT(t, 20*time.Second)
			k.enqueue(t, ev("e-1", "k", "orders"))

			sink := &recSink{}
			r1ctx, kill := context.WithCancel(context.Background())
			defer kill()
			crashing := &crashStore{OutboxRelayStore: k.store}
			sink.after = func(relay string) error {
				if relay == "r1" {
					crashing.crash()
					kill() // the process dies right after the broker confirmed
					return context.Canceled
				}
				return nil
			}
			const ttl = 500 * time.Millisecond
			r1 := newRelay(t, crashing, k.dlq, sink.as("r1"), func(c *idemrelay.Config) { c.ID, c.LeaseTTL = "r1", ttl })
			require.NoError(t, r1.Run(r1ctx))
			require.Equal(t, []string{"e-1"}, sink.ids())
			require.Equal(t, outboxState{}, k.row(ctx, "e-1"), "published but never marked")
			leases, err := k.store.LeaseList(ctx, idemrelay.PartitionLeasePrefix, time.Now())
			require.NoError(t, err)
			require.NotEmpty(t, leases, "a crashed relay does not release")
			var until time.Time
			for _, l := range leases {
				require.Equal(t, "r1", l.Owner)
				until = l.LeaseUntil
			}

			r2 := newRelay(t, k.another(t), k.dlq, sink.as("r2"), func(c *idemrelay.Config) { c.ID, c.LeaseTTL = "r2", ttl })
			start(t, r2)
			eventually(t, 10*time.Second, func() bool { return k.row(ctx, "e-1").Published }, "r2 publishes e-1")
			got := sink.all()
			require.Len(t, got, 2)
			require.Equal(t, "e-1", got[1].msg.EventID, "same event id")
			require.Equal(t, "r2", got[1].relay)
			require.False(t, got[1].start.Before(until.Add(-5*time.Millisecond)), "r2 took over only after r1's lease expired")
		})
	}
}

// Published rows older than the retention are deleted in bounded batches; younger ones and
// unpublished ones stay.
func TestRelayCollectsGarbage(t *testing.T) {
	t.Parallel()
	for _, kk := range kits {
		t.Run(kk.name, func(t *testing.T) {
			t.Parallel()
			k := kk.new(t, storeCfg{})
			ctx := ctxT(t, 20*time.Second)
			var evs []idem.Outgoing
			for i := range 7 {
				evs = append(evs, ev(fmt.Sprintf("g-%d", i), "", "orders"))
			}
			k.enqueue(t, evs...)
			clk := &clock{}
			r := newRelay(t, k.store, k.dlq, &recSink{}, func(c *idemrelay.Config) {
				c.Now = clk.Now
				c.Retention = time.Hour
				c.GCBatch = 3
			})
			require.Equal(t, 7, drain(t, ctx, r))
			k.enqueue(t, ev("late", "", "orders"))

			n, err := r.CollectGarbage(ctx)
			require.NoError(t, err)
			require.Zero(t, n, "nothing is older than the retention yet")
			clk.Advance(2 * time.Hour)
			n, err = r.CollectGarbage(ctx)
			require.NoError(t, err)
			require.Equal(t, 7, n)
			require.Equal(t, counts{Pending: 1}, k.counts(ctx))
			require.NoError(t, r.Release(ctx))
		})
	}
}

// Run releases its leases when it stops, so that another relay takes over at once.
func TestRunReleasesLeasesOnExit(t *testing.T) {
	t.Parallel()
	k := newSQLite(t, storeCfg{})
	ctx := ctxT(t, 20*time.Second)
	r := newRelay(t, k.store, k.dlq, &recSink{}, func(c *idemrelay.Config) { c.LeaseTTL = time.Minute })
	rr := start(t, r)
	eventually(t, 5*time.Second, func() bool { return len(r.Partitions()) == k.store.OutboxPartitions() }, "relay takes every partition")
	_, err := r.RunOnce(ctx)
	require.ErrorContains(t, err, "already running")
	rr.stop(t)
	for _, prefix := range []string{idemrelay.PartitionLeasePrefix, idemrelay.MemberLeasePrefix} {
		leases, err := k.store.LeaseList(ctx, prefix, time.Now())
		require.NoError(t, err)
		require.Empty(t, leases, prefix)
	}
	require.Empty(t, r.Partitions())
}

// A relay that joins gets its fair share: the relay holding everything releases what is above
// ceil(partitions/members) after its next round, and the newcomer takes it.
func TestNewRelayGetsItsShare(t *testing.T) {
	t.Parallel()
	k := newSQLite(t, storeCfg{partitions: 16})
	ctx := ctxT(t, 20*time.Second)
	clk := &clock{}
	mod := func(id string) func(c *idemrelay.Config) {
		return func(c *idemrelay.Config) { c.ID, c.LeaseTTL, c.Now = id, time.Minute, clk.Now }
	}
	r1 := newRelay(t, k.store, k.dlq, &recSink{}, mod("r1"))
	r2 := newRelay(t, k.another(t), k.dlq, &recSink{}, mod("r2"))
	r3 := newRelay(t, k.another(t), k.dlq, &recSink{}, mod("r3"))
	steps := []struct {
		name         string
		run          []*idemrelay.Relay
		want1, want2 int
		want3        int
	}{
		{"r1 alone takes all", []*idemrelay.Relay{r1}, 16, 0, 0},
		{"r2 joins: nothing is free yet", []*idemrelay.Relay{r2}, 16, 0, 0},
		{"r1 sees two members and releases half", []*idemrelay.Relay{r1}, 8, 0, 0},
		{"r2 takes the free half", []*idemrelay.Relay{r2}, 8, 8, 0},
		{"r3 joins, r1 and r2 shrink to ceil(16/3)", []*idemrelay.Relay{r3, r1, r2}, 6, 6, 0},
		{"r3 takes the rest", []*idemrelay.Relay{r3}, 6, 6, 4},
	}
	for _, st := range steps {
		clk.Advance(time.Minute / 3) // every lease step is due; no lease expires
		for _, r := range st.run {
			_, err := r.RunOnce(ctx)
			require.NoError(t, err, st.name)
		}
		require.Len(t, r1.Partitions(), st.want1, st.name)
		require.Len(t, r2.Partitions(), st.want2, st.name)
		require.Len(t, r3.Partitions(), st.want3, st.name)
		seen := map[int]string{}
		for _, r := range []*idemrelay.Relay{r1, r2, r3} {
			for _, p := range r.Partitions() {
				require.NotContains(t, seen, p, "%s: partition %d owned by %s and %s", st.name, p, seen[p], r.ID())
				seen[p] = r.ID()
			}
		}
	}
	for _, r := range []*idemrelay.Relay{r1, r2, r3} {
		require.NoError(t, r.Release(ctx))
	}
}

// blockingSink blocks its first Publish until the context ends, then publishes normally.
type blockingSink struct {
	recSink
	mu      sync.Mutex
	blocked int
	cause   error
}

func (b *blockingSink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	b.mu.Lock()
	first := b.blocked == 0
	b.blocked++
	b.mu.Unlock()
	if first {
		<-ctx.Done()
		b.mu.Lock()
		b.cause = ctx.Err()
		b.mu.Unlock()
		return ctx.Err()
	}
	return b.recSink.Publish(ctx, topic, msgs...)
}

// A publish is bounded by the lease it started under; when the relay still holds the lease (it
// was renewed) the cut-off publish counts as a transient failure, so the budget applies.
func TestRelaySlowPublishIsCutAtLeaseEnd(t *testing.T) {
	t.Parallel()
	k := newSQLite(t, storeCfg{})
	ctx := ctxT(t, 20*time.Second)
	k.enqueue(t, ev("slow-1", "s", "orders"))
	sink := &blockingSink{}
	const ttl = time.Second
	r := newRelay(t, k.store, k.dlq, sink, func(c *idemrelay.Config) { c.LeaseTTL = ttl })
	began := time.Now()
	start(t, r)
	eventually(t, 10*time.Second, func() bool { return k.row(ctx, "slow-1").Published }, "slow-1 published on the retry")
	sink.mu.Lock()
	defer sink.mu.Unlock()
	require.ErrorIs(t, sink.cause, context.DeadlineExceeded)
	require.Less(t, time.Since(began), 10*ttl, "cut at the lease, not at some distant timeout")
	require.Equal(t, outboxState{Attempts: 1, Published: true, LastError: "context deadline exceeded"}, k.row(ctx, "slow-1"))
	require.Equal(t, []string{"slow-1"}, sink.ids())
}

// leaseGapSink records, at the start of each Publish, how long before the partition's lease
// ends the call's context does: what a publish cut off at its deadline had already sent must
// still land while the lease holds.
type leaseGapSink struct {
	recSink
	store idemstore.OutboxRelayStore
	mu    sync.Mutex
	gaps  []time.Duration
	errs  []error
}

func (s *leaseGapSink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	deadline, ok := ctx.Deadline()
	leases, err := s.store.LeaseList(ctx, idemrelay.PartitionLeasePrefix, time.Now())
	s.mu.Lock()
	switch {
	case !ok:
		s.errs = append(s.errs, errors.New("publish without a deadline"))
	case err != nil:
		s.errs = append(s.errs, err)
	case len(leases) != 1:
		s.errs = append(s.errs, fmt.Errorf("%d partition leases, want 1", len(leases)))
	default:
		s.gaps = append(s.gaps, leases[0].LeaseUntil.Sub(deadline))
	}
	s.mu.Unlock()
	return s.recSink.Publish(ctx, topic, msgs...)
}

// A publish is cut off a tenth of the lease before the lease ends, not at its end: a broker
// client may have sent its messages by the time its context ends, and they must land before
// another relay can take the partition and publish the key's next rows.
func TestRelayPublishEndsBeforeItsLease(t *testing.T) {
	t.Parallel()
	k := newSQLite(t, storeCfg{partitions: 1})
	const ttl = time.Second
	sink := &leaseGapSink{store: k.store}
	r := newRelay(t, k.store, k.dlq, sink, func(c *idemrelay.Config) { c.LeaseTTL = ttl; c.BatchSize = 1 })
	start(t, r)
	for i := range 5 {
		k.enqueue(t, ev(fmt.Sprintf("gap-%d", i), "g", "orders"))
	}
	eventually(t, 10*time.Second, func() bool { return len(sink.ids()) == 5 }, "every row published")
	sink.mu.Lock()
	defer sink.mu.Unlock()
	require.Empty(t, sink.errs)
	require.NotEmpty(t, sink.gaps)
	// The store keeps lease ends to the millisecond or finer; the margin is 100 ms.
	for _, gap := range sink.gaps {
		require.GreaterOrEqual(t, gap, ttl/10-5*time.Millisecond, "a publish may run until %v before its lease ends", gap)
	}
}

// A key held back behind a failed row may have more rows than a batch holds; the relay fetches
// more so that the keys after it are not starved.
func TestRelayHeldKeyDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	k := newSQLite(t, storeCfg{partitions: 1})
	ctx := ctxT(t, 20*time.Second)
	var evs []idem.Outgoing
	for i := range 30 {
		evs = append(evs, ev(fmt.Sprintf("a-%d", i), "a", "orders"))
	}
	evs = append(evs, ev("b-0", "b", "orders"), ev("b-1", "b", "orders"))
	k.enqueue(t, evs...)
	sink := &recSink{}
	sink.setFail(func(_ string, m idem.Message) error {
		if m.EventID == "a-0" {
			return idem.RetryAfter(errors.New("busy"), time.Hour)
		}
		return nil
	})
	r := newRelay(t, k.store, k.dlq, sink, func(c *idemrelay.Config) {
		c.BatchSize = 10
		c.Retry = retry.Policy{MaxElapsed: 24 * time.Hour}
	})
	for range 4 { // fetch 10 (a-0 fails), 20, 40: b's rows come into view
		_, err := r.RunOnce(ctx)
		require.NoError(t, err)
	}
	require.Equal(t, []string{"b-0", "b-1"}, sink.ids())
	require.Equal(t, counts{Pending: 30, Published: 2}, k.counts(ctx))
	require.NoError(t, r.Release(ctx))
}

// A relay killed and restarted under the same ID — what the default, machine-stable ID gives
// (idemrelay's TestStableIDAfterKill) — resumes its partitions at once: its first publish after
// the restart comes before its old leases would have expired, where a relay with a new ID waits
// for them (TestRelayCrashBetweenPublishAndMark). The test logs the outbox-to-sink latency.
func TestRestartedRelayResumesItsLeasesAtOnce(t *testing.T) {
	t.Parallel()
	for _, kk := range kits {
		t.Run(kk.name, func(t *testing.T) {
			t.Parallel()
			k := kk.new(t, storeCfg{})
			ctx := ctxT(t, 30*time.Second)
			const ttl = 10 * time.Second
			sink := &recSink{}

			// The first life: publishes e-1, then dies without giving its leases back.
			crashing := &crashStore{OutboxRelayStore: k.store}
			r1 := newRelay(t, crashing, k.dlq, sink.as("first"), func(c *idemrelay.Config) { c.ID, c.LeaseTTL = "host-0", ttl })
			run1 := start(t, r1)
			k.enqueue(t, ev("e-1", "k", "orders"))
			eventually(t, 10*time.Second, func() bool { return k.row(ctx, "e-1").Published }, "e-1 published")
			crashing.crash()
			run1.stop(t)
			leases, err := k.store.LeaseList(ctx, idemrelay.PartitionLeasePrefix, time.Now())
			require.NoError(t, err)
			require.NotEmpty(t, leases, "a killed relay leaves its leases")
			until := leases[0].LeaseUntil
			for _, l := range leases {
				require.Equal(t, "host-0", l.Owner)
				if l.LeaseUntil.Before(until) {
					until = l.LeaseUntil
				}
			}

			// The second life, same ID: e-2 goes out without waiting for the old leases.
			enqueued := time.Now()
			k.enqueue(t, ev("e-2", "k", "orders"))
			r2 := newRelay(t, k.another(t), k.dlq, sink.as("second"), func(c *idemrelay.Config) { c.ID, c.LeaseTTL = "host-0", ttl })
			start(t, r2)
			eventually(t, 2*ttl, func() bool { return k.row(ctx, "e-2").Published }, "e-2 published")
			got := sink.all()
			last := got[len(got)-1]
			require.Equal(t, "e-2", last.msg.EventID)
			require.Equal(t, "second", last.relay)
			require.True(t, last.end.Before(until), "published at %s, before the old leases expire at %s", last.end.Format(time.StampMilli), until.Format(time.StampMilli))
			t.Logf("outbox-to-sink latency across a restart with the same ID: %s (the old leases had %s left)",
				last.end.Sub(enqueued).Round(time.Millisecond), until.Sub(enqueued).Round(time.Millisecond))
		})
	}
}
