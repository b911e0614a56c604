package idem

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// setMsg is the set tests' event: its payload names its id, so a changed payload is key reuse.
func setMsg(id string) Message {
	return Message{EventID: id, Tenant: "acme", Type: "t", Payload: []byte(`{"id":"` + id + `"}`)}
}

func TestSetPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// before are processed (and committed) first, one by one.
		before []Message
		batch  []Message
		// failSet makes the set handler fail whenever its set holds more than one event (a
		// failure of the set as such, not of any one event).
		failSet bool
		poison  string // this event's effect fails permanently, in a set or alone
		panicky string // this event's effect panics, in a set or alone
		reject  string // the store refuses this event's claim
		kill    string // this event's effect ends the transaction and reports nothing
		ignore  string // this event's target is gone: its effect returns Ignore
		slowSet bool   // a set of more than one outlives HandlerTimeout
		cancel  bool
		want    []Outcome
		// firstSet is the set the set handler is called with first (nil: never called).
		firstSet []string
		// perEvent is how many single-event calls the fallback made.
		perEvent int
		reason   Reason
	}{
		{name: "AllNew", batch: []Message{setMsg("a"), setMsg("b"), setMsg("c")},
			want: []Outcome{OutcomeProcessed, OutcomeProcessed, OutcomeProcessed}, firstSet: []string{"a", "b", "c"}},
		{name: "SomeDuplicates", before: []Message{setMsg("b")}, batch: []Message{setMsg("a"), setMsg("b"), setMsg("c")},
			want: []Outcome{OutcomeProcessed, OutcomeDuplicate, OutcomeProcessed}, firstSet: []string{"a", "c"}},
		{name: "AllDuplicates", before: []Message{setMsg("a"), setMsg("b")}, batch: []Message{setMsg("a"), setMsg("b")},
			want: []Outcome{OutcomeDuplicate, OutcomeDuplicate}},
		{name: "KeyReuse", before: []Message{setMsg("b")},
			batch: []Message{setMsg("a"), {EventID: "b", Tenant: "acme", Type: "t", Payload: []byte(`{"id":"other"}`)}, setMsg("c")},
			want:  []Outcome{OutcomeProcessed, OutcomeKeyReuse, OutcomeProcessed}, firstSet: []string{"a", "c"}},
		{name: "SameKeyTwiceInTheBatch", batch: []Message{setMsg("a"), setMsg("b"), setMsg("a")},
			want: []Outcome{OutcomeProcessed, OutcomeProcessed, OutcomeDuplicate}, firstSet: []string{"a", "b"}},
		{name: "InvalidMessageNeverReachesTheSet", batch: []Message{setMsg("a"), {Tenant: "acme", Payload: []byte(`{}`)}, setMsg("b")},
			want: []Outcome{OutcomeProcessed, OutcomeFailed, OutcomeProcessed}, firstSet: []string{"a", "b"}, reason: ReasonInvalidPayload},
		{name: "HandlerErrorFallsBackPerEvent", failSet: true, batch: []Message{setMsg("a"), setMsg("b"), setMsg("c")},
			want: []Outcome{OutcomeProcessed, OutcomeProcessed, OutcomeProcessed}, firstSet: []string{"a", "b", "c"}, perEvent: 3},
		{name: "OnePoisonInASet", poison: "p", batch: []Message{setMsg("a"), setMsg("p"), setMsg("b")},
			want: []Outcome{OutcomeProcessed, OutcomeFailed, OutcomeProcessed}, firstSet: []string{"a", "p", "b"},
			perEvent: 4, reason: ReasonPermanentError}, // a, p (aborts), then a and b again
		{name: "ASetOfOneFailsWithoutARerun", poison: "p", before: []Message{setMsg("a")}, batch: []Message{setMsg("a"), setMsg("p")},
			want: []Outcome{OutcomeDuplicate, OutcomeFailed}, perEvent: 1, reason: ReasonPermanentError},
		{name: "OnePanicInASet", panicky: "p", batch: []Message{setMsg("a"), setMsg("p"), setMsg("b")},
			want: []Outcome{OutcomeProcessed, OutcomeFailed, OutcomeProcessed}, firstSet: []string{"a", "p", "b"},
			perEvent: 4, reason: ReasonHandlerPanic},
		{name: "UnclaimableEventFailsAlone", reject: "bad", batch: []Message{setMsg("a"), setMsg("bad"), setMsg("b")},
			want: []Outcome{OutcomeProcessed, OutcomeFailed, OutcomeProcessed}, perEvent: 2},
		{name: "TransactionEndedSilently", kill: "k", batch: []Message{setMsg("a"), setMsg("k"), setMsg("b")},
			want: []Outcome{OutcomeProcessed, OutcomeFailed, OutcomeProcessed}, firstSet: []string{"a", "k", "b"}, perEvent: 4},
		{name: "IgnoreInASetOfOne", ignore: "g", before: []Message{setMsg("a")}, batch: []Message{setMsg("a"), setMsg("g")},
			want: []Outcome{OutcomeDuplicate, OutcomeIgnored}, perEvent: 1},
		{name: "IgnoreInASet", ignore: "g", batch: []Message{setMsg("a"), setMsg("g"), setMsg("b")},
			want: []Outcome{OutcomeProcessed, OutcomeIgnored, OutcomeProcessed}, firstSet: []string{"a", "g", "b"}, perEvent: 4},
		{name: "SetOutlivesHandlerTimeout", slowSet: true, batch: []Message{setMsg("a"), setMsg("b")},
			want: []Outcome{OutcomeProcessed, OutcomeProcessed}, firstSet: []string{"a", "b"}, perEvent: 2},
		{name: "NoFallbackOnceTheContextEnded", failSet: true, cancel: true, batch: []Message{setMsg("a"), setMsg("b")},
			want: []Outcome{OutcomeFailed, OutcomeFailed}, firstSet: []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mem := newMemStore()
			if tc.reject != "" {
				mem.reject[tc.reject] = true
			}
			var sets [][]string
			perEvent := 0
			var timeout time.Duration
			if tc.slowSet {
				timeout = 20 * time.Millisecond
			}
			c, err := NewConsumer[*memTx](memChecker{mem}, ConsumerConfig[*memTx]{
				Name:  "ledger@v1",
				Batch: BatchConfig{Enabled: true},
				SetHandler: func(ctx context.Context, tx *memTx, msgs []Message) error {
					ids := make([]string, len(msgs))
					for i, m := range msgs {
						ids[i] = m.EventID
					}
					if len(msgs) == 1 {
						perEvent++
					} else {
						sets = append(sets, ids)
					}
					if tc.failSet && len(msgs) > 1 {
						return errors.New("deadlock detected")
					}
					if tc.slowSet && len(msgs) > 1 {
						<-ctx.Done() // a lock wait that only the timeout ends
						return ctx.Err()
					}
					for _, m := range msgs {
						tx.write(m.EventID)
						switch m.EventID {
						case tc.poison:
							return Permanent(fmt.Errorf("event %s: wallet not found", m.EventID))
						case tc.panicky:
							panic("nil map")
						case tc.kill:
							tx.ended, tx.effects, tx.claims = true, map[string]int{}, map[Key]Fingerprint{}
							return nil
						case tc.ignore:
							return Ignore("order_deleted")
						}
					}
					return nil
				},
				Failure: FailureConfig{
					HandlerTimeout: timeout,
				},
			})
			require.NoError(t, err)
			ctx := context.Background()
			for _, m := range tc.before {
				err := c.Process(ctx, m).Err
				require.NoError(t, err)
			}
			before := maps.Clone(mem.effects)
			perEvent = 0
			if tc.cancel {
				cctx, cancel := context.WithCancel(ctx)
				cancel()
				ctx = cctx
			}

			rs := c.ProcessSet(ctx, tc.batch)
			require.Len(t, rs, len(tc.batch))
			for i, m := range tc.batch {
				require.Equal(t, tc.want[i], rs[i].Outcome, "%d (%s): %v", i, m.EventID, rs[i].Err)
				if m.EventID == "" {
					continue
				}
				applied := mem.effects[m.EventID] - before[m.EventID]
				if slices.ContainsFunc(tc.batch[:i], func(o Message) bool { return o.EventID == m.EventID }) {
					continue // its effect is counted at its first position
				}
				require.Equal(t, tc.want[i] == OutcomeProcessed, applied == 1, "%s: processed exactly when applied (%d)", m.EventID, applied)
				require.LessOrEqual(t, applied, 1, m.EventID)
				claimed := mem.claims[Key{Tenant: "acme", Consumer: "ledger@v1", EventID: m.EventID}] != Fingerprint{}
				if tc.want[i] == OutcomeIgnored {
					require.True(t, claimed, "%s: an ignored event keeps its claim", m.EventID)
					require.EqualValues(t, "order_deleted", rs[i].Reason)
					continue
				}
				require.Equal(t, claimed, mem.effects[m.EventID] == 1, "%s: an effect exists exactly when its claim does", m.EventID)
			}
			if tc.firstSet == nil {
				require.Empty(t, sets)
			} else {
				require.NotEmpty(t, sets)
				require.Equal(t, tc.firstSet, sets[0])
				require.Len(t, sets, 1, "a set is tried once, then its events one by one")
			}
			require.Equal(t, tc.perEvent, perEvent, "single-event calls")
			for i, r := range rs {
				switch r.Outcome {
				case OutcomeFailed:
					if tc.reason != "" {
						require.Equal(t, tc.reason, r.Reason, "%d: %v", i, r.Err)
						require.Equal(t, ClassPermanent, r.Class)
					}
					require.Contains(t, r.Err.Error(), fmt.Sprintf("(event %q)", tc.batch[i].EventID), "the event id is added once")
				case OutcomeKeyReuse:
					require.ErrorIs(t, r.Err, ErrKeyReuse)
					var kr *KeyReuseError
					require.ErrorAs(t, r.Err, &kr)
					require.NotEqual(t, kr.Claimed, kr.Received)
					require.False(t, kr.Claimed.IsZero())
				}
			}
			if tc.kill != "" {
				require.ErrorIs(t, rs[1].Err, ErrTxEnded)
			}
		})
	}
}

// TestSetHandlerAlone: a consumer configured with only a SetHandler processes single events
// through it (a set of one), and ProcessSet without a SetHandler is ProcessBatch.
func TestSetHandlerAlone(t *testing.T) {
	t.Parallel()
	mem := newMemStore()
	var mu sync.Mutex
	var calls []int
	c, err := NewConsumer[*memTx](mem, ConsumerConfig[*memTx]{
		Name: "ledger@v1",
		SetHandler: func(_ context.Context, tx *memTx, msgs []Message) error {
			mu.Lock()
			calls = append(calls, len(msgs))
			mu.Unlock()
			for _, m := range msgs {
				tx.write(m.EventID)
			}
			return nil
		},
	})
	require.NoError(t, err)
	r := c.Process(context.Background(), setMsg("a"))
	err = r.Err
	require.NoError(t, err)
	require.Equal(t, OutcomeProcessed, r.Outcome)
	rs := c.ProcessSet(context.Background(), []Message{setMsg("a"), setMsg("b"), setMsg("c")})
	require.Equal(t, []Outcome{OutcomeDuplicate, OutcomeProcessed, OutcomeProcessed}, []Outcome{rs[0].Outcome, rs[1].Outcome, rs[2].Outcome})
	require.Equal(t, []int{1, 2}, calls)

	plain, err := NewConsumer[*memTx](mem, ConsumerConfig[*memTx]{
		Name: "audit@v1",
		Handler: func(_ context.Context, tx *memTx, m Message) error {
			tx.write(m.EventID)
			return nil
		},
	})
	require.NoError(t, err)
	rs = plain.ProcessSet(context.Background(), []Message{setMsg("d"), setMsg("e")})
	require.Equal(t, OutcomeProcessed, rs[0].Outcome)
	require.Equal(t, OutcomeProcessed, rs[1].Outcome)
	require.Equal(t, 1, mem.effects["d"])

	_, err = NewConsumer[*memTx](mem, ConsumerConfig[*memTx]{Name: "x@v1"})
	require.ErrorContains(t, err, "Handler is nil (set Handler, SetHandler or both)")
}

// BenchmarkProcessSet measures idem's own cost on the set-based path (an in-memory store, so
// no database time): allocations per event are what it reports.
func BenchmarkProcessSet(b *testing.B) {
	for _, size := range []int{10, 100} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			mem := newMemStore()
			c, err := NewConsumer[*memTx](mem, ConsumerConfig[*memTx]{
				Name:  "ledger@v1",
				Batch: BatchConfig{Enabled: true, Size: size},
				SetHandler: func(_ context.Context, tx *memTx, msgs []Message) error {
					return nil
				},
			})
			require.NoError(b, err)
			msgs := make([]Message, size)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for n := range b.N {
				b.StopTimer() // the messages are the broker's allocations, not idem's
				for i := range msgs {
					id := fmt.Sprintf("evt-%d-%d", n, i)
					msgs[i] = Message{EventID: id, Tenant: "acme", Type: "t", Payload: []byte(`{"wallet":1}`)}
				}
				b.StartTimer()
				for _, r := range c.ProcessSet(ctx, msgs) {
					if r.Outcome != OutcomeProcessed {
						b.Fatal(r.Outcome, r.Err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/event")
		})
	}
}

// A set handler writes the effect of every new event of a batch in one statement; duplicates
// and key reuse never reach it.
func ExampleConsumer_ProcessSet() {
	store := newMemStore() // a BatchStore; idempg, idemsqlite and idemmysql are the real ones
	consumer, err := NewConsumer[*memTx](store, ConsumerConfig[*memTx]{
		Name:  "ledger@v1",
		Batch: BatchConfig{Enabled: true}, // Run then takes batches through the set handler
		SetHandler: func(ctx context.Context, tx *memTx, msgs []Message) error {
			// On PostgreSQL: INSERT INTO ledger (event_id, …) SELECT * FROM unnest($1::text[], …)
			ids := make([]string, len(msgs))
			for i, m := range msgs {
				ids[i] = m.EventID
				tx.write(m.EventID)
			}
			fmt.Println("one statement for", strings.Join(ids, ", "))
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	msg := func(id string) Message {
		return Message{EventID: id, Tenant: "shop", Type: "payment.captured", Payload: []byte(`{"order":"` + id + `"}`)}
	}
	_ = consumer.Process(ctx, msg("pay-1"))
	for i, r := range consumer.ProcessSet(ctx, []Message{msg("pay-1"), msg("pay-2"), msg("pay-3")}) {
		fmt.Println(i, r.Outcome)
	}
	// Output:
	// one statement for pay-1
	// one statement for pay-2, pay-3
	// 0 duplicate
	// 1 processed
	// 2 processed
}
