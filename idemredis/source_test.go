package idemredis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
)

// bundle is one test's client, key prefix and sink.
type bundle struct {
	rdb    *redis.Client
	prefix string
	sink   *idemredis.Sink
}

func setup(t *testing.T) bundle {
	t.Helper()
	rdb := newClient(t)
	prefix := newPrefix(t, rdb)
	sink, err := idemredis.NewSink(rdb, idemredis.SinkConfig{Prefix: prefix})
	require.NoError(t, err)
	return bundle{rdb: rdb, prefix: prefix, sink: sink}
}

// source opens a source on stream in group with lease, closed when t ends.
func (b bundle) source(t *testing.T, stream, group string, lease time.Duration, opts ...func(*idemredis.SourceConfig)) *idemredis.Source {
	t.Helper()
	cfg := idemredis.SourceConfig{Prefix: b.prefix, Stream: stream, Group: group, Lease: lease, Poll: testPoll}
	for _, o := range opts {
		o(&cfg)
	}
	src, err := idemredis.NewSource(ctxT(t, 10*time.Second), b.rdb, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	return src
}

// receiveOne receives exactly one delivery within d.
func receiveOne(t *testing.T, src idem.Source, d time.Duration) idem.Delivery {
	t.Helper()
	ds, err := src.Receive(ctxT(t, d), 1)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	return ds[0]
}

// TestNakDelayCountsAttempts: a message nak'ed with a delay again and again comes back each
// time with the next attempt and its first PublishedAt, and once acked leaves nothing behind:
// the retry stream, the delayed set and the pending list are empty.
func TestNakDelayCountsAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	src := b.source(t, "s", "g", 5*time.Second)
	require.NoError(t, b.sink.Publish(ctxT(t, 5*time.Second), "s", idem.Message{EventID: "e", Payload: []byte{0, 0xff, 'x'}, Headers: map[string]string{"H": "v"}}))
	d := receiveOne(t, src, 5*time.Second)
	published := d.Message().PublishedAt
	for want := 1; want <= 4; want++ {
		m := d.Message()
		require.Equal(t, want, m.Attempt)
		require.Equal(t, published, m.PublishedAt, "PublishedAt keeps the first publish")
		require.Equal(t, []byte{0, 0xff, 'x'}, m.Payload, "a binary payload survives the delayed set")
		require.Equal(t, "v", m.Headers["H"])
		require.NotContains(t, m.Headers, idemredis.FieldAttempt)
		if want == 4 {
			break
		}
		require.NoError(t, d.Nak(ctxT(t, 5*time.Second), 200*time.Millisecond))
		d = receiveOne(t, src, 5*time.Second)
	}
	require.NoError(t, d.Ack(ctxT(t, 5*time.Second)))
	n, err := src.Backlog(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to settle")
	pending, err := b.rdb.XPending(ctxT(t, 5*time.Second), b.prefix+"s", "g").Result()
	require.NoError(t, err)
	require.Zero(t, pending.Count)
}

// TestGroupsFanOut: every group gets every entry, and a nak in one group is that group's
// alone: the other neither sees the retry nor counts an attempt.
func TestGroupsFanOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ledger := b.source(t, "s", "ledger", 5*time.Second)
	mailer := b.source(t, "s", "mailer", 5*time.Second)
	require.NoError(t, b.sink.Publish(ctxT(t, 5*time.Second), "s", idem.Message{EventID: "e", Payload: []byte("p")}))
	dl := receiveOne(t, ledger, 5*time.Second)
	require.NoError(t, dl.Nak(ctxT(t, 5*time.Second), 100*time.Millisecond))
	dm := receiveOne(t, mailer, 5*time.Second)
	require.Equal(t, 1, dm.Message().Attempt)
	require.NoError(t, dm.Ack(ctxT(t, 5*time.Second)))
	dl = receiveOne(t, ledger, 5*time.Second)
	require.Equal(t, 2, dl.Message().Attempt)
	require.NoError(t, dl.Ack(ctxT(t, 5*time.Second)))
	_, err := mailer.Receive(ctxT(t, time.Second), 10)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the mailer group got the ledger's retry")
}

// TestStartNewest: a group created with StartNewest skips what the stream held before.
func TestStartNewest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.sink.Publish(ctxT(t, 5*time.Second), "s", idem.Message{EventID: "old", Payload: []byte("p")}))
	src := b.source(t, "s", "g", 5*time.Second, func(c *idemredis.SourceConfig) { c.Start = idemredis.StartNewest })
	require.NoError(t, b.sink.Publish(ctxT(t, 5*time.Second), "s", idem.Message{EventID: "new", Payload: []byte("p")}))
	d := receiveOne(t, src, 5*time.Second)
	require.Equal(t, "new", d.Message().EventID)
}

// TestDecodeErrorIsDelivered: an entry a foreign producer wrote with a malformed field is
// delivered with no event id and the reason, so the consumer dead-letters it instead of the
// source dropping or looping on it.
func TestDecodeErrorIsDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	src := b.source(t, "s", "g", 5*time.Second)
	require.NoError(t, b.rdb.XAdd(ctxT(t, 5*time.Second), &redis.XAddArgs{Stream: b.prefix + "s", Values: []any{
		idemredis.FieldEventID, "e", idemredis.FieldOccurredAt, "last tuesday", "payload", "p",
	}}).Err())
	d := receiveOne(t, src, 5*time.Second)
	require.Empty(t, d.Message().EventID)
	require.Contains(t, d.Message().Headers[idemredis.HeaderDecodeError], "not RFC 3339")
}

// TestTenantBound: a source bound to a tenant stamps it on every message and keeps a different
// claimed tenant in the headers for the authenticator to refuse.
func TestTenantBound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	src := b.source(t, "s", "g", 5*time.Second, func(c *idemredis.SourceConfig) { c.Tenant = "acme" })
	require.NoError(t, b.sink.Publish(ctxT(t, 5*time.Second), "s",
		idem.Message{EventID: "e1", Tenant: "globex", Payload: []byte("p")},
		idem.Message{EventID: "e2", Payload: []byte("p")}))
	ds, err := src.Receive(ctxT(t, 5*time.Second), 2)
	require.NoError(t, err)
	require.Len(t, ds, 2)
	for _, d := range ds {
		m := d.Message()
		require.Equal(t, "acme", m.Tenant)
		if m.EventID == "e1" {
			require.Equal(t, "globex", m.Headers[idemredis.FieldTenant])
		} else {
			require.NotContains(t, m.Headers, idemredis.FieldTenant)
		}
	}
}

// TestDedupIsScoped: the sink drops an identical republish, but not the same event id with
// other content or on another stream, nor a dead-letter replay; with deduplication off it
// drops nothing.
func TestDedupIsScoped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, 10*time.Second)
	m := idem.Message{EventID: "e", Type: "t", Payload: []byte("p")}
	replay := m.Clone()
	replay.Headers = map[string]string{idem.HeaderReplayOf: "7"}
	other := m.Clone()
	other.Payload = []byte("q")
	require.NoError(t, b.sink.Publish(ctx, "a", m, m, other, replay, replay))
	require.NoError(t, b.sink.Publish(ctx, "b", m))
	require.EqualValues(t, 3, b.rdb.XLen(ctx, b.prefix+"a").Val(), "first, other content, replay")
	require.EqualValues(t, 1, b.rdb.XLen(ctx, b.prefix+"b").Val())

	off, err := idemredis.NewSink(b.rdb, idemredis.SinkConfig{Prefix: b.prefix, DedupWindow: -1})
	require.NoError(t, err)
	require.NoError(t, off.Publish(ctx, "c", m, m))
	require.EqualValues(t, 2, b.rdb.XLen(ctx, b.prefix+"c").Val())

	trimmed, err := idemredis.NewSink(b.rdb, idemredis.SinkConfig{Prefix: b.prefix, DedupWindow: -1, MaxLen: 1})
	require.NoError(t, err)
	for range 300 {
		require.NoError(t, trimmed.Publish(ctx, "d", m))
	}
	require.Less(t, b.rdb.XLen(ctx, b.prefix+"d").Val(), int64(300), "MaxLen trims the stream (approximately)")
}

// TestSinkFailures: a publish that cannot be sent names its event and sends nothing after it.
func TestSinkFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, 10*time.Second)
	sink, err := idemredis.NewSink(b.rdb, idemredis.SinkConfig{Prefix: b.prefix, MaxPayload: 4})
	require.NoError(t, err)
	err = sink.Publish(ctx, "s", idem.Message{EventID: "ok", Payload: []byte("1")},
		idem.Message{EventID: "big", Payload: []byte("12345")}, idem.Message{EventID: "after", Payload: []byte("2")})
	require.ErrorContains(t, err, "event big")
	require.EqualValues(t, 1, b.rdb.XLen(ctx, b.prefix+"s").Val(), "only the message before the failure")
	require.ErrorContains(t, sink.Publish(ctx, "", idem.Message{EventID: "e"}), "empty topic")
	require.NoError(t, sink.Close())
	require.ErrorContains(t, sink.Publish(ctx, "s", idem.Message{EventID: "e"}), "sink closed")
}

// TestCloseLeavesGroup: a closed source that holds nothing leaves its group's consumer list;
// one that holds a delivery stays, so that its entry is still claimed after its lease.
func TestCloseLeavesGroup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, 10*time.Second)
	idle := b.source(t, "s", "g", time.Second)
	busy := b.source(t, "s", "g", time.Second)
	require.NoError(t, b.sink.Publish(ctx, "s", idem.Message{EventID: "e", Payload: []byte("p")}))
	held := receiveOne(t, busy, 5*time.Second)
	require.NoError(t, idle.Close())
	require.NoError(t, busy.Close())
	require.NoError(t, idle.Close(), "a second Close is harmless")
	consumers, err := b.rdb.XInfoConsumers(ctx, b.prefix+"s", "g").Result()
	require.NoError(t, err)
	require.Len(t, consumers, 1)
	require.Equal(t, busy.Consumer(), consumers[0].Name)
	_, err = busy.Receive(ctx, 1)
	require.ErrorContains(t, err, "source closed")

	other := b.source(t, "s", "g", time.Second)
	d := receiveOne(t, other, 5*time.Second)
	require.Equal(t, 2, d.Message().Attempt)
	require.ErrorIs(t, held.Ack(ctx), idem.ErrLeaseLost)
	require.NoError(t, d.Ack(ctx))
}

// TestStreamDeletedRecovers: a stream deleted under a running source (and its groups with it)
// is created again by the next receive, which goes on delivering.
func TestStreamDeletedRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, 10*time.Second)
	src := b.source(t, "s", "g", time.Second)
	require.NoError(t, b.rdb.Del(ctx, b.prefix+"s", b.prefix+"s/retry/g").Err())
	_, err := src.Receive(ctxT(t, 500*time.Millisecond), 1)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "receive after the deletion: %v", err)
	require.NoError(t, b.sink.Publish(ctx, "s", idem.Message{EventID: "e", Payload: []byte("p")}))
	d := receiveOne(t, src, 5*time.Second)
	require.Equal(t, "e", d.Message().EventID)
}
