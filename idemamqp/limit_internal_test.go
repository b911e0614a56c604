package idemamqp

import "testing"

// RabbitMQ 4.0 gave quorum queues a delivery limit of 20 when none is declared: the Source must
// report it, or the consumer's check against its retry policy passes a broker that drops
// messages it still means to retry.
func TestImplicitDeliveryLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		version   any
		queueType string
		want      int
	}{
		{"3.10.8", QueueQuorum, 0},
		{"3.13.7", QueueQuorum, 0},
		{"4.0.0", QueueQuorum, QuorumDeliveryLimitDefault},
		{"4.1.2", QueueQuorum, QuorumDeliveryLimitDefault},
		{"10.0.0", QueueQuorum, QuorumDeliveryLimitDefault},
		{"4.1.2", QueueClassic, 0},
		{"", QueueQuorum, QuorumDeliveryLimitDefault},
		{nil, QueueQuorum, QuorumDeliveryLimitDefault},
		{"tanzu-rabbitmq", QueueQuorum, QuorumDeliveryLimitDefault},
	} {
		if got := implicitDeliveryLimit(tc.version, tc.queueType); got != tc.want {
			t.Errorf("implicitDeliveryLimit(%v, %s) = %d, want %d", tc.version, tc.queueType, got, tc.want)
		}
	}
}

func TestDeliveryLimitReportsTheBrokersOwn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		configured int
		implicit   int64
		want       int
	}{
		{"none anywhere", 0, 0, 0},
		{"the broker's default", 0, QuorumDeliveryLimitDefault, QuorumDeliveryLimitDefault},
		{"configured wins", 50, QuorumDeliveryLimitDefault, 50},
	} {
		s := &Source{cfg: SourceConfig{DeliveryLimit: tc.configured}}
		s.implicitLimit.Store(tc.implicit)
		if got := s.DeliveryLimit(); got != tc.want {
			t.Errorf("%s: DeliveryLimit() = %d, want %d", tc.name, got, tc.want)
		}
	}
}
