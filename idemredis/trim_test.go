package idemredis_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestNakOfTrimmedEntryKeepsMessage: an entry trimmed from its stream (MAXLEN, XTRIM) while a
// worker holds it is still in the worker's hands. A Nak of it must bring the message back as the
// next attempt, with its content, not report success and lose it (the delayed copy used to be
// built from the stream's entry, which is gone, and an entry released in place was dropped from
// the pending list by the next claim).
func TestNakOfTrimmedEntryKeepsMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		delay time.Duration
		retry bool // nak once first, so the trimmed entry is on the group's retry stream
	}{
		{name: "now", delay: 0},
		{name: "delayed", delay: 100 * time.Millisecond},
		{name: "retry stream now", delay: 0, retry: true},
		{name: "retry stream delayed", delay: 100 * time.Millisecond, retry: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := ctxT(t, 20*time.Second)
			src := b.source(t, "s", "g", 5*time.Second)
			msg := idem.Message{EventID: "e", Type: "t", Payload: []byte(`{"n":1}`), Headers: map[string]string{"H": "v"}}
			require.NoError(t, b.sink.Publish(ctx, "s", msg))
			d := receiveOne(t, src, 5*time.Second)
			want := 2
			key := b.prefix + "s"
			if tc.retry {
				require.NoError(t, d.Nak(ctx, 10*time.Millisecond))
				d = receiveOne(t, src, 5*time.Second)
				require.Equal(t, 2, d.Message().Attempt)
				want = 3
				key = b.prefix + "s/retry/g"
			}
			// The stream is trimmed under the worker.
			require.NoError(t, b.rdb.XTrimMaxLen(ctx, key, 0).Err())
			require.Zero(t, b.rdb.XLen(ctx, key).Val())

			require.NoError(t, d.Nak(ctx, tc.delay))
			again := receiveOne(t, src, 5*time.Second)
			m := again.Message()
			require.Equal(t, "e", m.EventID)
			require.Equal(t, want, m.Attempt)
			require.Equal(t, msg.Payload, m.Payload)
			require.Equal(t, "t", m.Type)
			require.Equal(t, "v", m.Headers["H"])
			require.Equal(t, d.Message().PublishedAt, m.PublishedAt, "PublishedAt keeps the first publish")
			require.NoError(t, again.Ack(ctx))
			n, err := src.Backlog(ctx)
			require.NoError(t, err)
			require.Zero(t, n, "nothing left to settle")
		})
	}
}
