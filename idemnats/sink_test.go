package idemnats_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/retry"
)

// TestDedupIsScopedBySubjectAndContent: on one stream, the same event id published to several
// subjects is delivered once per subject (JetStream's duplicate window spans the whole stream,
// so a bare event id as Nats-Msg-Id delivered one of ten), an identical republish is dropped,
// and a reused id with other content is delivered for the consumer to dead-letter as key reuse.
// It fails when Nats-Msg-Id is the bare event id.
func TestDedupIsScopedBySubjectAndContent(t *testing.T) {
	t.Parallel()
	js := connect(t)
	stream, subject := testStream(t, js)
	base := strings.TrimSuffix(subject, ".events")
	sink := idemnats.NewSink(js)
	id := "evt-" + stream
	msg := idem.Message{EventID: id, Type: "order.created", Payload: []byte(`{"n":1}`)}

	subjects := make([]string, 10)
	for i := range subjects {
		subjects[i] = base + ".s" + string(rune('a'+i))
		require.NoError(t, sink.Publish(ctxT(t, 10*time.Second), subjects[i], msg))
	}
	// True republishes: alone and in a batch, with volatile fields changed.
	again := msg.Clone()
	again.Headers = map[string]string{"Trace-Id": "other"}
	again.OccurredAt = time.Now()
	require.NoError(t, sink.Publish(ctxT(t, 10*time.Second), subjects[0], again))
	require.NoError(t, sink.Publish(ctxT(t, 10*time.Second), subjects[1], again, msg))
	// Key reuse on the first subject.
	reused := msg.Clone()
	reused.Payload = []byte(`{"n":2}`)
	require.NoError(t, sink.Publish(ctxT(t, 10*time.Second), subjects[0], reused))

	src, err := idemnats.NewSource(ctxT(t, 10*time.Second), js, idemnats.SourceConfig{Stream: stream, Durable: "scoped"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	perSubject := make(map[string][]string)
	deadline := time.Now().Add(5 * time.Second)
	total := 0
	for time.Now().Before(deadline) {
		ds, err := src.Receive(ctxT(t, time.Until(deadline)), 100)
		if err != nil {
			break
		}
		for _, d := range ds {
			nd := d.(*idemnats.Delivery)
			require.Equal(t, id, d.Message().EventID)
			perSubject[nd.Msg().Subject()] = append(perSubject[nd.Msg().Subject()], string(d.Message().Payload))
			require.NoError(t, d.Ack(ctxT(t, 10*time.Second)))
			total++
		}
		if total >= len(subjects)+1 {
			// Wait a little longer for anything that should not be there.
			deadline = time.Now().Add(500 * time.Millisecond)
		}
	}
	for i, s := range subjects {
		want := []string{`{"n":1}`}
		if i == 0 {
			want = append(want, `{"n":2}`)
		}
		require.Equal(t, want, perSubject[s], "subject %s", s)
	}
	require.Equal(t, len(subjects)+1, total)
}

// TestSourceLimits: by default the durable consumer is created without a delivery limit (at the
// limit JetStream would drop a message idem can neither handle nor dead-letter), the Source
// reports its limit and the stream's redelivery window for the consumer's checks, and a bounded
// limit below the policy is refused before the server is asked.
func TestSourceLimits(t *testing.T) {
	t.Parallel()
	js := connect(t)
	stream, subject := testStream(t, js)
	ctx := ctxT(t, 10*time.Second)

	src, err := idemnats.NewSource(ctx, js, idemnats.SourceConfig{Stream: stream, Subject: subject, Durable: "unlimited"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	require.Zero(t, src.DeliveryLimit(), "unlimited")
	require.Equal(t, 10*time.Minute, src.RedeliveryWindow(), "the stream's MaxAge, above its Duplicates window")
	cons, err := js.Consumer(ctx, stream, "unlimited")
	require.NoError(t, err)
	require.Equal(t, -1, cons.CachedInfo().Config.MaxDeliver, "JetStream never gives up on its own")

	bounded, err := idemnats.NewSource(ctx, js, idemnats.SourceConfig{Stream: stream, Subject: subject, Durable: "bounded", MaxDeliver: 50})
	require.NoError(t, err)
	t.Cleanup(func() { _ = bounded.Close() })
	require.Equal(t, 50, bounded.DeliveryLimit())

	_, err = idemnats.NewSource(ctx, js, idemnats.SourceConfig{Stream: stream, Subject: subject, Durable: "too-low",
		MaxDeliver: 20, Retry: retry.Policy{MaxAttempts: 20}})
	require.ErrorContains(t, err, "MaxDeliver is 20, want -1 (unlimited) or at least 25")
	_, err = js.Consumer(ctx, stream, "too-low")
	require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "refused before the server was asked")
}

// TestPublishWithoutStreamSaysSo: a subject no stream captures is a configuration error, and
// the error says so (and how to fix it) instead of passing for a broker outage.
func TestPublishWithoutStreamSaysSo(t *testing.T) {
	t.Parallel()
	js := connect(t)
	_, subject := testStream(t, js)
	sink := idemnats.NewSink(js)
	orphan := "idemtest-nostream." + strings.ReplaceAll(t.Name(), "/", ".") + "." + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, n := range []int{1, 3} {
		msgs := make([]idem.Message, n)
		for i := range msgs {
			msgs[i] = idem.Message{EventID: fmt.Sprintf("e%d", i), Payload: []byte(`{}`)}
		}
		err := sink.Publish(ctxT(t, 10*time.Second), orphan, msgs...)
		require.ErrorIs(t, err, idemnats.ErrNoStream, "batch of %d", n)
		require.ErrorContains(t, err, "configuration error")
		require.ErrorContains(t, err, "nats stream add --subjects")
	}
	// A subject a stream captures publishes as before.
	require.NoError(t, sink.Publish(ctxT(t, 10*time.Second), subject, idem.Message{EventID: "ok", Payload: []byte(`{}`)}))
}
