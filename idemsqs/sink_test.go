package idemsqs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqs"
)

// TestSinkSplitsBatches: messages whose sizes add up past what one SendMessageBatch carries
// (256 KiB on older queues, 1 MiB now; moto refuses a batch over 1 MiB) are sent in several
// batches, and every one arrives. Ten of these in one batch would be 1.2 MiB.
func TestSinkSplitsBatches(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	url := newQueue(t, c, nil)
	sink, err := idemsqs.NewSink(c, idemsqs.SinkConfig{})
	require.NoError(t, err)
	const n = 12
	msgs := make([]idem.Message, n)
	want := make([]string, n)
	for i := range msgs {
		want[i] = fmt.Sprintf("e-%02d", i)
		msgs[i] = idem.Message{EventID: want[i], Payload: []byte(strings.Repeat("x", 120<<10))}
	}
	require.NoError(t, sink.Publish(context.Background(), url, msgs...))

	src := openSource(t, c, url, 30*time.Second)
	var got []string
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for len(got) < n {
		ds, err := src.Receive(ctx, 10)
		require.NoError(t, err, "received %d of %d", len(got), n)
		for _, d := range ds {
			require.Len(t, d.Message().Payload, 120<<10)
			got = append(got, d.Message().EventID)
			require.NoError(t, d.Ack(context.Background()))
		}
	}
	require.ElementsMatch(t, want, got)
}

// TestSinkRefusesBeforeSending: a message Encode refuses fails the whole Publish before anything
// is sent, naming its position; a closed sink sends nothing.
func TestSinkRefusesBeforeSending(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	url := newQueue(t, c, nil)
	sink, err := idemsqs.NewSink(c, idemsqs.SinkConfig{})
	require.NoError(t, err)
	err = sink.Publish(context.Background(), url,
		idem.Message{EventID: "ok", Payload: []byte("p")},
		idem.Message{EventID: "bad", Payload: []byte("p"), Headers: map[string]string{"has space": "v"}})
	require.ErrorContains(t, err, "message 1")
	require.NoError(t, sink.Close())
	require.ErrorContains(t, sink.Publish(context.Background(), url, idem.Message{EventID: "late", Payload: []byte("p")}), "sink closed")

	src := openSource(t, c, url, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	ds, err := src.Receive(ctx, 10)
	require.ErrorIs(t, err, context.DeadlineExceeded, "nothing was sent, got %d deliveries", len(ds))
}
