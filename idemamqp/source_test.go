package idemamqp_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemamqp"
	"github.com/idemkit/idem/internal/testenv"
)

// fixture is one test's queue, a source on it through a recording dialer, and a sink.
type fixture struct {
	t     *testing.T
	queue string
	rec   *recorder
	src   *idemamqp.Source
	sink  *idemamqp.Sink
}

func newFixture(t *testing.T, edit func(*idemamqp.SourceConfig)) *fixture {
	t.Helper()
	f := &fixture{t: t, queue: newQueueName(t), rec: newRecorder(t)}
	cfg := sourceConfig(f.queue, 10*time.Second)
	if edit != nil {
		edit(&cfg)
	}
	t.Cleanup(func() { deleteQueues(t, f.rec.dial, cfg) })
	src, err := idemamqp.NewSource(ctxT(t, 10*time.Second), f.rec.Dial, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	f.src = src
	sink, err := idemamqp.NewSink(ctxT(t, 10*time.Second), idemamqp.DialURL(testenv.AMQP(t), "idemamqp-test sink"), idemamqp.SinkConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })
	f.sink = sink
	return f
}

func (f *fixture) publish(ids ...string) {
	f.t.Helper()
	msgs := make([]idem.Message, len(ids))
	for i, id := range ids {
		msgs[i] = idem.Message{EventID: id, Payload: []byte(id)}
	}
	require.NoError(f.t, f.sink.Publish(ctxT(f.t, 10*time.Second), f.queue, msgs...))
}

// receiveOne receives exactly one delivery within d.
func (f *fixture) receiveOne(d time.Duration) *idemamqp.Delivery {
	f.t.Helper()
	ds, err := f.src.Receive(ctxT(f.t, d), 1)
	require.NoError(f.t, err)
	require.Len(f.t, ds, 1)
	return ds[0].(*idemamqp.Delivery)
}

// expectNone fails if anything arrives within d.
func (f *fixture) expectNone(d time.Duration) {
	f.t.Helper()
	ds, err := f.src.Receive(ctxT(f.t, d), 10)
	require.ErrorIs(f.t, err, context.DeadlineExceeded, "received %d deliveries", len(ds))
}

// TestConnectionLossRedelivers: a delivery of a connection that died cannot be settled on the
// new one (every settle fails with ErrLeaseLost); the broker redelivers it flagged redelivered,
// as attempt 2, to the reconnected source.
func TestConnectionLossRedelivers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.publish("evt-loss")
	d := f.receiveOne(5 * time.Second)
	require.Equal(t, "evt-loss", d.Message().EventID)
	require.Equal(t, 1, d.Message().Attempt)
	require.False(t, d.Raw().Redelivered)

	require.Equal(t, 1, f.rec.killAll())
	ctx := ctxT(t, 5*time.Second)
	require.ErrorIs(t, d.Ack(ctx), idem.ErrLeaseLost)
	require.ErrorIs(t, d.Nak(ctx, 0), idem.ErrLeaseLost)
	require.ErrorIs(t, d.Extend(ctx), idem.ErrLeaseLost)
	require.ErrorIs(t, d.Term(ctx), idem.ErrLeaseLost)

	again := f.receiveOne(10 * time.Second)
	require.Equal(t, "evt-loss", again.Message().EventID)
	require.True(t, again.Raw().Redelivered, "the broker flags a requeued delivery")
	require.Equal(t, 2, again.Message().Attempt)
	require.NoError(t, again.Ack(ctx))
	f.rec.mu.Lock()
	require.Len(t, f.rec.conns, 2, "the source reconnected once")
	f.rec.mu.Unlock()
	f.expectNone(1500 * time.Millisecond)
}

// TestConnectionLossKeepsConsuming: a worker receiving and acking while its connection is
// killed three times gets every message, and after the last ack the queue is empty: nothing is
// lost, and whatever came twice was a delivery whose ack died with its channel.
func TestConnectionLossKeepsConsuming(t *testing.T) {
	t.Parallel()
	const n = 300
	f := newFixture(t, func(c *idemamqp.SourceConfig) { c.Prefetch = 20 })
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt-%03d", i)
	}
	f.publish(ids...)

	seen := make(map[string]int)
	acked := make(map[string]bool)
	lostAcks := 0
	kills := 0
	ctx := ctxT(t, 60*time.Second)
	for len(acked) < n {
		ds, err := f.src.Receive(ctx, 10)
		require.NoError(t, err, "after %d of %d acked", len(acked), n)
		if kills < 3 && len(acked) >= (kills+1)*n/4 {
			// Kill the connection while this batch is in hand, before its acks.
			require.Equal(t, 1, f.rec.killAll())
			kills++
		}
		for _, d := range ds {
			id := d.Message().EventID
			seen[id]++
			if err := d.Ack(ctx); err != nil {
				require.ErrorIs(t, err, idem.ErrLeaseLost)
				lostAcks++
				continue
			}
			acked[id] = true
		}
	}
	require.Equal(t, 3, kills)
	for _, id := range ids {
		require.True(t, acked[id], "event %s acked", id)
	}
	require.Positive(t, lostAcks, "batches were in hand when their connection died")
	require.Greater(t, sumValues(seen), n, "what was in hand came back")
	f.expectNone(1500 * time.Millisecond)
	t.Logf("%d messages, 3 connection kills: %d deliveries, %d acks refused on a dead channel", n, sumValues(seen), lostAcks)
}

func sumValues(m map[string]int) int {
	s := 0
	for _, v := range m {
		s += v
	}
	return s
}

// TestNakCountsAttempts: each Nak republishes with the next attempt, straight back (delay 0)
// or through the delay queue of the delay's tier, which holds it at least that long.
func TestNakCountsAttempts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.publish("evt-nak")
	ctx := ctxT(t, 30*time.Second)
	d := f.receiveOne(5 * time.Second)
	for attempt := 1; attempt <= 3; attempt++ {
		require.Equal(t, attempt, d.Message().Attempt)
		require.NoError(t, d.Nak(ctx, 0))
		d = f.receiveOne(5 * time.Second)
	}
	require.Equal(t, 4, d.Message().Attempt)
	naked := time.Now()
	require.NoError(t, d.Nak(ctx, 700*time.Millisecond)) // the 1s tier
	d = f.receiveOne(5 * time.Second)
	require.GreaterOrEqual(t, time.Since(naked), 900*time.Millisecond, "rounded up to the 1s tier")
	require.Equal(t, 5, d.Message().Attempt)
	require.Equal(t, idemamqp.DelayQueueName(f.queue, time.Second), deathQueue(d.Raw().Headers), "it waited in the 1s delay queue")
	require.NoError(t, d.Ack(ctx))
	f.expectNone(time.Second)
}

// deathQueue is the queue named by the first x-death entry.
func deathQueue(h amqp.Table) string {
	deaths, _ := h["x-death"].([]any)
	if len(deaths) == 0 {
		return ""
	}
	t, _ := deaths[0].(amqp.Table)
	q, _ := t["queue"].(string)
	return q
}

// TestLeaseExpiryGivesBack: past its lease an unsettled delivery goes back to the queue, and its
// old handle can no longer settle it.
func TestLeaseExpiryGivesBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *idemamqp.SourceConfig) { c.Lease = 500 * time.Millisecond })
	f.publish("evt-lease")
	d := f.receiveOne(5 * time.Second)
	again := f.receiveOne(5 * time.Second)
	require.Equal(t, "evt-lease", again.Message().EventID)
	require.Equal(t, 2, again.Message().Attempt)
	require.ErrorIs(t, d.Ack(ctxT(t, time.Second)), idem.ErrLeaseLost)
	require.NoError(t, again.Ack(ctxT(t, time.Second)))
}

// TestExtendStopsBeforeConsumerTimeout: Extend cannot move the broker's consumer_timeout, so
// near it the source gives the delivery back itself instead of letting the broker close the
// channel (and with it every other delivery).
func TestExtendStopsBeforeConsumerTimeout(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *idemamqp.SourceConfig) {
		c.Lease = time.Second
		c.ConsumerTimeout = 3 * time.Second
	})
	f.publish("evt-slow")
	d := f.receiveOne(5 * time.Second)
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, d.Extend(ctx), "young enough")
	time.Sleep(1900 * time.Millisecond)
	require.ErrorIs(t, d.Extend(ctx), idem.ErrLeaseLost, "another lease would pass consumer_timeout")
	again := f.receiveOne(5 * time.Second)
	require.Equal(t, 2, again.Message().Attempt)
	require.NoError(t, again.Ack(ctx))
	f.rec.mu.Lock()
	require.Len(t, f.rec.conns, 1, "the channel survived")
	f.rec.mu.Unlock()
}

// TestQuorumQueue: a quorum queue with a delivery limit the retry policy fits under; the broker's
// x-delivery-count counts the returns of one queue message.
func TestQuorumQueue(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *idemamqp.SourceConfig) {
		c.QueueType = idemamqp.QueueQuorum
		c.DeliveryLimit = 10
		c.Lease = 500 * time.Millisecond
	})
	require.Equal(t, 10, f.src.DeliveryLimit())
	f.publish("evt-q")
	_ = f.receiveOne(5 * time.Second) // left to expire
	again := f.receiveOne(5 * time.Second)
	require.Equal(t, 2, again.Message().Attempt)
	require.NoError(t, again.Nak(ctxT(t, 5*time.Second), 100*time.Millisecond))
	third := f.receiveOne(5 * time.Second)
	require.Equal(t, 3, third.Message().Attempt)
	require.NoError(t, third.Ack(ctxT(t, 5*time.Second)))
}

func TestRedeliveryWindow(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	require.Equal(t, idemamqp.RedeliveryWindowUnbounded, f.src.RedeliveryWindow(), "no message TTL: unbounded")
	g := newFixture(t, func(c *idemamqp.SourceConfig) { c.MessageTTL = time.Hour })
	require.Equal(t, time.Hour+time.Hour+idemamqp.ConsumerTimeoutDefault, g.src.RedeliveryWindow())
}

// TestSinkUnroutable: a message no queue is bound for is an error, not a silent drop.
func TestSinkUnroutable(t *testing.T) {
	t.Parallel()
	sink, err := idemamqp.NewSink(ctxT(t, 10*time.Second), idemamqp.DialURL(testenv.AMQP(t), "idemamqp-test"), idemamqp.SinkConfig{})
	require.NoError(t, err)
	defer sink.Close()
	err = sink.Publish(ctxT(t, 10*time.Second), newQueueName(t), idem.Message{EventID: "evt-nowhere", Payload: []byte("x")})
	require.ErrorIs(t, err, idemamqp.ErrUnroutable)
	require.ErrorContains(t, err, `(event "evt-nowhere")`)
}

// TestSinkOrderPerKey: a key's messages go out one after the other, and the first refused one
// holds the rest of its key back; other keys go on.
func TestSinkOrderPerKey(t *testing.T) {
	t.Parallel()
	dial := idemamqp.DialURL(testenv.AMQP(t), "idemamqp-test")
	cases := []struct {
		name     string
		orderKey func(idem.Message) string
		batch    []string // event ids "<key><n>"
		want     map[string]error
	}{
		{
			name:     "whole batch ordered",
			orderKey: nil,
			batch:    []string{"a1", "b1", "c1"},
			want:     map[string]error{"b1": idemamqp.ErrNacked, "c1": idemamqp.ErrHeldBack},
		},
		{
			name:     "per key",
			orderKey: func(m idem.Message) string { return m.EventID[:1] },
			batch:    []string{"b1", "a1", "a2"},
			want:     map[string]error{"a1": idemamqp.ErrNacked, "a2": idemamqp.ErrHeldBack},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q := newQueueName(t)
			cfg := sourceConfig(q, time.Second)
			// A queue that holds one message and refuses the next with a nack.
			cfg.QueueArgs["x-max-length"] = int64(1)
			cfg.QueueArgs["x-overflow"] = "reject-publish"
			declareQueue(t, dial, cfg)
			sink, err := idemamqp.NewSink(ctxT(t, 10*time.Second), dial, idemamqp.SinkConfig{OrderKey: tc.orderKey})
			require.NoError(t, err)
			defer sink.Close()
			msgs := make([]idem.Message, len(tc.batch))
			for i, id := range tc.batch {
				msgs[i] = idem.Message{EventID: id, Payload: []byte(id)}
			}
			err = sink.Publish(ctxT(t, 10*time.Second), q, msgs...)
			require.Error(t, err)
			var joined interface{ Unwrap() []error }
			require.True(t, errors.As(err, &joined))
			got := make(map[string]error)
			for _, e := range joined.Unwrap() {
				for _, id := range tc.batch {
					if strings.Contains(e.Error(), fmt.Sprintf("(event %q)", id)) {
						got[id] = e
					}
				}
			}
			require.Len(t, got, len(tc.want), "failed events: %v", err)
			for id, want := range tc.want {
				require.ErrorIs(t, got[id], want, "event %s", id)
			}
		})
	}
}

// TestSinkReconnects: after its connection is lost the sink dials again on the next publish.
func TestSinkReconnects(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	q := newQueueName(t)
	declareQueue(t, rec.dial, sourceConfig(q, time.Second))
	sink, err := idemamqp.NewSink(ctxT(t, 10*time.Second), rec.Dial, idemamqp.SinkConfig{})
	require.NoError(t, err)
	defer sink.Close()
	msg := idem.Message{EventID: "evt-r", Payload: []byte("x")}
	require.NoError(t, sink.Publish(ctxT(t, 10*time.Second), q, msg))
	require.Equal(t, 1, rec.killAll())
	time.Sleep(50 * time.Millisecond) // let the client see the close
	require.NoError(t, sink.Publish(ctxT(t, 10*time.Second), q, msg))
	rec.mu.Lock()
	require.Len(t, rec.conns, 2)
	rec.mu.Unlock()
}

// TestIdleSourceHandsBack: a source nobody receives from (a paused consumer) gives the
// messages the broker pushed to it back to the queue after a lease, unchanged, so another
// consumer of the queue gets them as first attempts.
func TestIdleSourceHandsBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *idemamqp.SourceConfig) { c.Lease = 500 * time.Millisecond })
	ids := []string{"evt-0", "evt-1", "evt-2", "evt-3", "evt-4"}
	f.publish(ids...)
	time.Sleep(100 * time.Millisecond) // the broker pushes them to the idle source
	other, err := idemamqp.NewSource(ctxT(t, 10*time.Second), f.rec.dial, sourceConfig(f.queue, 10*time.Second))
	require.NoError(t, err)
	defer other.Close()
	ctx := ctxT(t, 10*time.Second)
	var got []string
	for len(got) < len(ids) {
		ds, err := other.Receive(ctx, 10)
		require.NoError(t, err, "received %v", got)
		for _, d := range ds {
			got = append(got, d.Message().EventID)
			require.Equal(t, 1, d.Message().Attempt, "handed back unseen: still the first attempt")
			require.NoError(t, d.Ack(ctx))
		}
	}
	require.ElementsMatch(t, ids, got)
	require.NoError(t, other.Close())
	// The idle source consumes again as soon as someone receives from it.
	f.publish("evt-later")
	d := f.receiveOne(5 * time.Second)
	require.Equal(t, "evt-later", d.Message().EventID)
	require.NoError(t, d.Ack(ctx))
}

// TestSourceTenant: a source bound to a tenant stamps it on every message and keeps a different
// claimed tenant in the Idem-Tenant header, for an Authenticator to refuse.
func TestSourceTenant(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *idemamqp.SourceConfig) { c.Tenant = "acme" })
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, f.sink.Publish(ctx, f.queue,
		idem.Message{EventID: "evt-own", Tenant: "acme", Payload: []byte("x")},
		idem.Message{EventID: "evt-claim", Tenant: "evil", Payload: []byte("x")}))
	got := map[string]idem.Message{}
	for len(got) < 2 {
		d := f.receiveOne(5 * time.Second)
		got[d.Message().EventID] = d.Message()
		require.NoError(t, d.Ack(ctx))
	}
	require.Equal(t, "acme", got["evt-own"].Tenant)
	require.Empty(t, got["evt-own"].Header(idemamqp.HeaderTenant))
	require.Equal(t, "acme", got["evt-claim"].Tenant)
	require.Equal(t, "evil", got["evt-claim"].Header(idemamqp.HeaderTenant))
}

// TestStalePrefetchGivenBack: a delivery that waited in the prefetch until a lease would carry
// it past consumer_timeout is not handed out but given back, and comes again fresh.
func TestStalePrefetchGivenBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *idemamqp.SourceConfig) {
		// Limit 2.7s: stale after 0.7s in the prefetch, and idle (handed back) only after 2s.
		c.Lease = 2 * time.Second
		c.ConsumerTimeout = 3 * time.Second
	})
	f.publish("evt-stale")
	time.Sleep(1200 * time.Millisecond)
	d := f.receiveOne(5 * time.Second)
	require.Equal(t, "evt-stale", d.Message().EventID)
	require.True(t, d.Raw().Redelivered, "the stale copy was given back, this is its redelivery")
	require.NoError(t, d.Ack(ctxT(t, 5*time.Second)))
}

// TestBindingsFanOut: two consumers' queues bound to one topic exchange each get every event
// the sink publishes there; a routing key no queue binds is unroutable.
func TestBindingsFanOut(t *testing.T) {
	t.Parallel()
	exchange := newQueueName(t) + ".events"
	bind := func(c *idemamqp.SourceConfig) {
		c.Bindings = []idemamqp.Binding{{Exchange: exchange, RoutingKey: "payments.#"}}
	}
	ledger := newFixture(t, bind)
	mailer := newFixture(t, bind)
	t.Cleanup(func() {
		conn, err := ledger.rec.dial(ctxT(t, 10*time.Second))
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, ch.ExchangeDelete(exchange, false, false))
	})
	sink, err := idemamqp.NewSink(ctxT(t, 10*time.Second), ledger.rec.dial, idemamqp.SinkConfig{Exchange: exchange})
	require.NoError(t, err)
	defer sink.Close()
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, sink.Publish(ctx, "payments.captured", idem.Message{EventID: "evt-fan", Payload: []byte("x")}))
	for _, f := range []*fixture{ledger, mailer} {
		d := f.receiveOne(5 * time.Second)
		require.Equal(t, "evt-fan", d.Message().EventID)
		require.NoError(t, d.Ack(ctx))
	}
	err = sink.Publish(ctx, "orders.shipped", idem.Message{EventID: "evt-lost", Payload: []byte("x")})
	require.ErrorIs(t, err, idemamqp.ErrUnroutable)
}
