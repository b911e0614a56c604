package chaos

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/cmd/idem/internal/payments"
)

// passJetStream counts the pipelined publishes that reach the broker.
type passJetStream struct {
	jetstream.JetStream
	sent []string
}

func (p *passJetStream) PublishMsgAsync(msg *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	p.sent = append(p.sent, msg.Header.Get(jetstream.MsgIDHeader))
	return nil, nil
}

func TestRefusingJetStream(t *testing.T) {
	t.Parallel()
	msg := func(id string) *nats.Msg {
		return &nats.Msg{Subject: "s", Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}
	}
	t.Run("a chosen message is refused once, then goes through", func(t *testing.T) {
		t.Parallel()
		pass := &passJetStream{}
		j := &refusingJetStream{JetStream: pass, seed: 1, rate: 1, stats: newStats(nil), refused: map[string]bool{}}
		f, err := j.PublishMsgAsync(msg("a/1"))
		require.NoError(t, err, "the refusal comes with the PubAck, as the broker's would")
		select {
		case err := <-f.Err():
			require.ErrorIs(t, err, errRefused)
		default:
			t.Fatal("the refused message's future has no error")
		}
		require.Empty(t, pass.sent)
		_, err = j.PublishMsgAsync(msg("a/1"))
		require.NoError(t, err)
		require.Equal(t, []string{"a/1"}, pass.sent)
	})
	t.Run("the choice is a function of the seed and the message id", func(t *testing.T) {
		t.Parallel()
		pass := &passJetStream{}
		j := &refusingJetStream{JetStream: pass, seed: 1, rate: 0.1, stats: newStats(nil), refused: map[string]bool{}}
		refused := 0
		for i := range 2000 {
			id := payments.EventID("r", i) + "/x"
			f, _ := j.PublishMsgAsync(msg(id))
			if f != nil {
				refused++
			}
			require.Equal(t, f != nil, injectTransient(1^sinkRefusalSalt, 0.1, id))
		}
		require.InDelta(t, 200, refused, 60)
	})
}
