package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
)

// commitLog records every offset commit the cluster receives, in the order it handles them.
type commitLog struct {
	mu      sync.Mutex
	commits map[string][]int64 // "topic (or topic id)/partition" → committed offsets in arrival order
}

// watchCommits makes c report every OffsetCommit request to the returned log.
func watchCommits(c *kfake.Cluster) *commitLog {
	l := &commitLog{commits: make(map[string][]int64)}
	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.OffsetCommitRequest)
		l.mu.Lock()
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				// Newer requests name the topic by its id only.
				k := fmt.Sprintf("%s%x/%d", t.Topic, t.TopicID, p.Partition)
				l.commits[k] = append(l.commits[k], p.Offset)
			}
		}
		l.mu.Unlock()
		return nil, nil, false
	})
	return l
}

// requireForward fails unless every partition's commits never decrease.
func (l *commitLog) requireForward(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	require.NotEmpty(t, l.commits, "no offset was committed")
	for k, offs := range l.commits {
		for i := 1; i < len(offs); i++ {
			if offs[i] < offs[i-1] {
				t.Errorf("partition %s: commit %d moved the offset backwards, %d → %d (all: %v)", k, i, offs[i-1], offs[i], offs)
			}
		}
	}
}

// committed returns the group's committed offset of topic/partition (-1 when none).
func committed(c *kfake.Cluster, group, topic string, partition int32) int64 {
	gi := c.GroupInfo(group)
	if gi == nil {
		return -1
	}
	if pc, ok := gi.Commits[topic][partition]; ok {
		return pc.Offset
	}
	return -1
}

func ctxT(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// receiveOne receives one delivery within d or fails.
func receiveOne(t *testing.T, src idem.Source, d time.Duration) idem.Delivery {
	t.Helper()
	ds, err := src.Receive(ctxT(t, d), 1)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	return ds[0]
}

// TestRebalance: two members share a topic; one leaves while both hold records. Every record is
// acked by someone (none lost), the member that left cannot settle what it no longer owns, and
// no partition's committed offset ever moves backwards.
func TestRebalance(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	commits := watchCommits(c)
	topic := newTopic(t, c, 4)
	const n = 400
	ids := make([]string, n)
	msgs := make([]idem.Message, n)
	for i := range msgs {
		ids[i] = fmt.Sprintf("evt-%03d", i)
		msgs[i] = idem.Message{EventID: ids[i], Tenant: "t", Payload: []byte(ids[i]), Headers: map[string]string{idemkafka.HeaderKey: fmt.Sprintf("k%d", i%16)}}
	}
	require.NoError(t, newSink(t, c).Publish(ctxT(t, 20*time.Second), topic, msgs...))

	group := topic + ".rebalance"
	a := openSource(t, c, topic, group, 10*time.Second)
	b := openSource(t, c, topic, group, 10*time.Second)

	var mu sync.Mutex
	acked := make(map[string]int)
	consume := func(ctx context.Context, src idem.Source, stopAfter int, held *[]idem.Delivery) {
		for got := 0; stopAfter < 0 || got < stopAfter; {
			ds, err := src.Receive(ctx, 8)
			if err != nil {
				return
			}
			for i, d := range ds {
				got++
				if stopAfter >= 0 && got > stopAfter-3 && held != nil {
					// Keep the last few unsettled: they are in flight when this member leaves.
					*held = append(*held, ds[i:]...)
					return
				}
				if err := d.Ack(ctx); err == nil {
					mu.Lock()
					acked[d.Message().EventID]++
					mu.Unlock()
				}
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var held []idem.Delivery
	done := make(chan struct{})
	go func() { defer close(done); consume(ctx, b, -1, nil) }()
	consume(ctx, a, 60, &held)
	require.NotEmpty(t, held)
	require.NoError(t, a.Close())
	for _, d := range held {
		err := d.Ack(context.Background())
		require.Error(t, err, "a member that left acked event %s of a partition it no longer owns", d.Message().EventID)
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		all := len(acked) == n
		mu.Unlock()
		if all || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	mu.Lock()
	for _, id := range ids {
		if acked[id] == 0 {
			t.Errorf("event %s was never acked: lost in the rebalance", id)
		}
	}
	mu.Unlock()
	require.NoError(t, b.Close())
	commits.requireForward(t)
	var total int64
	for p := int32(0); p < 4; p++ {
		total += committed(c, group, topic, p)
	}
	require.Equal(t, int64(n), total, "committed offsets over all partitions, after everything was acked")
}

// TestRebalanceJoin: a member holds unsettled records of every partition when a second member
// joins and takes some partitions away. The first member's records of the revoked partitions can
// no longer be acked (ErrRevoked) and go to the newcomer, those of the partitions it kept ack as
// usual, every record is acked by someone, and no committed offset moves backwards.
func TestRebalanceJoin(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	commits := watchCommits(c)
	topic := newTopic(t, c, 4)
	const n, held = 200, 100
	msgs := make([]idem.Message, n)
	for i := range msgs {
		msgs[i] = idem.Message{EventID: fmt.Sprintf("evt-%03d", i), Payload: []byte{byte(i)}}
	}
	require.NoError(t, newSink(t, c).Publish(ctxT(t, 20*time.Second), topic, msgs...))
	group := topic + ".join"
	unordered := func(cfg *idemkafka.SourceConfig) {
		cfg.Order = idemkafka.OrderNone
		cfg.RevokeWait = 200 * time.Millisecond
	}
	a := openSource(t, c, topic, group, 30*time.Second, unordered)
	var hold []idem.Delivery
	for len(hold) < held {
		ds, err := a.Receive(ctxT(t, 5*time.Second), held-len(hold))
		require.NoError(t, err)
		hold = append(hold, ds...)
	}
	b := openSource(t, c, topic, group, 30*time.Second, unordered)

	var mu sync.Mutex
	acked := make(map[string]int)
	ackAll := func(ctx context.Context, src idem.Source) {
		for ctx.Err() == nil {
			ds, err := src.Receive(ctx, 10)
			if err != nil {
				return
			}
			for _, d := range ds {
				if d.Ack(ctx) == nil {
					mu.Lock()
					acked[d.Message().EventID]++
					mu.Unlock()
				}
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { ackAll(ctx, b) })
	// b is in the group once openSource returned; wait until a gave some partitions up.
	var revoked, kept int
	require.Eventually(t, func() bool {
		gi := c.GroupInfo(group)
		return gi != nil && len(gi.Members) == 2 && gi.Members[0].NumAssigned() > 0 && gi.Members[1].NumAssigned() > 0
	}, 10*time.Second, 10*time.Millisecond, "the second member never got partitions")
	for _, d := range hold {
		err := d.Ack(ctx)
		switch {
		case err == nil:
			kept++
			mu.Lock()
			acked[d.Message().EventID]++
			mu.Unlock()
		case errors.Is(err, idemkafka.ErrRevoked):
			revoked++
		default:
			t.Fatalf("Ack of a held delivery: %v", err)
		}
	}
	require.Positive(t, revoked, "no held record was in a revoked partition")
	require.Positive(t, kept, "every held record was in a revoked partition")
	wg.Go(func() { ackAll(ctx, a) })
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) == n
	}, 20*time.Second, 20*time.Millisecond, "not every record was acked")
	cancel()
	wg.Wait()
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	commits.requireForward(t)
	var total int64
	for p := int32(0); p < 4; p++ {
		total += committed(c, group, topic, p)
	}
	require.Equal(t, int64(n), total, "committed offsets over all partitions, after everything was acked")
}

// TestCrashRedeliversUnsettled: a worker acks records around one it never settles and dies
// without a final commit; the group's offset stops at the unsettled record, and a new worker
// receives it (and what followed it, which its claims would recognise), never what came before.
func TestCrashRedeliversUnsettled(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	topic := newTopic(t, c, 1)
	msgs := make([]idem.Message, 5)
	for i := range msgs {
		msgs[i] = idem.Message{EventID: fmt.Sprintf("evt-%d", i), Payload: []byte{byte(i)}}
	}
	require.NoError(t, newSink(t, c).Publish(ctxT(t, 10*time.Second), topic, msgs...))
	group := topic + ".crash"
	first := openSource(t, c, topic, group, 10*time.Second, func(cfg *idemkafka.SourceConfig) { cfg.Order = idemkafka.OrderNone })
	var got []idem.Delivery
	for len(got) < len(msgs) {
		ds, err := first.Receive(ctxT(t, 5*time.Second), len(msgs)-len(got))
		require.NoError(t, err)
		got = append(got, ds...)
	}
	for i, d := range got {
		require.Equal(t, msgs[i].EventID, d.Message().EventID, "partition order")
		if i != 2 {
			require.NoError(t, d.Ack(context.Background()))
		}
	}
	require.Eventually(t, func() bool { return committed(c, group, topic, 0) == 2 }, 5*time.Second, 10*time.Millisecond,
		"the group's offset should reach the unsettled record (2) and stop there")
	idemkafka.Crash(first)

	second := openSource(t, c, topic, group, 10*time.Second, func(cfg *idemkafka.SourceConfig) { cfg.Order = idemkafka.OrderNone })
	var again []string
	for len(again) < 3 {
		ds, err := second.Receive(ctxT(t, 10*time.Second), 10)
		require.NoError(t, err)
		for _, d := range ds {
			again = append(again, d.Message().EventID)
			require.NoError(t, d.Ack(context.Background()))
		}
	}
	require.Equal(t, []string{"evt-2", "evt-3", "evt-4"}, again)
	require.Eventually(t, func() bool { return committed(c, group, topic, 0) == 5 }, 5*time.Second, 10*time.Millisecond)
}

// TestOrder: with OrderKey a key's second record waits for its first to settle while other keys
// go on; with OrderPartition the partition goes one record at a time.
func TestOrder(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	cases := []struct {
		order idemkafka.Order
		// first is what the first Receive returns; after acking it all the rest come.
		first []string
	}{
		{idemkafka.OrderKey, []string{"a1", "b1"}},
		{idemkafka.OrderPartition, []string{"a1"}},
		{idemkafka.OrderNone, []string{"a1", "a2", "b1", "a3"}},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.order), func(t *testing.T) {
			t.Parallel()
			topic := newTopic(t, c, 1)
			key := func(k, id string) idem.Message {
				return idem.Message{EventID: id, Payload: []byte(id), Headers: map[string]string{idemkafka.HeaderKey: k}}
			}
			require.NoError(t, newSink(t, c).Publish(ctxT(t, 10*time.Second), topic, key("a", "a1"), key("a", "a2"), key("b", "b1"), key("a", "a3")))
			src := openSource(t, c, topic, topic+".order", 10*time.Second, func(cfg *idemkafka.SourceConfig) { cfg.Order = tc.order })
			var ds []idem.Delivery
			// Wait until all four are fetched, so what Receive holds back is the Order's doing.
			time.Sleep(300 * time.Millisecond)
			ds, err := src.Receive(ctxT(t, 5*time.Second), 10)
			require.NoError(t, err)
			require.Equal(t, tc.first, eventIDs(ds))
			seen := eventIDs(ds)
			for len(seen) < 4 {
				for _, d := range ds {
					require.NoError(t, d.Ack(context.Background()))
				}
				ds, err = src.Receive(ctxT(t, 5*time.Second), 10)
				require.NoError(t, err)
				seen = append(seen, eventIDs(ds)...)
			}
			for _, d := range ds {
				require.NoError(t, d.Ack(context.Background()))
			}
			// Per key, the order of the partition.
			var as []string
			for _, id := range seen {
				if id[0] == 'a' {
					as = append(as, id)
				}
			}
			require.Equal(t, []string{"a1", "a2", "a3"}, as)
		})
	}
}

func eventIDs(ds []idem.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Message().EventID
	}
	return out
}

// TestNakRetryTopic: Nak with a delay stores a copy in the tier's retry topic with the next
// attempt, the same event id, headers and key and the original publish time; the original's
// offset is committed, and the copy comes back after the delay.
func TestNakRetryTopic(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	topic := newTopic(t, c, 1)
	m := idem.Message{EventID: "evt-retry", Tenant: "acme", Type: "t", Payload: []byte("p"), Headers: map[string]string{"Trace-Id": "x", idemkafka.HeaderKey: "order-1"}}
	require.NoError(t, newSink(t, c).Publish(ctxT(t, 10*time.Second), topic, m))
	group := topic + ".nak"
	src := openSource(t, c, topic, group, 10*time.Second)
	d := receiveOne(t, src, 5*time.Second)
	first := d.Message()
	require.Equal(t, 1, first.Attempt)
	naked := time.Now()
	require.NoError(t, d.Nak(context.Background(), 700*time.Millisecond))
	require.Eventually(t, func() bool { return committed(c, group, topic, 0) == 1 }, 5*time.Second, 10*time.Millisecond,
		"the original's offset is committed once its retry copy is stored")

	for attempt := 2; attempt <= 3; attempt++ {
		d = receiveOne(t, src, 5*time.Second)
		require.GreaterOrEqual(t, time.Since(naked), 700*time.Millisecond, "the copy came back before its delay")
		got := d.Message()
		require.Equal(t, attempt, got.Attempt)
		require.Equal(t, m.EventID, got.EventID)
		require.Equal(t, m.Tenant, got.Tenant)
		require.Equal(t, m.Headers, got.Headers)
		require.True(t, got.PublishedAt.Equal(first.PublishedAt), "PublishedAt %v, want the original's %v", got.PublishedAt, first.PublishedAt)
		naked = time.Now()
		if attempt < 3 {
			require.NoError(t, d.Nak(context.Background(), 700*time.Millisecond))
		}
	}
	require.NoError(t, d.Ack(context.Background()))
	retryTopic := idemkafka.RetryTopic(topic, group, 500*time.Millisecond)
	require.Eventually(t, func() bool { return committed(c, group, retryTopic, 0) == 2 }, 5*time.Second, 10*time.Millisecond,
		"both copies in %s settled", retryTopic)
}

// TestRevokedDeliveryCannotSettle: after Close a held delivery can neither ack, extend nor nak,
// and the offset stays before it.
func TestRevokedDeliveryCannotSettle(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	topic := newTopic(t, c, 1)
	require.NoError(t, newSink(t, c).Publish(ctxT(t, 10*time.Second), topic, idem.Message{EventID: "evt-held", Payload: []byte("p")}))
	group := topic + ".revoked"
	src := openSource(t, c, topic, group, 10*time.Second)
	d := receiveOne(t, src, 5*time.Second)
	require.NoError(t, src.Close())
	calls := map[string]func() error{
		"Ack":    func() error { return d.Ack(context.Background()) },
		"Term":   func() error { return d.Term(context.Background()) },
		"Extend": func() error { return d.Extend(context.Background()) },
		"Nak":    func() error { return d.Nak(context.Background(), time.Second) },
	}
	for name, call := range calls {
		require.Error(t, call(), name)
	}
	require.Equal(t, int64(-1), committed(c, group, topic, 0))
}

func TestSourceConfigValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  idemkafka.SourceConfig
		want string
	}{
		{"no topic", idemkafka.SourceConfig{Group: "g"}, "Topic is empty"},
		{"no group", idemkafka.SourceConfig{Topic: "t"}, "Group is empty"},
		{"tiers descend", idemkafka.SourceConfig{Topic: "t", Group: "g", RetryTiers: []time.Duration{time.Minute, time.Second}}, "tiers ascend"},
		{"tier below a millisecond", idemkafka.SourceConfig{Topic: "t", Group: "g", RetryTiers: []time.Duration{time.Microsecond}}, "whole number of milliseconds"},
		{"negative lease", idemkafka.SourceConfig{Topic: "t", Group: "g", Lease: -time.Second}, "Lease"},
		{"unknown order", idemkafka.SourceConfig{Topic: "t", Group: "g", Order: 7}, "Order is 7"},
		{"group not fit for a topic name", idemkafka.SourceConfig{Topic: "t", Group: "ledger@v1"}, `contains '@'`},
		{"retry topic name too long", idemkafka.SourceConfig{Topic: strings.Repeat("t", 240), Group: "g"}, "more than Kafka's 249"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := idemkafka.NewSource(context.Background(), tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestRetryTier(t *testing.T) {
	t.Parallel()
	tiers := []time.Duration{time.Second, 10 * time.Second, time.Minute}
	cases := []struct{ delay, want time.Duration }{
		{time.Millisecond, time.Second},
		{time.Second, time.Second},
		{9 * time.Second, time.Second},
		{10 * time.Second, 10 * time.Second},
		{time.Hour, time.Minute},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, idemkafka.RetryTier(tiers, tc.delay), "delay %v", tc.delay)
	}
	require.Equal(t, "orders.retry.ledger.1500ms", idemkafka.RetryTopic("orders", "ledger", 1500*time.Millisecond))
}

// TestEventIDOf: a record from a producer that does not know idem has no event id, unless
// SourceConfig.EventIDOf derives one; a record with Idem-Event-Id keeps its own.
func TestEventIDOf(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	topic := newTopic(t, c, 1)
	produceRaw(t, c,
		&kgo.Record{Topic: topic, Value: []byte("pay-7:captured")},
		&kgo.Record{Topic: topic, Value: []byte("x"), Headers: []kgo.RecordHeader{{Key: idemkafka.HeaderEventID, Value: []byte("own")}}},
	)
	cases := []struct {
		name string
		of   func(r *kgo.Record) string
		want []string
	}{
		{"without EventIDOf", nil, []string{"", "own"}},
		{"with EventIDOf", func(r *kgo.Record) string { return "foreign:" + string(r.Value) }, []string{"foreign:pay-7:captured", "own"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := openSource(t, c, topic, fmt.Sprintf("%s.%d", topic, i), 10*time.Second, func(cfg *idemkafka.SourceConfig) {
				cfg.EventIDOf = tc.of
				cfg.Order = idemkafka.OrderNone
			})
			var got []string
			for len(got) < 2 {
				ds, err := src.Receive(ctxT(t, 5*time.Second), 2)
				require.NoError(t, err)
				got = append(got, eventIDs(ds)...)
			}
			require.Equal(t, tc.want, got)
		})
	}
}

func TestRedeliveryWindow(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	cases := []struct {
		name   string
		config map[string]string
		want   time.Duration
	}{
		// The test's retry topics take the topic's configs (createRetryTopics).
		{"retention", map[string]string{"retention.ms": "3600000"}, time.Hour},
		{"ten days", map[string]string{"retention.ms": "864000000"}, 10 * 24 * time.Hour},
		{"kept forever", map[string]string{"retention.ms": "-1"}, idemkafka.RedeliveryWindowUnbounded},
		{"compacted", map[string]string{"cleanup.policy": "compact"}, idemkafka.RedeliveryWindowUnbounded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			topic := newTopic(t, c, 1)
			for k, v := range tc.config {
				require.NoError(t, alterTopic(c, topic, k, v))
			}
			src := openSource(t, c, topic, topic+".window", time.Second)
			require.Equal(t, tc.want, src.RedeliveryWindow())
		})
	}
}

// produceRaw writes records as a producer that does not know idem would, and waits until
// Kafka stored them.
func produceRaw(tb testing.TB, c *kfake.Cluster, recs ...*kgo.Record) {
	tb.Helper()
	cl, err := kgo.NewClient(clientOptions(c)...)
	require.NoError(tb, err)
	defer cl.Close()
	require.NoError(tb, cl.ProduceSync(ctxT(tb, 10*time.Second), recs...).FirstErr())
}

// alterTopic sets one config of topic.
func alterTopic(c *kfake.Cluster, topic, k, v string) error {
	cl, err := kgo.NewClient(clientOptions(c)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType = kmsg.ConfigResourceTypeTopic
	r.ResourceName = topic
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name, cfg.Value = k, kmsg.StringPtr(v)
	r.Configs = append(r.Configs, cfg)
	req.Resources = append(req.Resources, r)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		return err
	}
	for _, res := range resp.Resources {
		if res.ErrorCode != 0 {
			return fmt.Errorf("alter %s %s=%s: error code %d", topic, k, v, res.ErrorCode)
		}
	}
	return nil
}

// TestExpiredLeaseIsFenced: a delivery whose lease ran out and whose record went out again can
// no longer ack, extend, nak or terminate it (errors wrapping idem.ErrLeaseLost), none of those
// moves the record, and the new holder's ack settles it.
func TestExpiredLeaseIsFenced(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	topic := newTopic(t, c, 1)
	require.NoError(t, newSink(t, c).Publish(ctxT(t, 10*time.Second), topic, idem.Message{EventID: "evt-fenced", Payload: []byte("p")}))
	group := topic + ".fenced"
	src := openSource(t, c, topic, group, 300*time.Millisecond)
	stale := receiveOne(t, src, 5*time.Second)
	time.Sleep(300 * time.Millisecond)
	taken := receiveOne(t, src, 5*time.Second)
	require.Equal(t, 2, taken.Message().Attempt)
	calls := []struct {
		name string
		fn   func() error
	}{
		{"Ack", func() error { return stale.Ack(context.Background()) }},
		{"Extend", func() error { return stale.Extend(context.Background()) }},
		{"Nak(0)", func() error { return stale.Nak(context.Background(), 0) }},
		{"Nak(delay)", func() error { return stale.Nak(context.Background(), time.Second) }},
		{"Term", func() error { return stale.Term(context.Background()) }},
	}
	for _, call := range calls {
		err := call.fn()
		require.ErrorIs(t, err, idem.ErrLeaseLost, call.name)
		require.ErrorIs(t, err, idemkafka.ErrLeaseExpired, call.name)
	}
	require.NoError(t, taken.Extend(context.Background()))
	ds, err := src.Receive(ctxT(t, 200*time.Millisecond), 1)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the stale settles moved the record: %v", eventIDs(ds))
	require.NoError(t, taken.Ack(context.Background()))
	require.Eventually(t, func() bool { return committed(c, group, topic, 0) == 1 }, 5*time.Second, 10*time.Millisecond)
	require.ErrorIs(t, taken.Ack(context.Background()), idem.ErrLeaseLost, "a second Ack of a settled record")
}

// TestRetryCopiesStayInTheirGroup: two groups read one topic; a copy one group's nak produced
// reaches that group only, with its attempt count, and the other group sees the event once.
func TestRetryCopiesStayInTheirGroup(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	topic := newTopic(t, c, 1)
	require.NoError(t, newSink(t, c).Publish(ctxT(t, 10*time.Second), topic, idem.Message{EventID: "evt-both", Payload: []byte("p")}))
	ledger := openSource(t, c, topic, topic+".ledger", 10*time.Second)
	email := openSource(t, c, topic, topic+".email", 10*time.Second)

	d := receiveOne(t, ledger, 5*time.Second)
	require.NoError(t, d.Nak(context.Background(), 500*time.Millisecond))
	d = receiveOne(t, email, 5*time.Second)
	require.Equal(t, 1, d.Message().Attempt)
	require.NoError(t, d.Ack(context.Background()))

	d = receiveOne(t, ledger, 5*time.Second)
	require.Equal(t, 2, d.Message().Attempt, "the ledger group's copy")
	require.NoError(t, d.Ack(context.Background()))
	ds, err := email.Receive(ctxT(t, 1500*time.Millisecond), 10)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the email group received %v: another group's retry copy", eventIDs(ds))
}

// TestRetryStateOnTheMainTopicIsNotHonoured: only the Source writes retry copies, and only to
// its retry topics, so a record of the main topic that carries Idem-Retry-At (a foreign
// producer, a mirrored copy) is not a retry copy. Honouring it would hold the record, every
// later record of its key and the partition's committed offset until that time: one header
// dated 9999 would stall the partition (and, once MaxBuffered fills, the Source) for good.
// The record is delivered at once, and the offset moves past it once it settles.
func TestRetryStateOnTheMainTopicIsNotHonoured(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	topic := newTopic(t, c, 1)
	produceRaw(t, c,
		&kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(`{}`), Headers: []kgo.RecordHeader{
			{Key: idemkafka.HeaderEventID, Value: []byte("forged")},
			{Key: idemkafka.HeaderRetryAt, Value: []byte("9999-12-31T00:00:00Z")},
		}},
		&kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(`{}`), Headers: []kgo.RecordHeader{{Key: idemkafka.HeaderEventID, Value: []byte("next")}}},
	)
	for _, order := range []idemkafka.Order{idemkafka.OrderKey, idemkafka.OrderNone} {
		t.Run(order.String(), func(t *testing.T) {
			group := topic + "." + order.String()
			src := openSource(t, c, topic, group, 10*time.Second, func(cfg *idemkafka.SourceConfig) { cfg.Order = order })
			var got []string
			for len(got) < 2 {
				ds, err := src.Receive(ctxT(t, 10*time.Second), 2)
				require.NoError(t, err, "got only %v: a forged Idem-Retry-At held the record back", got)
				for _, d := range ds {
					got = append(got, d.Message().EventID)
					require.NoError(t, d.Ack(context.Background()))
				}
			}
			require.ElementsMatch(t, []string{"forged", "next"}, got)
			require.Eventually(t, func() bool { return committed(c, group, topic, 0) == 2 }, 10*time.Second, 10*time.Millisecond,
				"the committed offset moves past the record with the forged retry time")
		})
	}
}
