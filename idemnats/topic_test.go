package idemnats

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// subjectMsg is a jetstream.Msg that knows only its subject.
type subjectMsg struct {
	jetstream.Msg
	subject string
}

func (m subjectMsg) Subject() string { return m.subject }

// TestDeliveryReportsTopic: a delivery reports the subject its message was published to, which
// the consumer stores with its dead letter so that a replay goes back there without --topic.
func TestDeliveryReportsTopic(t *testing.T) {
	t.Parallel()
	var d idem.Delivery = &Delivery{msg: subjectMsg{subject: "payments.captured.eu"}}
	tr, ok := d.(idem.TopicReporter)
	require.True(t, ok)
	require.Equal(t, "payments.captured.eu", tr.Topic())
}
