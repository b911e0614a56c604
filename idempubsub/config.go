package idempubsub

import (
	"errors"
	"fmt"
	"time"
)

// Defaults and bounds of SourceConfig.
const (
	// LeaseDefault is the ack deadline a Source gives what it receives when SourceConfig.Lease
	// is zero.
	LeaseDefault = 30 * time.Second
	// LeaseMax is the longest ack deadline Pub/Sub accepts (600 s); it also bounds Nak's delay.
	LeaseMax = 600 * time.Second
	// MaxOutstandingDefault is SourceConfig.MaxOutstanding's default.
	MaxOutstandingDefault = 1000
	// PullWaitDefault is SourceConfig.PullWait's default.
	PullWaitDefault = 10 * time.Second
	// PublishTimeoutDefault bounds waiting for Pub/Sub's publish results when Publish's context
	// has no deadline, so a lost service fails the publish instead of hanging the relay.
	PublishTimeoutDefault = 60 * time.Second
)

// SourceConfig configures a Source.
type SourceConfig struct {
	// Subscription is the subscription to pull from: its id in the client's project, or its
	// full name (projects/<p>/subscriptions/<s>). It must exist.
	Subscription string
	// Lease is the ack deadline each delivery gets when received and at each Extend, up to
	// 600 s (Pub/Sub's bound); default LeaseDefault. Pub/Sub counts ack deadlines in whole
	// seconds, so a fraction is rounded up, and the Source reports the rounded lease.
	Lease time.Duration
	// MaxOutstanding is flow control: the most deliveries the source holds unsettled at once.
	// Receive pulls no more than the room left, and waits for a settle when there is none.
	// Default MaxOutstandingDefault.
	MaxOutstanding int
	// PullWait bounds one Pull call (Pub/Sub answers a Pull at once when messages are
	// available and otherwise after a while); default PullWaitDefault.
	PullWait time.Duration
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SourceConfig) WithDefaults() SourceConfig {
	if c.Lease == 0 {
		c.Lease = LeaseDefault
	}
	if c.MaxOutstanding == 0 {
		c.MaxOutstanding = MaxOutstandingDefault
	}
	if c.Lease > 0 && c.Lease <= LeaseMax {
		c.Lease = time.Duration(seconds(c.Lease)) * time.Second
	}
	if c.PullWait == 0 {
		c.PullWait = PullWaitDefault
	}
	return c
}

// validate refuses settings Pub/Sub cannot honour.
func (c SourceConfig) validate() error {
	switch {
	case c.Subscription == "":
		return errors.New("SourceConfig.Subscription is empty")
	case c.Lease <= 0 || c.Lease > LeaseMax:
		return fmt.Errorf("SourceConfig.Lease is %v; Pub/Sub ack deadlines are from 1s to %v", c.Lease, LeaseMax)
	case c.MaxOutstanding < 1:
		return fmt.Errorf("SourceConfig.MaxOutstanding is %d, want at least 1", c.MaxOutstanding)
	case c.PullWait <= 0:
		return fmt.Errorf("SourceConfig.PullWait is %v, want more than 0", c.PullWait)
	}
	return nil
}

// seconds is d in whole seconds for a ModifyAckDeadline call: rounded up, within [0, LeaseMax].
func seconds(d time.Duration) int32 {
	if d <= 0 {
		return 0
	}
	d = min(d, LeaseMax)
	return int32((d + time.Second - 1) / time.Second)
}
