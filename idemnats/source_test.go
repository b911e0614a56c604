package idemnats_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
)

// sourceBundle is one stream with a source and sink on it.
type sourceBundle struct {
	js      jetstream.JetStream
	stream  string
	subject string
	src     *idemnats.Source
	sink    *idemnats.Sink
}

func setupSource(t *testing.T, cfg idemnats.SourceConfig) sourceBundle {
	t.Helper()
	js := connect(t)
	stream, subject := testStream(t, js)
	cfg.Stream, cfg.Subject = stream, subject
	if cfg.Durable == "" {
		cfg.Durable = "test"
	}
	src, err := idemnats.NewSource(ctxT(t, 10*time.Second), js, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	return sourceBundle{js: js, stream: stream, subject: subject, src: src, sink: idemnats.NewSink(js)}
}

// receiveOne receives exactly one delivery within a few seconds.
func receiveOne(t *testing.T, src idem.Source) idem.Delivery {
	t.Helper()
	ds, err := src.Receive(ctxT(t, 5*time.Second), 1)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	return ds[0]
}

func TestSourceChannelBoundTenant(t *testing.T) {
	t.Parallel()
	b := setupSource(t, idemnats.SourceConfig{Tenant: "acme"})
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, b.sink.Publish(ctx, b.subject,
		idem.Message{EventID: "claims-other", Tenant: "evil"},
		idem.Message{EventID: "claims-none"},
		idem.Message{EventID: "claims-same", Tenant: "acme"},
	))
	got := map[string]idem.Message{}
	for len(got) < 3 {
		d := receiveOne(t, b.src)
		require.NoError(t, d.Ack(ctx))
		got[d.Message().EventID] = d.Message()
	}
	for id, m := range got {
		require.Equal(t, "acme", m.Tenant, "event %s takes the source's tenant", id)
	}
	require.Equal(t, "evil", got["claims-other"].Header(idemnats.HeaderTenant), "a contradicting claim stays visible to the Authenticator")
	require.Empty(t, got["claims-none"].Header(idemnats.HeaderTenant))
	require.Empty(t, got["claims-same"].Header(idemnats.HeaderTenant))
}

func TestSourceHandsOutUndecodableMessages(t *testing.T) {
	t.Parallel()
	b := setupSource(t, idemnats.SourceConfig{})
	ctx := ctxT(t, 10*time.Second)

	// Published by a foreign producer, around the Sink.
	_, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: b.subject, Data: []byte("no id")})
	require.NoError(t, err)
	d := receiveOne(t, b.src)
	require.Empty(t, d.Message().EventID, "a message without Nats-Msg-Id has no EventID; the consumer dead-letters it")
	require.Empty(t, d.Message().Header(idemnats.HeaderDecodeError))
	require.Equal(t, []byte("no id"), d.Message().Payload)
	require.NoError(t, d.Ack(ctx))

	_, err = b.js.PublishMsg(ctx, &nats.Msg{Subject: b.subject, Header: nats.Header{
		"Nats-Msg-Id": {"bad-time"}, "Idem-Occurred-At": {"last tuesday"},
	}})
	require.NoError(t, err)
	d = receiveOne(t, b.src)
	m := d.Message()
	require.Empty(t, m.EventID, "an undecodable message must not be processed under its id")
	require.Equal(t, "bad-time", m.Header(idemnats.HeaderEventID), "the original id stays visible in the dead letter")
	require.Contains(t, m.Header(idemnats.HeaderDecodeError), "Idem-Occurred-At")
	require.Equal(t, 1, m.Attempt)
	require.NoError(t, d.Ack(ctx))
}

func TestSourceCloseEndsReceive(t *testing.T) {
	t.Parallel()
	b := setupSource(t, idemnats.SourceConfig{})
	errc := make(chan error, 1)
	go func() {
		_, err := b.src.Receive(ctxT(t, 10*time.Second), 1)
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	require.NoError(t, b.src.Close())
	select {
	case err := <-errc:
		require.ErrorIs(t, err, idemnats.ErrClosed)
		require.Less(t, time.Since(start), time.Second)
	case <-time.After(3 * time.Second):
		t.Fatal("Receive did not return after Close")
	}
	_, err := b.src.Receive(ctxT(t, time.Second), 1)
	require.ErrorIs(t, err, idemnats.ErrClosed)
	require.NoError(t, b.src.Close(), "Close is idempotent")
}

func TestSourceReceiveRefusesZeroMax(t *testing.T) {
	t.Parallel()
	b := setupSource(t, idemnats.SourceConfig{})
	_, err := b.src.Receive(ctxT(t, time.Second), 0)
	require.ErrorContains(t, err, "max is 0")
}

func TestSourceDoesNotHoldBackATrickle(t *testing.T) {
	t.Parallel()
	b := setupSource(t, idemnats.SourceConfig{MaxWait: 5 * time.Second})
	ctx := ctxT(t, 10*time.Second)
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = b.sink.Publish(ctx, b.subject, idem.Message{EventID: "only"})
	}()
	start := time.Now()
	ds, err := b.src.Receive(ctx, 50)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Less(t, time.Since(start), 2*time.Second, "one message must not wait for a batch of 50 or for MaxWait")
	require.NoError(t, ds[0].Ack(ctx))
}

func TestNewSourceCreatesOrUpdatesTheDurable(t *testing.T) {
	t.Parallel()
	js := connect(t)
	stream, subject := testStream(t, js)
	ctx := ctxT(t, 10*time.Second)
	cfg := idemnats.SourceConfig{Stream: stream, Subject: subject, Durable: "ledger", AckWait: 5 * time.Second}
	src, err := idemnats.NewSource(ctx, js, cfg)
	require.NoError(t, err)
	require.Equal(t, stream+"/ledger", src.Name())
	require.Equal(t, 5*time.Second, src.Lease())

	cfg.AckWait = 7 * time.Second
	src, err = idemnats.NewSource(ctx, js, cfg)
	require.NoError(t, err)
	require.Equal(t, 7*time.Second, src.Lease())
	cons, err := js.Consumer(ctx, stream, "ledger")
	require.NoError(t, err)
	info := cons.CachedInfo()
	require.Equal(t, 7*time.Second, info.Config.AckWait)
	require.Equal(t, jetstream.AckExplicitPolicy, info.Config.AckPolicy)
	require.Equal(t, idemnats.MaxDeliverDefault, info.Config.MaxDeliver)
	require.Equal(t, subject, info.Config.FilterSubject)

	_, err = idemnats.NewSource(ctx, js, idemnats.SourceConfig{Stream: "IDEMTEST_NO_SUCH_STREAM", Durable: "d"})
	require.ErrorContains(t, err, "create consumer d on stream IDEMTEST_NO_SUCH_STREAM")
}

func TestSinkPublishErrorsNameTheEvent(t *testing.T) {
	t.Parallel()
	js := connect(t)
	sink := idemnats.NewSink(js)
	ctx := ctxT(t, 10*time.Second)
	noStream := "idemtest.nostream." + t.Name()

	err := sink.Publish(ctx, noStream, idem.Message{EventID: "lonely"})
	require.ErrorContains(t, err, "publish event lonely to "+noStream)

	err = sink.Publish(ctx, noStream, idem.Message{EventID: "b1"}, idem.Message{EventID: "b2"})
	require.ErrorContains(t, err, "event b1")
	require.ErrorContains(t, err, "event b2")

	err = sink.Publish(ctx, noStream, idem.Message{EventID: "ok"}, idem.Message{Type: "anonymous"})
	require.ErrorContains(t, err, "message 1")
	require.ErrorContains(t, err, "no EventID")
}

func TestSinkDuplicateCountsAsSuccess(t *testing.T) {
	t.Parallel()
	b := setupSource(t, idemnats.SourceConfig{})
	ctx := ctxT(t, 10*time.Second)
	m := idem.Message{EventID: "twice", Payload: []byte("p")}
	require.NoError(t, b.sink.Publish(ctx, b.subject, m))
	require.NoError(t, b.sink.Publish(ctx, b.subject, m), "a republish within the duplicate window is a success")
	st, err := b.js.Stream(ctx, b.stream)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.CachedInfo().State.Msgs, "the stream stores the event once")
}

func TestDeliverySettleErrorsNameTheEvent(t *testing.T) {
	t.Parallel()
	b := setupSource(t, idemnats.SourceConfig{})
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, b.sink.Publish(ctx, b.subject, idem.Message{EventID: "settled"}))
	d := receiveOne(t, b.src)
	require.NoError(t, d.Ack(ctx))
	err := d.Nak(ctx, 0)
	require.ErrorIs(t, err, jetstream.ErrMsgAlreadyAckd)
	require.ErrorContains(t, err, "nak event settled")

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	require.True(t, errors.Is(d.Extend(cancelled), context.Canceled))
	require.Same(t, d.(*idemnats.Delivery).Msg(), d.(*idemnats.Delivery).Msg())
}

// TestSourcePrefetch: a Receive for one message pulls Prefetch more, which the next Receives
// hand out without asking the server; Close gives back what is still held (nak'ed), so it comes
// back at once to a new Source, and not as an extra attempt. With AsyncAck the acks of the
// handed-out messages still reach the server.
func TestSourcePrefetch(t *testing.T) {
	t.Parallel()
	b := setupSource(t, idemnats.SourceConfig{Prefetch: 4, AsyncAck: true})
	ctx := ctxT(t, 20*time.Second)
	var msgs []idem.Message
	for _, id := range []string{"p1", "p2", "p3", "p4", "p5", "p6"} {
		msgs = append(msgs, idem.Message{EventID: id})
	}
	require.NoError(t, b.sink.Publish(ctx, b.subject, msgs...))
	cons, err := b.js.Consumer(ctx, b.stream, "test")
	require.NoError(t, err)

	var got []string
	for range 3 {
		d := receiveOne(t, b.src)
		got = append(got, d.Message().EventID)
		require.NoError(t, d.Ack(ctx))
	}
	require.Equal(t, []string{"p1", "p2", "p3"}, got, "held messages go out in order")
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 5, info.Delivered.Consumer, "one pull of 1+4 served the three receives")

	require.NoError(t, b.src.Close())
	again, err := idemnats.NewSource(ctx, b.js, idemnats.SourceConfig{Stream: b.stream, Subject: b.subject, Durable: "test"})
	require.NoError(t, err)
	defer again.Close()
	got = nil
	for range 3 {
		d := receiveOne(t, again)
		got = append(got, d.Message().EventID)
		require.NoError(t, d.Ack(ctx))
	}
	require.ElementsMatch(t, []string{"p4", "p5", "p6"}, got, "the held messages came back, the acked ones did not")
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, 5*time.Second, 10*time.Millisecond, "every message acked")
}
