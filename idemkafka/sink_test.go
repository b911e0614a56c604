package idemkafka_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
)

func TestNewSinkRefusesUnsafeProducers(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	cases := []struct {
		name string
		opts []kgo.Opt
		want string
	}{
		{"not idempotent", []kgo.Opt{kgo.DisableIdempotentWrite()}, "idempotent"},
		{"leader acks only", []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())}, "idempotent"},
		{"no acks", []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.NoAck())}, "idempotent"},
	}
	for _, tc := range cases {
		cl, err := kgo.NewClient(append(clientOptions(c), tc.opts...)...)
		require.NoError(t, err)
		_, err = idemkafka.NewSink(cl, idemkafka.SinkConfig{})
		cl.Close()
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	_, err := idemkafka.NewSink(nil, idemkafka.SinkConfig{})
	require.Error(t, err)
}

// TestSinkKeyOrder: records of one key land in one partition in publish order, with the key the
// Sink gives them, across calls and within a batch.
func TestSinkKeyOrder(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	topic := newTopic(t, c, 4)
	sink := newSink(t, c)
	var msgs []idem.Message
	for i := range 40 {
		msgs = append(msgs, idem.Message{EventID: fmt.Sprintf("e%02d", i), Tenant: "t", Payload: []byte{byte(i)},
			Headers: map[string]string{idemkafka.HeaderKey: fmt.Sprintf("order-%d", i%5)}})
	}
	require.NoError(t, sink.Publish(ctxT(t, 10*time.Second), topic, msgs[:20]...))
	require.NoError(t, sink.Publish(ctxT(t, 10*time.Second), topic, msgs[20:]...))

	cl, err := kgo.NewClient(append(clientOptions(c), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	require.NoError(t, err)
	defer cl.Close()
	partOf := map[string]int32{}
	seq := map[string][]string{}
	ctx := ctxT(t, 10*time.Second)
	for n := 0; n < len(msgs); {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err())
		fs.EachRecord(func(r *kgo.Record) {
			n++
			k := string(r.Key)
			if p, ok := partOf[k]; ok {
				require.Equal(t, p, r.Partition, "key %s in two partitions", k)
			}
			partOf[k] = r.Partition
			seq[k] = append(seq[k], idemkafka.DecodeRecord(r).Message.EventID)
		})
	}
	for k := range 5 {
		key := fmt.Sprintf("order-%d", k)
		var want []string
		for i := k; i < 40; i += 5 {
			want = append(want, fmt.Sprintf("e%02d", i))
		}
		require.Equal(t, want, seq[key], "order of key %s", key)
	}
}

// TestSinkCancelled: a publish whose context ends before Kafka answers reports every record it
// did not see acknowledged, naming each event.
func TestSinkCancelled(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	topic := newTopic(t, c, 1)
	sink := newSink(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := sink.Publish(ctx, topic, idem.Message{EventID: "e1"}, idem.Message{EventID: "e2"})
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "not sent")
	require.NoError(t, sink.Publish(context.Background(), topic))
}

// TestSinkStopsKeyAtFailure: when the cluster refuses a record, no record of the same key after
// it is stored (the key has no gap followed by a later record), the error names the refused one,
// and exactly the events it does not name were stored.
func TestSinkStopsKeyAtFailure(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	topic := newTopic(t, c, 1)
	sink := newSink(t, c)
	big := make([]byte, 2*testMaxMessageBytes)
	_, _ = rand.Read(big)
	key := func(k, id string, payload []byte) idem.Message {
		return idem.Message{EventID: id, Payload: payload, Headers: map[string]string{idemkafka.HeaderKey: k}}
	}
	ids := []string{"a1", "a2", "a3", "a4"}
	perr := sink.Publish(ctxT(t, 10*time.Second), topic,
		key("a", "a1", []byte("1")), key("a", "a2", big), key("a", "a3", []byte("3")), key("a", "a4", []byte("4")))
	require.Error(t, perr)
	named := map[string]bool{}
	for _, id := range ids {
		named[id] = strings.Contains(perr.Error(), "event "+id+" ")
	}
	require.True(t, named["a2"], "the refused event is not named: %v", perr)

	cl, err := kgo.NewClient(append(clientOptions(c), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, sink.Publish(ctxT(t, 10*time.Second), topic, key("a", "end", []byte("e"))))
	var got []string
	ctx := ctxT(t, 10*time.Second)
	for len(got) == 0 || got[len(got)-1] != "end" {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "stored so far: %v", got)
		fs.EachRecord(func(r *kgo.Record) { got = append(got, idemkafka.DecodeRecord(r).Message.EventID) })
	}
	var want []string
	for _, id := range ids {
		if named[id] {
			break // nothing of the key after a failure
		}
		want = append(want, id)
	}
	for _, id := range ids[len(want):] {
		require.True(t, named[id], "event %s follows a failed one of its key but was not reported failed", id)
	}
	require.Equal(t, append(want, "end"), got, "stored records of the key (error: %v)", perr)
}
